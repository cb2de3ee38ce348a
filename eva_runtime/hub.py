"""Whether a Hugging Face Hub model can be loaded at all, answered in seconds.

Offline (a cluster node without egress, a laptop on a plane), ``from_pretrained`` on a Hub id
that is not in the local cache retries each file it looks for before it gives up: about 50 s
for a tokenizer and a config, and the run's first stage pays it again. One cached-file lookup
and one TCP connection to the Hub's endpoint tell the same thing at once.
"""

from __future__ import annotations

import socket
from urllib.parse import urlparse

CONNECT_TIMEOUT_S = 3.0


def unreachable(model_id: str) -> str | None:
    """Why ``model_id`` cannot be loaded (not cached, and the Hub cannot be reached), or None
    when it is cached or the Hub answers (or in offline mode, where the libraries fail fast)."""
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE:
        return None
    if isinstance(try_to_load_from_cache(model_id, "config.json"), str):
        return None
    endpoint = urlparse(constants.ENDPOINT)
    host = endpoint.hostname or ""
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return (
            f"not in the local Hugging Face cache, and {host}:{port} cannot be reached ({reason})"
        )
    return None

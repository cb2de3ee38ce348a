"""Whether a Hugging Face Hub model can be loaded at all, answered in seconds; and which commit
of it the local Hub cache holds.

Offline (a cluster node without egress, a laptop on a plane), ``from_pretrained`` on a Hub id
that is not in the local cache retries each file it looks for before it gives up: about 50 s
for a tokenizer and a config, and the run's first stage pays it again; an endpoint that takes
the connection and never answers (``HF_ENDPOINT`` at a dead mirror) holds it for good. One
cached-file lookup and one HTTP request to the Hub's endpoint, through the same proxies the
libraries use, tell the same thing at once: any answer, even an error status, is a Hub that
answers (the libraries then say what is wrong); no answer in ``TIMEOUT_S`` is none.
"""

from __future__ import annotations

import os

import httpx

TIMEOUT_S = 3.0


def unreachable(model_id: str) -> str | None:
    """Why ``model_id`` cannot be loaded (not cached, and the Hub does not answer or offline
    mode forbids asking it), or None when it is cached or the Hub answers."""
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(model_id, "config.json"), str):
        return None
    if constants.HF_HUB_OFFLINE:  # the libraries would say it in a paragraph of their own
        return "not in the local Hugging Face cache, and HF_HUB_OFFLINE is set"
    endpoint = constants.ENDPOINT.rstrip("/")
    missing = "not in the local Hugging Face cache, and"
    try:
        httpx.get(f"{endpoint}/api/models/{model_id}", timeout=TIMEOUT_S)
    except httpx.TimeoutException:
        return f"{missing} {endpoint} did not answer in {TIMEOUT_S:.0f} s"
    except httpx.HTTPError as exc:
        return f"{missing} {endpoint} cannot be reached ({str(exc).strip() or type(exc).__name__})"
    return None


def cached_revision(model_id: str) -> str | None:
    """The commit of ``model_id``'s main branch that the local Hugging Face cache holds (the
    ``refs/main`` huggingface_hub writes beside the snapshot it downloads), read offline; None
    when the cache holds none."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(model_id, "config.json")
    except ValueError:  # an id the Hub would refuse: nothing of it is cached
        return None
    # The cache's layout: models--org--name/snapshots/<commit>/config.json
    return os.path.basename(os.path.dirname(found)) if isinstance(found, str) else None


def record_revision(model_id: str) -> str | None:
    """``cached_revision``, fetching the model's ``config.json`` first when the cache holds no
    commit and the Hub may be asked: a few kilobytes that record the commit every later stage
    loads (they would fetch it anyway), so a run's keys name it from its first launch on. None
    when it cannot be known (offline, or the Hub refuses: the stage that loads the model says
    why)."""
    from huggingface_hub import constants, hf_hub_download

    if (commit := cached_revision(model_id)) is not None or constants.HF_HUB_OFFLINE:
        return commit
    try:
        hf_hub_download(model_id, "config.json")
    except Exception:  # unreachable, gated, missing: loading it will say so in its own words
        return None
    return cached_revision(model_id)

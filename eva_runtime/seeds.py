"""Every seed eva derives, in one module: a change here changes what stages write.

* ``stage_seed``: a stage's own seed, from the run seed, its iteration and its artifact, so
  rerunning one stage reproduces it without replaying the others;
* ``content_seed``: an LLM request's seed, from the request's content, so a sample depends on
  neither its batch position nor retries; ``derive_seed`` is the same derivation over a prompt's
  index (vLLM seeds sample ``j`` of an ``n > 1`` request with ``seed + j``).

Pure: the standard library only. It lives in the runtime, the lowest layer, because the
runtime's LLM client seeds its requests with it and the runtime imports no layer above it
(tests/test_layers.py); ``eva_core`` imports nothing outside itself, so its own generators
(``np.random.default_rng([seed, ...])``, the buffer's ``_mix``) stay with its algorithms.
``tasks.versions`` fingerprints this module into every stage's and component's recorded code:
an edit here fails ``python -m tasks.versions`` until the versions it affects are bumped (or,
if it changes no value, the edit is recorded with ``--write``).
"""

from __future__ import annotations

import hashlib

# Request seeds keep 30 bits: vLLM adds the sample index j to them, and servers that parse an
# int32 accept anything below 2**31.
_REQUEST_BITS = 0x3FFFFFFF


def stage_seed(run_seed: int, iteration: int | None, artifact: str) -> int:
    """A per-stage seed (32 bits), so re-running one stage reproduces it without replaying
    the others."""
    digest = hashlib.sha256(f"{run_seed}/{iteration}/{artifact}".encode()).hexdigest()
    return int(digest[:8], 16)


def content_seed(seed: int, content: str) -> int:
    """A request seed (30 bits) from the message itself, so it depends on neither batch
    position nor retries."""
    digest = hashlib.blake2b(f"{seed}:{content}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _REQUEST_BITS


def derive_seed(seed: int, prompt_index: int) -> int:
    """A per-prompt request seed (30 bits) from the prompt's index: ``content_seed`` of the
    index's decimal text. vLLM seeds sample ``j`` of an ``n > 1`` request with ``seed + j``;
    30 bits leave room for that below 2**31."""
    return content_seed(seed, f"{prompt_index}")

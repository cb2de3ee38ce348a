"""What every adapter needs: a creator built from the plain options a framework's config can
hold (strings, numbers), the user's callables named by import path, and state files."""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from eva_core.creator import Creator
from eva_core.predicted import TiePosterior

# The Creator's keyword options a framework config may set, beside the ones handled below.
CREATOR_OPTIONS = (
    "size", "ratio_evol", "top_fraction", "n_new", "n_new_bootstrap", "metric", "seed",
    "max_chars", "inherit", "duplicates",
)  # fmt: skip


def load_object(spec: str) -> Any:
    """The object a ``module:attribute`` string names (the user's rewriter, for one)."""
    module, sep, attribute = spec.partition(":")
    if not sep or not module or not attribute:
        raise ValueError(f"expected 'module:attribute', got {spec!r}")
    return getattr(importlib.import_module(module), attribute)


def build_creator(
    seeds: Sequence[str] | Sequence[Mapping[str, Any]], options: Mapping[str, Any]
) -> Creator:
    """A creator over ``seeds`` from plain options: the ``CREATOR_OPTIONS``; ``rewriter``, a
    ``module:callable`` (absent or null: no evolution, the plain baseline); ``skip_tied``, true
    or a mapping of ``TiePosterior`` settings; ``state_path``, a saved state to resume from when
    the file exists; ``evolve_lag``, observations the rewriter may run behind (in a thread of
    its own, so a slow API rewriter overlaps with training). Unknown options are refused, so a
    misspelt key is not silently ignored."""
    known = {*CREATOR_OPTIONS, "rewriter", "skip_tied", "state_path", "evolve_lag"}
    if unknown := sorted(set(options) - known):
        raise ValueError(f"unknown eva creator option(s) {unknown}; known: {sorted(known)}")
    rewriter = load_object(options["rewriter"]) if options.get("rewriter") else None
    if rewriter is not None and not callable(rewriter):
        raise ValueError(f"rewriter {options['rewriter']!r} is not callable")
    ties = options.get("skip_tied")
    posterior = TiePosterior(**(ties if isinstance(ties, Mapping) else {})) if ties else None
    lag = int(options.get("evolve_lag") or 0)
    threads: dict[str, Any] = {"evolve_lag": lag, "executor": ThreadPoolExecutor(1)} if lag else {}
    path = options.get("state_path")
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        # The constructor's options that are not buffer settings (those are in the state).
        kept = {k: options[k] for k in ("max_chars", "inherit", "duplicates") if k in options}
        return Creator.from_state(seeds, state, rewriter=rewriter, **kept, **threads)
    kwargs = {k: options[k] for k in CREATOR_OPTIONS if k in options}
    return Creator(seeds, rewriter=rewriter, skip_tied=posterior, **threads, **kwargs)


def save_state(creator: Creator, path: str) -> None:
    """Write ``creator.state()`` to ``path`` atomically (a crash leaves the old file whole)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(creator.state(), f)
    os.replace(tmp, path)

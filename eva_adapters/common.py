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
from eva_core.creator_checks import OptionError, is_int
from eva_core.predicted import TiePosterior

# The Creator's keyword options a framework config may set, beside the ones handled below.
CREATOR_OPTIONS = (
    "size", "ratio_evol", "top_fraction", "n_new", "n_new_bootstrap", "metric", "seed",
    "max_chars", "inherit", "duplicates",
)  # fmt: skip


def load_object(spec: str, key: str = "rewriter") -> Any:
    """The object a ``module:attribute`` string names (the user's rewriter, for one); a
    ``ValueError`` naming ``key`` when it cannot be imported."""
    module, sep, attribute = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not sep or not module or not attribute:
        raise OptionError(key, "must be 'module:attribute'", spec)
    try:
        loaded = importlib.import_module(module)
    except ImportError as exc:
        raise OptionError(key, f"cannot be imported ({exc})", spec) from None
    if not hasattr(loaded, attribute):
        raise OptionError(key, f"names nothing: {module} has no {attribute!r}", spec)
    return getattr(loaded, attribute)


def build_creator(
    seeds: Sequence[str] | Sequence[Mapping[str, Any]],
    options: Mapping[str, Any],
    key: str = "eva",
) -> Creator:
    """A creator over ``seeds`` from plain options: the ``CREATOR_OPTIONS``; ``rewriter``, a
    ``module:callable`` (absent or null: no evolution, the plain baseline); ``skip_tied``, true
    or a mapping of ``TiePosterior`` settings; ``state_path``, a saved state to resume from when
    the file exists; ``evolve_lag``, observations the rewriter may run behind (in a thread of
    its own, so a slow API rewriter overlaps with training). Every option is checked before
    anything is built; an error names it under ``key``, the framework config's key that holds
    the options (``data.eva.ratio_evol must be a number in [0, 1], got 2.0``), and a misspelt
    one is refused."""
    try:
        return _build(seeds, options)
    except OptionError as exc:
        raise exc.under(key) from None


def _build(
    seeds: Sequence[str] | Sequence[Mapping[str, Any]], options: Mapping[str, Any]
) -> Creator:
    known = {*CREATOR_OPTIONS, "rewriter", "skip_tied", "state_path", "evolve_lag"}
    if unknown := sorted(set(options) - known):
        raise OptionError(
            unknown[0],
            f"is not an eva creator option (known: {', '.join(sorted(known))})",
            options[unknown[0]],
        )
    rewriter = load_object(options["rewriter"]) if options.get("rewriter") else None
    if rewriter is not None and not callable(rewriter):
        raise OptionError(
            "rewriter", "must name a callable rewriter(parents, n, seed)", options["rewriter"]
        )
    ties = options.get("skip_tied")
    try:
        posterior = TiePosterior(**(ties if isinstance(ties, Mapping) else {})) if ties else None
    except (TypeError, ValueError) as exc:
        raise OptionError(
            "skip_tied", f"must be true or TiePosterior settings ({exc})", ties
        ) from None
    lag = options.get("evolve_lag") or 0
    if not is_int(lag) or lag < 0:
        raise OptionError("evolve_lag", "must be an integer >= 0", lag)
    threads: dict[str, Any] = {"evolve_lag": lag, "executor": ThreadPoolExecutor(1)} if lag else {}
    path = options.get("state_path")
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        # The constructor's options that are not buffer settings (those are in the state).
        kept = {k: options[k] for k in ("max_chars", "inherit", "duplicates") if k in options}
        try:
            return Creator.from_state(seeds, state, rewriter=rewriter, **kept, **threads)
        except OptionError:
            raise
        except ValueError as exc:  # the state itself: name the file it came from
            raise OptionError(
                "state_path", f"holds a state that cannot resume ({exc})", path
            ) from None
    kwargs = {k: options[k] for k in CREATOR_OPTIONS if k in options}
    return Creator(seeds, rewriter=rewriter, skip_tied=posterior, **threads, **kwargs)


def save_state(creator: Creator, path: str) -> None:
    """Write ``creator.state()`` to ``path`` atomically (a crash leaves the old file whole)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(creator.state(), f)
    os.replace(tmp, path)

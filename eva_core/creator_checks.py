"""What eva's creator (``eva_core.creator``) refuses, checked before it changes anything: its
options when it is built, each group a trainer hands to ``observe``, and a saved state when it is
loaded. A trainer's misuse is then one error naming the option, the group or the state's field,
and the creator stays as it was.

``OptionError`` names the option by the creator's own keyword; a framework adapter, which knows
the key its user wrote, re-raises it under that key (``error.under("data.eva")``:
``data.eva.ratio_evol must be a number in [0, 1], got 2.0``).
"""

from __future__ import annotations

import numbers
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from eva_core.informativeness import METRICS

DUPLICATES = ("refuse", "drop")


class OptionError(ValueError):
    """A creator option outside what it allows: ``option`` is the creator's keyword."""

    def __init__(self, option: str, requirement: str, value: Any):
        self.option, self.requirement, self.value = option, requirement, value
        super().__init__(f"{option} {requirement}, got {short(value)}")

    def under(self, prefix: str) -> OptionError:
        """The same error naming the key a framework's config holds the option under."""
        return OptionError(f"{prefix}.{self.option}", self.requirement, self.value)


def short(value: Any) -> str:
    """A value as an error line quotes it (a long one cut: a whole state does not fit a line)."""
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _int(option: str, value: Any, low: int) -> None:
    if not is_int(value) or value < low:
        raise OptionError(option, f"must be an integer >= {low}", value)


def _fraction(option: str, value: Any, low_open: bool) -> None:
    bounds = "(0, 1]" if low_open else "[0, 1]"
    if not is_real(value) or not (0 < value <= 1 if low_open else 0 <= value <= 1):
        raise OptionError(option, f"must be a number in {bounds}", value)


def check_settings(settings: Mapping[str, Any]) -> None:
    """The buffer's settings (``eva_core.buffer.SETTINGS``), as the creator takes them."""
    _int("size", settings["size"], 1)
    _fraction("ratio_evol", settings["ratio_evol"], low_open=False)
    _fraction("top_fraction", settings["top_fraction"], low_open=True)
    _int("n_new", settings["n_new"], 0)
    _int("n_new_bootstrap", settings["n_new_bootstrap"], 0)
    if settings["metric"] not in METRICS:
        raise OptionError("metric", f"must be one of {', '.join(METRICS)}", settings["metric"])


def check_options(
    settings: Mapping[str, Any],
    *,
    seed: Any,
    evolve_lag: Any,
    executor: Any,
    rewriter: Any,
    max_chars: Any,
    inherit: Any,
    duplicates: Any,
) -> None:
    """Every option of ``Creator(...)``; the first one out of range raises ``OptionError``."""
    check_settings(settings)
    _int("seed", seed, 0)  # numpy's seed sequences take no negative entropy
    _int("evolve_lag", evolve_lag, 0)
    if evolve_lag and executor is None:
        raise OptionError("evolve_lag", "> 0 needs an executor to run the rewriter in", evolve_lag)
    if rewriter is not None and not callable(rewriter):
        raise OptionError("rewriter", "must be a callable rewriter(parents, n, seed)", rewriter)
    if max_chars is not None:
        _int("max_chars", max_chars, 1)
    if isinstance(inherit, str | bytes) or not all(isinstance(c, str) for c in inherit):
        raise OptionError("inherit", "must be a list of column names", inherit)
    if duplicates not in DUPLICATES:
        raise OptionError("duplicates", f"must be one of {', '.join(DUPLICATES)}", duplicates)


def checked_groups(groups: Sequence[Any], drawn: Callable[[str], int]) -> tuple[list[str], Any]:
    """The prompt ids of ``(prompt_id, rewards)`` groups and their rewards as a NaN-padded
    (groups, most responses) matrix, each group checked: a prompt drawn and not yet observed (as
    often as it is out: ``drawn(pid)``), and one or more rewards, each a number (NaN: an
    unscored response). The first bad group raises ``ValueError`` naming it."""
    ids: list[str] = []
    rows: list[list[float]] = []
    used: Counter[str] = Counter()
    for i, group in enumerate(groups):
        if isinstance(group, str | bytes) or not isinstance(group, Sequence) or len(group) != 2:
            raise ValueError(f"group {i}: expected (prompt_id, rewards), got {short(group)}")
        pid, rewards = group
        if not isinstance(pid, str):
            raise ValueError(f"group {i}: the prompt id must be a string, got {short(pid)}")
        used[pid] += 1
        if used[pid] > drawn(pid):
            raise ValueError(
                f"group {i}: prompt {pid!r} was not drawn (or was already observed)"
                + (" as often as this call names it" if used[pid] > 1 else "")
            )
        if isinstance(rewards, str | bytes) or not isinstance(rewards, Sequence | np.ndarray):
            raise ValueError(f"group {i} ({pid}): rewards must be a list, got {short(rewards)}")
        values = list(rewards)
        if not values:
            raise ValueError(f"group {i} ({pid}): no rewards (a group has one per response)")
        if bad := [v for v in values if not is_real(v)]:
            raise ValueError(
                f"group {i} ({pid}): rewards must be numbers (NaN for an unscored response), "
                f"got {short(bad[0])}"
            )
        ids.append(pid)
        rows.append([float(v) for v in values])
    matrix = np.full((len(rows), max((len(r) for r in rows), default=0)), np.nan)
    for i, row in enumerate(rows):
        matrix[i, : len(row)] = row
    return ids, matrix


def checked_rewrites(
    rewriter: Any, out: Any, parents: Sequence[Mapping[str, Any]], n: int
) -> list[list[tuple[Any, ...]]]:
    """A rewriter's answer as ``(text, method)`` tuples per parent, checked: one list per
    parent, at most ``n`` rewrites each, each a text, ``None`` (a failed rewrite, counted as
    empty), a ``(text, method)`` pair of texts, or ``(text, method, columns)`` with a mapping
    of the instruction columns the rewrite carries (``eva_core.evolution`` checks their cells).
    Anything else raises ``ValueError`` naming the rewriter."""
    name = rewriter_name(rewriter)
    listed = isinstance(out, Sequence) and not isinstance(out, str | bytes)
    if not listed or len(out) != len(parents):
        size = len(out) if listed else type(out).__name__
        raise ValueError(
            f"rewriter {name} returned {size} for {len(parents)} parents; expected one list "
            "of rewrites per parent"
        )
    checked: list[list[tuple[Any, ...]]] = []
    for i, rewrites in enumerate(out):
        where = f"rewriter {name}, parent {i} ({parents[i].get('prompt_id')})"
        if isinstance(rewrites, str | bytes) or not isinstance(rewrites, Sequence):
            raise ValueError(f"{where}: expected a list of rewrites, got {short(rewrites)}")
        if len(rewrites) > n:
            raise ValueError(f"{where}: {len(rewrites)} rewrites, at most n={n} were asked for")
        pairs: list[tuple[Any, ...]] = []
        for rewrite in rewrites:
            if rewrite is None or isinstance(rewrite, str):
                pairs.append((rewrite or "", "rewrite"))  # None: failed, dropped as empty
            elif (
                isinstance(rewrite, Sequence)
                and len(rewrite) in (2, 3)
                and all(isinstance(x, str) for x in rewrite[:2])
                and (len(rewrite) == 2 or isinstance(rewrite[2], Mapping))
            ):
                pairs.append(tuple(rewrite))
            else:
                raise ValueError(
                    f"{where}: a rewrite must be a text, a (text, method) pair of texts or "
                    f"(text, method, instruction columns), got {short(rewrite)}"
                )
        checked.append(pairs)
    return checked


def rewriter_name(rewriter: Any) -> str:
    """``module:qualname`` of a rewriter (its repr when it has none)."""
    module = getattr(rewriter, "__module__", None)
    qualname = getattr(rewriter, "__qualname__", None) or getattr(
        type(rewriter), "__qualname__", None
    )
    return f"{module}:{qualname}" if module and qualname else repr(rewriter)

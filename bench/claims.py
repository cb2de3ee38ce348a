"""The rule every claim is judged by, written before any arm ran (docs/benchmarks.md, section 1).

A claim compares two arms (or two iterations of one) seed by seed: the paired difference per
seed, its mean and standard deviation over seeds. By the ``sd`` rule it *holds* when the mean
has the expected sign and exceeds 2 standard deviations (the preconditions: a floor and 3 sd);
otherwise the margin says by how much it missed (the mean minus 2 sd, in the expected
direction). Issue 32's studies used two more: ``t`` (the paired t beyond 2.776, two-sided 95%
at df 4) and ``no-worse`` (the mean no lower than one sd of the control over seeds).
"""

from __future__ import annotations

import math

import numpy as np


def judge(d: np.ndarray, sign: int = 1, sds: float = 2.0, floor: float = 0.0) -> tuple[str, str]:
    """(verdict, margin) of a paired difference whose expected sign is ``sign``."""
    if d.size == 0:
        return "not run", "-"
    mean = float(d.mean()) * sign
    if d.size < 2:
        return "one seed: not judged", f"{mean:+.3f}"
    margin = min(mean - sds * float(d.std(ddof=1)), mean - floor)
    return ("**held**" if margin > 0 else "not held"), f"{margin:+.3f}"


def t_stat(d: np.ndarray) -> float | None:
    """The paired t of per-seed differences (None when they do not vary or one seed ran)."""
    sd = float(d.std(ddof=1)) if d.size > 1 else 0.0
    return round(float(d.mean()) / (sd / math.sqrt(d.size)), 2) if sd > 0 else None


def by_t(d: np.ndarray, sign: int, critical: float) -> tuple[str, str]:
    """Held when the paired t has the expected sign beyond ``critical``; the opposite sign
    beyond it is said as such."""
    t = t_stat(d)
    if d.size < 2 or t is None:
        return ("not run", "-") if d.size == 0 else ("not judged", "-")
    if t * sign > critical:
        return "**held**", f"t {t:+.2f}"
    return ("opposite" if t * sign < -critical else "not held"), f"t {t:+.2f}"


def no_worse(d: np.ndarray, control: np.ndarray, sign: int) -> tuple[str, str]:
    """Held when the mean difference is no worse than one sd of the control over seeds."""
    if d.size < 2 or control.size < 2:
        return ("not run", "-") if d.size == 0 else ("not judged", "-")
    margin = float(d.mean()) * sign + float(control.std(ddof=1))
    return ("**held**" if margin >= 0 else "not held"), f"{margin:+.3f}"

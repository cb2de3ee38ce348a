"""Reward functions for ``CallableReward`` tests, importable as ``tests.support.rewards:...``."""

from __future__ import annotations

NOT_CALLABLE = 3


def _sum(prompt: str) -> int:
    """The value of ``"12+34="``; raises ValueError for anything else."""
    if not prompt.endswith("="):
        raise ValueError(f"not an arithmetic prompt: {prompt!r}")
    return sum(int(x) for x in prompt[:-1].split("+"))


def exact_match(prompt: str, response: str, *, partial: float = 0.0) -> float:
    """1 for the exact sum (ordinary digit order), ``partial`` for a near miss (off by one)."""
    answer = _sum(prompt)
    got = int(response.strip())  # a non-number raises: the backend scores it NaN
    if got == answer:
        return 1.0
    return partial if abs(got - answer) == 1 else 0.0


def exact_match_batch(
    prompts: list[str], responses: list[list[str]], *, partial: float = 0.0
) -> list[list[float]]:
    return [
        [exact_match(p, r, partial=partial) for r in rs]
        for p, rs in zip(prompts, responses, strict=True)
    ]


def wrong_shape(prompts: list[str], responses: list[list[str]]) -> list[list[float]]:
    return [[1.0] for _ in prompts]


def unscorable(prompt: str, response: str) -> float | None:
    """None means "cannot score", not a failure."""
    return None if response == "?" else 1.0


def huge(prompt: str, response: str) -> float:
    """A reward far past what float64 sums and gaps survive (a user's scale bug)."""
    return 1e308 if response.startswith("1") else -1e308

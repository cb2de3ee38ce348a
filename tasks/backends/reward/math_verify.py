"""Math answers checked with Hugging Face's math-verify (the ``math`` extra), for RLVR.

Three entry points:

* ``verify(response, answer)``: 1.0 when the response's final answer equals the reference
  ``answer`` mathematically (``\\boxed{1/2}`` against ``0.5``, ``x = 3`` against ``3``), else 0.0.
  The response's answer is its last ``\\boxed{...}`` when it has one (math-verify alone would
  read every box of a response as a set), else what math-verify extracts from the whole text
  (what follows "the answer is" or "final answer:", else the last number). It never raises:
  text math-verify cannot read, or one whose parsing runs past ``TIMEOUT_S``, scores 0.0.
* ``extract(response)``: the same final answer as one canonical string (floats as exact
  rationals, then LaTeX), so that ``0.5``, ``1/2`` and ``\\boxed{\\frac{1}{2}}`` cast the same
  majority vote; "" when there is none.
* ``grpo_reward``: TRL's reward-function shape (``prompts``, ``completions`` and every dataset
  column as keyword lists, one entry per completion). Rows with an ``answer`` are scored
  against it; rows without one are labelled by the majority vote of their own prompt's
  completions in the batch (``eva_core.answers.answer_rewards``, TTRL's labelling) and scored
  against that label, or get None when the vote is too weak: TRL counts a completion every
  reward function returns None for as unscorable (NaN reward, advantage 0).

The vote sees the completions one call receives. GRPO calls the reward function once per
generation batch with every prompt's ``num_generations`` completions, so on one process the
vote sees each whole group; with several processes TRL scores each process's slice, and a
group split across processes is voted on in parts.

math-verify's timeouts use ``signal.alarm``, which works only in the main thread; elsewhere
(an async reward, a worker thread) parsing runs without a time limit rather than failing.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from eva_core.answers import answer_rewards
from eva_runtime.errors import EvaError

TIMEOUT_S = 5  # seconds per parse and per comparison, math-verify's own default
VOTE_THRESHOLD = 0.5  # share of a prompt's completions its majority answer needs to label it


def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError as exc:
        raise EvaError(
            "the math verifier needs the math-verify package",
            field="math_verify",
            hint="pip install -e '.[math]' (math-verify==0.9.0)",
        ) from exc
    return math_verify


def _timeout() -> int | None:
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def last_boxed(text: str) -> str | None:
    """The last ``\\boxed{...}`` of ``text`` with its braces balanced, or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for end in range(start + len("\\boxed"), len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return text[start : end + 1]
    return None  # an unclosed box: no answer there


def _parse(text: str) -> list[Any]:
    """math-verify's parse of ``text`` ([] when it finds nothing, fails or times out)."""
    mv = _math_verify()
    try:
        return list(mv.parse(text, parsing_timeout=_timeout()))
    except (Exception, mv.errors.TimeoutException):
        return []


def _prediction(response: str) -> list[Any]:
    box = last_boxed(response)
    return _parse(box if box is not None else response)


def _gold(answer: str) -> list[Any]:
    """The reference read as a whole, as if boxed: ``\\sqrt{2}`` or ``x^2+1`` unboxed find
    nothing in math-verify's search for an answer in running text."""
    box = last_boxed(answer)
    return _parse(box) if box is not None else _parse(f"\\boxed{{{answer}}}") or _parse(answer)


def verify(response: str, answer: str) -> float:
    """1.0 when ``response``'s final answer equals ``answer`` (the reference), else 0.0."""
    mv = _math_verify()
    if not isinstance(response, str) or answer is None:
        return 0.0
    gold = _gold(str(answer))
    pred = _prediction(response)
    if not gold or not pred:
        return 0.0
    try:
        return 1.0 if mv.verify(gold, pred, timeout_seconds=_timeout()) else 0.0
    except (Exception, mv.errors.TimeoutException):
        return 0.0


def extract(response: str) -> str:
    """``response``'s final answer as a canonical string ("" when there is none)."""
    if not isinstance(response, str):
        return ""
    pred = _prediction(response)
    if not pred:
        return ""
    import sympy

    expr = pred[0]
    if not isinstance(expr, sympy.Basic):
        return str(expr).strip()
    try:
        # 0.5 and 1/2 are one answer: floats become exact rationals of their decimal text.
        expr = expr.xreplace(
            {f: sympy.nsimplify(f, rational=True) for f in expr.atoms(sympy.Float)}
        )
        return str(sympy.latex(_evaluated(expr)))
    except Exception:
        return str(pred[-1]).strip()


def _evaluated(expr: Any) -> Any:
    """``expr`` rebuilt bottom-up with sympy's evaluation on: math-verify keeps ``1/3`` as the
    unevaluated ``1 * 3**-1``, which would vote apart from ``\\frac{1}{3}``."""
    if not expr.args:
        return expr
    try:
        return expr.func(*(_evaluated(a) for a in expr.args))
    except Exception:
        return expr


def _text(item: Any) -> str:
    """A completion (or prompt) as text: plain text, or the last message of a conversation."""
    if isinstance(item, str):
        return item
    if isinstance(item, list) and item and isinstance(item[-1], dict):
        return str(item[-1].get("content", ""))
    return ""


def _answer(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def grpo_reward(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    answer: Sequence[Any],
    vote_threshold: float = VOTE_THRESHOLD,
    **kwargs: Any,
) -> list[float | None]:
    """One reward per completion: 1.0/0.0 against the row's answer, or against its prompt's
    majority answer when the row has none; None where that vote stays below
    ``vote_threshold`` (see the module doc)."""
    if not len(prompts) == len(completions) == len(answer):
        raise ValueError(
            f"{len(prompts)} prompts, {len(completions)} completions, {len(answer)} answers"
        )
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(p if isinstance(p, str) else repr(p), []).append(i)
    rows = list(groups.values())
    scored = answer_rewards(
        [[_text(completions[i]) for i in idx] for idx in rows],
        [_answer(answer[idx[0]]) for idx in rows],
        verify,
        vote_threshold,
        normalize=extract,
    )
    out: list[float | None] = [None] * len(completions)
    for idx, rewards in zip(rows, scored.rewards, strict=True):
        for i, r in zip(idx, rewards, strict=True):
            out[i] = None if r != r else float(r)  # NaN: no label, TRL's None
    return out

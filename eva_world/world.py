"""A small verifiable world standing in for the policy's task, the reward model and the rewriter.

eva's creator step needs three LLM-sized things: prompts a policy can answer, a reward model
that scores the answers, and a rewriter LLM that evolves prompts (EvolInstruct). None of them
can run on a laptop CPU, so this module replaces all three with exact, pure-Python code over a
task family that a ~0.1M-parameter character-level GPT-2 can partly learn in minutes.

Prompts and answers use only the characters in ``ALPHABET``:

* ``add``: ``"12+345+6="``: 2-4 operands of 1-4 digits (no leading zeros except ``"0"``).
  The answer is the sum with its digits written least-significant first: ``"12+34="`` ->
  ``"64"`` (46 reversed), ``"95+7="`` -> ``"201"``. Reversed digits let a left-to-right model
  emit each digit after the digits that decide its carry, the classic trick that makes
  addition learnable by tiny transformers.
* ``sub``: ``"53-17="``: exactly 2 operands, the first >= the second, so the difference is never
  negative; reversed digits too: ``"50-48="`` -> ``"2"``, ``"10-10="`` -> ``"0"``.
* ``rev``: ``"r:abcd="``: a string of 2-8 letters from ``a``-``j``; the answer is the string
  reversed (``"r:abc="`` -> ``"cba"``).

``difficulty(prompt)`` measures size: for add/sub it is the total number of operand digits plus
2 for every operand beyond the second; for rev it is the string length. ``constraint_count``
measures the hard spots that size misses: carry columns (add), borrow columns (sub) or repeated
letters (rev; a repeat makes "find this letter in the input" ambiguous, so reversal cannot be
done by matching content and must track positions).

``reward(prompt, response)`` is dense: the fraction of positions where the stripped response
matches the reference answer, over the longer of the two lengths (exact match 1.0, empty 0.0,
NaN for a prompt outside the world). A dense score is what makes eva's informativeness
(max - min reward over a prompt's samples) spread out instead of collapsing to 0/1.

Evolution mirrors EvolInstruct and transforms the parent rather than drawing a fresh problem:

* in-depth ``deepen_digits``: insert one digit into an operand (one letter into a rev string);
  difficulty +1.
* in-depth ``add_step``: add one more operand (add only); difficulty +3 or more.
* in-depth ``add_constraint``: change one digit (letter) so the prompt gains a carry/borrow
  column (a repeated letter); size and difficulty stay, ``constraint_count`` rises.
* in-breadth ``breadth_category``: the same digits (letters) posed as another task: add <-> sub
  (operands ordered so the result is non-negative), add/sub -> rev (digit d -> d-th letter),
  rev -> add/sub (letters -> digits, split into two operands).

Three distributions mirror the paper's setup, where the seed prompts (UltraFeedback) are
narrower than the target set (Arena-Hard): ``SFT_DISTRIBUTION`` (theta_0's demonstrations:
every category, 2 operands of up to 3 digits, strings of 2-6 letters), ``SEED_DISTRIBUTION``
(the easy part: operands of up to 2 digits, strings of 2-4 letters, ~26k prompts) and
``HELDOUT_DISTRIBUTION`` (the whole demonstrated range again, ~2.6M prompts, most of them
harder than any seed prompt). Evolution is what carries training from the seed range toward the
held-out range; ``add_step`` goes beyond both (three and four operands).

theta_0 imitates demonstrators of mixed care (``sft_examples(careless=...)``): a careless one
drops carries and borrows and copies a string instead of reversing it. With more careless than
careful demonstrations, theta_0's most likely answer is often the careless one while the correct
one is among its samples, which is what preference optimization with a verifier learns from
(docs/benchmarks.md explains the design and what was measured before it was chosen).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

DIGITS = "0123456789"
LETTERS = "abcdefghij"  # ten letters, so breadth_category can map digits <-> letters one-to-one
ALPHABET = DIGITS + LETTERS + "r+-:="
CATEGORIES = ("add", "sub", "rev")
EVOLVE_METHODS = ("deepen_digits", "add_step", "add_constraint", "breadth_category")
# Not an evolution the rewriter draws by default: one character replaced at random, neither
# harder nor broader on purpose (the benchmark's random-evolution control).
PERTURB = "perturb"
ALL_METHODS = (*EVOLVE_METHODS, PERTURB)

# Caps keep every prompt inside a small model's context and keep evolution from running away.
MIN_OPERANDS, MAX_OPERANDS = 2, 4
MAX_DIGITS = 4
MIN_REV_LEN, MAX_REV_LEN = 2, 8
MAX_PROMPT_LEN = MAX_OPERANDS * (MAX_DIGITS + 1)  # "9999+9999+9999+9999="
MAX_ANSWER_LEN = MAX_REV_LEN  # a rev answer (8) is longer than any sum (4 * 9999: 5 digits)


@dataclass(frozen=True)
class Problem:
    """A parsed prompt; for rev, ``operands`` holds the single letter string."""

    category: str
    operands: tuple[str, ...]


def _is_number(s: str) -> bool:
    return 1 <= len(s) <= MAX_DIGITS and all(c in DIGITS for c in s) and (s == "0" or s[0] != "0")


def _valid(p: Problem) -> bool:
    ops = p.operands
    if p.category == "rev":
        return (
            len(ops) == 1
            and MIN_REV_LEN <= len(ops[0]) <= MAX_REV_LEN
            and set(ops[0]) <= set(LETTERS)
        )
    if p.category not in ("add", "sub") or not all(_is_number(o) for o in ops):
        return False
    if p.category == "add":
        return MIN_OPERANDS <= len(ops) <= MAX_OPERANDS
    return len(ops) == 2 and int(ops[0]) >= int(ops[1])


def render(problem: Problem) -> str:
    if not _valid(problem):
        raise ValueError(f"not a world problem: {problem!r}")
    if problem.category == "rev":
        return f"r:{problem.operands[0]}="
    return ("+" if problem.category == "add" else "-").join(problem.operands) + "="


def parse(prompt: str) -> Problem | None:
    """The Problem behind a prompt, or None when it is not a world prompt within the caps."""
    if not prompt.endswith("="):
        return None
    body = prompt[:-1]
    if body.startswith("r:"):
        p = Problem("rev", (body[2:],))
    elif "-" in body:
        p = Problem("sub", tuple(body.split("-")))
    else:
        p = Problem("add", tuple(body.split("+")))
    return p if _valid(p) else None


def _parse_or_raise(prompt: str) -> Problem:
    p = parse(prompt)
    if p is None:
        raise ValueError(f"not a world prompt: {prompt!r}")
    return p


def category_of(prompt: str) -> str | None:
    p = parse(prompt)
    return None if p is None else p.category


def _answer(p: Problem) -> str:
    if p.category == "rev":
        return p.operands[0][::-1]
    values = [int(o) for o in p.operands]
    result = sum(values) if p.category == "add" else values[0] - values[1]
    return str(result)[::-1]


def solve(prompt: str) -> str:
    """The reference answer; raises ValueError for a prompt outside the world."""
    return _answer(_parse_or_raise(prompt))


def _difficulty(p: Problem) -> int:
    if p.category == "rev":
        return len(p.operands[0])
    return sum(len(o) for o in p.operands) + 2 * (len(p.operands) - 2)


def difficulty(prompt: str) -> int:
    """Digits + 2 per operand beyond the second (add/sub), or string length (rev)."""
    return _difficulty(_parse_or_raise(prompt))


def _constraints(p: Problem) -> int:
    ops = p.operands
    if p.category == "rev":
        return len(ops[0]) - len(set(ops[0]))
    count = carry = 0
    for col in range(max(len(o) for o in ops)):
        digits = [int(o[-1 - col]) if col < len(o) else 0 for o in ops]
        if p.category == "add":
            carry = (sum(digits) + carry) // 10
        else:
            carry = int(digits[0] - carry - digits[1] < 0)  # the borrow out of this column
        count += carry > 0
    return count


def constraint_count(prompt: str) -> int:
    """Carry columns (add), borrow columns (sub) or repeated letters (rev)."""
    return _constraints(_parse_or_raise(prompt))


def reward(prompt: str, response: str) -> float:
    """Position-wise match with the reference, over the longer length; NaN if unscorable."""
    p = parse(prompt)
    return float("nan") if p is None else match(response, _answer(p))


def match(response: str, answer: str) -> float:
    """Position-wise match of a stripped response with a given answer, over the longer of the
    two lengths (an empty response: 0.0)."""
    got = response.strip()
    if not got:
        return 0.0
    return sum(a == b for a, b in zip(got, answer, strict=False)) / max(len(got), len(answer))


# --- evolution -------------------------------------------------------------------------------


def _edits(p: Problem, insert: bool) -> list[Problem]:
    """Every valid problem one inserted (or substituted) character away from p, deduplicated."""
    chars = LETTERS if p.category == "rev" else DIGITS
    out: dict[Problem, None] = {}
    for i, op in enumerate(p.operands):
        for pos, ch in itertools.product(range(len(op) + insert), chars):
            new = op[:pos] + ch + op[pos + (not insert) :]
            child = Problem(p.category, (*p.operands[:i], new, *p.operands[i + 1 :]))
            if new != op and _valid(child):
                out[child] = None
    return list(out)


def _split(cat: str, digits: str) -> list[Problem]:
    """digits cut into two operands; sub orders them so the difference is non-negative."""
    cuts = [(digits[:k], digits[k:]) for k in range(1, len(digits))]
    if cat == "sub":
        cuts = [(a, b) if int(a) >= int(b) else (b, a) for a, b in cuts]
    return [p for a, b in cuts if _valid(p := Problem(cat, (a, b)))]


def _other_categories(p: Problem) -> list[Problem]:
    if p.category == "rev":
        digits = "".join(str(LETTERS.index(c)) for c in p.operands[0])
        return _split("add", digits) + _split("sub", digits)
    out = [Problem("rev", ("".join(LETTERS[int(c)] for o in p.operands for c in o),))]
    if p.category == "sub":
        out.append(Problem("add", p.operands))
    elif len(p.operands) == 2:  # only a two-operand sum has a same-size difference
        out.append(Problem("sub", tuple(sorted(p.operands, key=int, reverse=True))))
    return [c for c in out if _valid(c)]


def _candidates(p: Problem, method: str) -> list[Problem]:
    if method == "deepen_digits":
        return _edits(p, insert=True)
    if method == "add_constraint":
        base = _constraints(p)
        return [c for c in _edits(p, insert=False) if _constraints(c) > base]
    if method == "breadth_category":
        return _other_categories(p)
    if method == PERTURB:
        return _edits(p, insert=False)
    raise ValueError(f"unknown evolve method {method!r}; expected one of {ALL_METHODS}")


def _applies(p: Problem, method: str) -> bool:
    if method == "add_step":
        return p.category == "add" and len(p.operands) < MAX_OPERANDS
    return bool(_candidates(p, method))


def evolve(prompt: str, method: str, rng: np.random.Generator) -> str | None:
    """One evolved child of prompt, or None when the operator does not apply to it."""
    p = _parse_or_raise(prompt)
    if method == "add_step":
        if not _applies(p, method):
            return None
        # The new operand is no longer than the longest one, so the step adds work, not scale,
        # and never "0", which would add a step with nothing to do.
        width = int(rng.integers(1, max(len(o) for o in p.operands) + 1))
        new = str(int(rng.integers(1, 10)) if width == 1 else _draw_number(rng, width))
        ops = list(p.operands)
        ops.insert(int(rng.integers(len(ops) + 1)), new)
        return render(Problem("add", tuple(ops)))
    candidates = _candidates(p, method)
    if not candidates:
        return None
    # Choose the target category first so rev -> add/sub is not biased by how many splits exist.
    groups: dict[str, list[Problem]] = {}
    for c in candidates:
        groups.setdefault(c.category, []).append(c)
    group = list(groups.values())[int(rng.integers(len(groups)))]
    return render(group[int(rng.integers(len(group)))])


def evolve_many(
    prompt: str,
    num_evolutions: int,
    rng: np.random.Generator,
    methods: Sequence[str] = EVOLVE_METHODS,
) -> list[tuple[str, str]]:
    """Up to num_evolutions distinct (child, method) pairs, methods drawn among those that apply.

    ``methods`` restricts the operators (e.g. in-depth only, for an ablation).
    """
    p = _parse_or_raise(prompt)
    methods = [m for m in methods if _applies(p, m)]
    out: dict[str, str] = {}
    # Bounded retries: a tiny prompt may have fewer distinct children than requested.
    for _ in range(8 * num_evolutions if methods else 0):
        if len(out) >= num_evolutions:
            break
        method = methods[int(rng.integers(len(methods)))]
        child = evolve(prompt, method, rng)
        if child is not None:  # evolve never returns the parent itself
            out.setdefault(child, method)
    return list(out.items())


# --- distributions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Distribution:
    """Prompt sampler: category weights; add operand count; digits per operand; rev length.

    Sizes are drawn uniformly within each range (then the value within a size), so easy
    problems stay common even in a wide distribution. ``sub`` always has two operands.
    """

    categories: tuple[tuple[str, float], ...]
    operands: tuple[int, int] = (2, 2)
    digits: tuple[int, int] = (1, 2)
    rev_length: tuple[int, int] = (2, 4)

    def __post_init__(self) -> None:
        names = [c for c, _ in self.categories]
        if not names or set(names) - set(CATEGORIES) or len(set(names)) != len(names):
            raise ValueError(f"categories must be distinct names from {CATEGORIES}: {names}")
        if any(w <= 0 for _, w in self.categories):
            raise ValueError("category weights must be positive")
        for (lo, hi), (cap_lo, cap_hi) in [
            (self.operands, (MIN_OPERANDS, MAX_OPERANDS)),
            (self.digits, (1, MAX_DIGITS)),
            (self.rev_length, (MIN_REV_LEN, MAX_REV_LEN)),
        ]:
            if not cap_lo <= lo <= hi <= cap_hi:
                raise ValueError(f"range ({lo}, {hi}) outside ({cap_lo}, {cap_hi})")

    def contains(self, prompt: str) -> bool:
        p = parse(prompt)
        if p is None or p.category not in dict(self.categories):
            return False
        if p.category == "rev":
            return self.rev_length[0] <= len(p.operands[0]) <= self.rev_length[1]
        n_ok = p.category == "sub" or self.operands[0] <= len(p.operands) <= self.operands[1]
        return n_ok and all(self.digits[0] <= len(o) <= self.digits[1] for o in p.operands)

    def size(self) -> int:
        """How many distinct prompts the distribution can produce."""
        lo, hi = self.digits
        values = sum(10 if d == 1 else 9 * 10 ** (d - 1) for d in range(lo, hi + 1))
        sizes = {
            "add": sum(values**k for k in range(self.operands[0], self.operands[1] + 1)),
            "sub": values * (values + 1) // 2,  # unordered pairs, including equal operands
            "rev": sum(10**n for n in range(self.rev_length[0], self.rev_length[1] + 1)),
        }
        return sum(sizes[c] for c, _ in self.categories)


# theta_0's demonstrations cover the whole target range; the seed prompts are the easy part of
# it (2-digit operands, strings of 2-4 letters), as UltraFeedback is narrower than Arena-Hard; the
# held-out target asks for 3-digit operands and strings of up to 6 letters as well. Evolution
# (deepen_digits above all) is what can carry training from the seed range toward the target.
SFT_DISTRIBUTION = Distribution(
    (("add", 1.0), ("sub", 1.0), ("rev", 1.0)), digits=(1, 3), rev_length=(2, 6)
)
SEED_DISTRIBUTION = Distribution((("add", 1.0), ("sub", 1.0), ("rev", 1.0)))
HELDOUT_DISTRIBUTION = SFT_DISTRIBUTION


def _draw_number(rng: np.random.Generator, width: int) -> int:
    return int(rng.integers(0 if width == 1 else 10 ** (width - 1), 10**width))


def _draw(dist: Distribution, rng: np.random.Generator, cum: list[float]) -> str:
    cat = dist.categories[bisect.bisect_right(cum, float(rng.random()) * cum[-1])][0]
    if cat == "rev":
        length = int(rng.integers(dist.rev_length[0], dist.rev_length[1] + 1))
        return f"r:{''.join(LETTERS[i] for i in rng.integers(0, 10, size=length))}="
    count = 2 if cat == "sub" else int(rng.integers(dist.operands[0], dist.operands[1] + 1))
    widths = rng.integers(dist.digits[0], dist.digits[1] + 1, size=count)
    values = [_draw_number(rng, int(w)) for w in widths]
    if cat == "sub":
        return render(Problem("sub", tuple(str(v) for v in sorted(values, reverse=True))))
    return render(Problem("add", tuple(str(v) for v in values)))


def sample_prompts(
    dist: Distribution, n: int, seed: int, exclude: Collection[str] = ()
) -> list[str]:
    """n distinct prompts from dist, none in exclude; deterministic for a seed."""
    excluded = set(exclude)
    available = dist.size() - sum(dist.contains(e) for e in excluded)
    if n > available:
        raise ValueError(f"distribution has {available} prompts outside exclude; asked for {n}")
    rng = np.random.default_rng(seed)
    cum = list(itertools.accumulate(w for _, w in dist.categories))
    out: dict[str, None] = {}
    # Rejection sampling; the bound only bites when asking for nearly the whole support.
    for _ in range(100 * n + 10_000):
        if len(out) >= n:
            return list(out)
        prompt = _draw(dist, rng, cum)
        if prompt not in excluded:
            out[prompt] = None
    if len(out) >= n:
        return list(out)
    raise ValueError(f"found only {len(out)} of {n} distinct prompts; the support is exhausted")


def careless_answer(prompt: str) -> str:
    """The answer of a careless demonstrator: each category's typical slip.

    add drops every carry (each column's digit sum mod 10), sub drops every borrow (each
    column's difference mod 10), rev copies the string instead of reversing it. Leading zeros
    of the (reversed) number are dropped as in a real answer. Where the slip changes nothing (a
    sum without carries, a palindrome) the careless answer is the correct one.
    """
    p = _parse_or_raise(prompt)
    if p.category == "rev":
        return p.operands[0]
    columns = []
    for col in range(max(len(o) for o in p.operands)):
        digits = [int(o[-1 - col]) if col < len(o) else 0 for o in p.operands]
        value = sum(digits) if p.category == "add" else digits[0] - digits[1]
        columns.append(str(value % 10))
    return "".join(columns).rstrip("0") or "0"


def sft_examples(
    dist: Distribution,
    n: int,
    seed: int,
    careless: float = 0.0,
    exclude: Collection[str] = (),
) -> list[tuple[str, str]]:
    """n (prompt, demonstration) pairs for supervised training; duplicates allowed.

    A share ``careless`` of the demonstrations (each independently) is ``careless_answer``
    instead of the correct one: theta_0 then imitates demonstrators of mixed care, as a real
    SFT model imitates annotators of mixed quality, and keeps the correct answer among its
    samples without making it the most likely one. ``exclude`` keeps prompts (the held-out set)
    out of the demonstrations.
    """
    if not 0.0 <= careless <= 1.0:
        raise ValueError(f"careless must be in [0, 1], got {careless}")
    rng = np.random.default_rng(seed)
    cum = list(itertools.accumulate(w for _, w in dist.categories))
    excluded = set(exclude)
    out: list[tuple[str, str]] = []
    while len(out) < n:
        prompt = _draw(dist, rng, cum)
        if prompt in excluded:
            continue
        slip = careless > 0.0 and float(rng.random()) < careless
        out.append((prompt, careless_answer(prompt) if slip else solve(prompt)))
    return out

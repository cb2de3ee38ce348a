"""Turning an evolver's raw rewrites into prompt records with lineage.

Whatever produced the rewrites (the world's operators, distilabel EvolInstruct, an API model),
the same clean-up applies, and every dropped candidate is counted under its reason so a run can
tell a bad rewriter from a strict filter.

LLM rewriters often wrap the new prompt in the scaffolding of the template that asked for it
("#Rewritten Prompt#:", quotes, a code fence). ``clean_rewrite`` removes that first: otherwise
the label becomes part of the prompt, the policy learns to answer it, and two rewrites that
differ only in their wrapping escape the duplicate check.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from eva_core.schema import EVOLVED, PROMPT_SCHEMA, instruction_cells, prompt_id

# Lower-cased openings of a rewriter declining the task; such output is not a prompt.
REFUSAL_PREFIXES = (
    "i'm sorry",
    "i am sorry",
    "sorry, i",
    "i cannot",
    "i can't",
    "as an ai",
    "i apologize",
    "i'm unable",
    "i am unable",
    "i won't",
    "as a language model",
)

# Template labels (WizardLM/distilabel EvolInstruct, eva's paper templates). One anywhere in the
# text means the model echoed the template: keep what follows the last one.
_ECHO_LABEL = re.compile(
    r"#\s*(?:the\s+)?(?:rewritten|created|new|evolved)\s+prompt\s*#\s*:?", re.I
)
# A label at the very start, in the spellings models produce ("Rewritten Prompt:", "**New
# prompt:**", "## Evolved Prompt" on its own line). The word before "prompt" is required so that
# a real prompt opening with "Prompt:" survives.
_LEAD_LABEL = re.compile(
    r"^[#*_\s]*(?:the\s+)?(?:rewritten|created|new|evolved)\s+prompt[#*_ \t]*(?::|\n)[*_ \t]*",
    re.I,
)
_FENCE = re.compile(r"^```[\w+-]*[ \t]*\n(.*?)\n?```$", re.S)
# Words that say what a prompt is about: letters only, 3 or more, less the commonest function
# words (a generic answer such as "What is the answer?" would otherwise share "the" with most).
_WORD = re.compile(r"[^\W\d_]{3,}")
_FUNCTION_WORD_LIST = """
    the and for are but not you your with that this from have has had was were will can could
    would should what how why who which when where there their they them then than into about
    also its our out all any some one each more most such only other these those use using make
    give
"""
_FUNCTION_WORDS = frozenset(_FUNCTION_WORD_LIST.split())
# Fewer words than this and a prompt cannot be judged by words (the world's "12+34=").
MIN_PARENT_WORDS = 3
_QUOTES = (('"', '"'), ("'", "'"), ("\u201c", "\u201d"), ("\u2018", "\u2019"))
_OPENERS = frozenset("`\"'\u201c\u2018")


@dataclass
class EvolveStats:
    parents: int = 0
    candidates: int = 0
    kept: int = 0
    cleaned: int = 0  # candidates whose template labels, fences or quotes were stripped
    dropped: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("empty", "refusal", "too_long", "same_as_parent", "unrelated", "duplicate", "heldout"),
            0,
        )
    )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def evolved_records(
    parents: pa.Table,
    candidates: Sequence[Sequence[tuple[str, str] | tuple[str, str, dict[str, Any]]]],
    iteration: int,
    max_chars: int | None = None,
    categorize: Callable[[str], str | None] | None = None,
    exclude_ids: Collection[str] = (),
    keeps_topic: Callable[[str], bool] | None = None,
    min_shared_words: int = 0,
) -> tuple[pa.Table, EvolveStats]:
    """Prompt records for the rewrites of each parent row.

    ``candidates[i]`` holds ``(text, method)`` pairs for ``parents`` row ``i``, or ``(text,
    method, columns)`` where a rewrite carries instruction columns of its own (``columns``
    maps ``INSTRUCTION_COLUMNS`` to its cells); without them a child has none, never its
    parent's, which an LLM's rewrite may no longer ask. Kept rewrites inherit the parent's
    root, one level deeper. ``categorize`` labels a rewrite (in-breadth
    rewrites may change category); without it the parent's category is inherited. Rewrites
    whose id is in ``exclude_ids`` (the held-out set: decontamination) are dropped as
    ``heldout``. A rewrite by a method that ``keeps_topic`` (an in-depth one: the same task,
    harder) that shares fewer than ``min_shared_words`` words with its parent is dropped as
    ``unrelated``: a rewriter answering "Explain step by step." to a story prompt.
    """
    if len(candidates) != parents.num_rows:
        raise ValueError(f"{len(candidates)} candidate lists for {parents.num_rows} parents")
    stats = EvolveStats(parents=parents.num_rows)
    judged = keeps_topic if min_shared_words > 0 else None  # whose rewrites keep to the topic
    names = ("prompt_id", "root_id", "depth", "category", *(("prompt",) if judged else ()))
    cols = {name: parents.column(name).to_pylist() for name in names}
    rows: dict[str, list] = {name: [] for name in PROMPT_SCHEMA.names}
    seen: set[str] = set()
    for i, rewrites in enumerate(candidates):
        for rewrite in rewrites:
            raw, method = rewrite[0], rewrite[1]
            stats.candidates += 1
            text = clean_rewrite(raw)
            stats.cleaned += isinstance(raw, str) and text != raw.strip()
            reason = _drop_reason(text, max_chars)
            pid = prompt_id(text) if reason is None else ""
            if reason is None and pid == cols["prompt_id"][i]:
                reason = "same_as_parent"
            elif (
                reason is None
                and judged is not None
                and judged(method)
                and unrelated(cols["prompt"][i], text, min_shared_words)
            ):
                reason = "unrelated"
            elif reason is None and pid in exclude_ids:
                reason = "heldout"
            elif reason is None and pid in seen:
                reason = "duplicate"
            if reason is not None:
                stats.dropped[reason] += 1
                continue
            seen.add(pid)
            text = text.strip()
            rows["prompt_id"].append(pid)
            rows["prompt"].append(text)
            rows["source"].append(EVOLVED)
            rows["parent_id"].append(cols["prompt_id"][i])
            rows["root_id"].append(cols["root_id"][i])
            rows["depth"].append(cols["depth"][i] + 1)
            rows["iteration"].append(iteration)
            rows["evolve_method"].append(method)
            rows["category"].append(categorize(text) if categorize else cols["category"][i])
            ids, kwargs = _instructions(rewrite[2], i) if len(rewrite) > 2 else (None, None)
            rows["instruction_id_list"].append(ids)
            rows["kwargs"].append(kwargs)
    stats.kept = len(rows["prompt_id"])
    return pa.table(rows, schema=PROMPT_SCHEMA), stats


def _instructions(columns: Any, parent: int) -> tuple[list[str], str]:
    """A rewrite's own instruction cells (``(text, method, columns)``), checked."""
    if not isinstance(columns, dict) or "instruction_id_list" not in columns:
        raise ValueError(
            f"a rewrite of parent {parent} carries {columns!r:.60} where a mapping with "
            "instruction_id_list (and kwargs) belongs"
        )
    try:
        return instruction_cells(columns["instruction_id_list"], columns.get("kwargs"))
    except ValueError as exc:
        raise ValueError(f"a rewrite of parent {parent}: {exc}") from None


def clean_rewrite(text: str | None) -> str:
    """The prompt inside a rewriter's answer: echoed template, leading label, a fence around the
    whole answer and matching quotes around the whole answer removed, then trimmed. A failed
    generation (None) becomes "" so that it is counted as empty, not crashed on."""
    if not isinstance(text, str):
        return ""
    out = text.strip()
    if out[:1] not in _OPENERS and "prompt" not in out.lower():
        return out  # nothing to strip: the common case, kept cheap for million-prompt sets
    for _ in range(4):  # wrappings nest ("**Rewritten Prompt:** ```...```"); a few passes do
        before = out
        labels = list(_ECHO_LABEL.finditer(out))
        if labels:
            out = out[labels[-1].end() :].strip()
        out = _LEAD_LABEL.sub("", out, count=1).strip()
        if fence := _FENCE.match(out):
            out = fence.group(1).strip()
        for left, right in _QUOTES:
            # Only quotes around the whole text: '"a" or "b"' is a prompt with two quotations.
            inner = out[len(left) : -len(right)]
            wrapped = len(out) >= 2 and out.startswith(left) and out.endswith(right)
            if wrapped and left not in inner and right not in inner:
                out = inner.strip()
        if out == before:
            break
    return out


def content_words(text: str) -> set[str]:
    """The lower-cased words of three or more letters that are not function words."""
    return {w for w in _WORD.findall(text.lower()) if w not in _FUNCTION_WORDS}


def unrelated(parent: str, child: str, min_shared: int) -> bool:
    """Whether ``child`` keeps fewer than ``min_shared`` of ``parent``'s content words. A parent
    of fewer than ``MIN_PARENT_WORDS`` such words is never judged (symbols and numbers say
    nothing here), nor is anything when ``min_shared`` is 0."""
    words = content_words(parent)
    if min_shared <= 0 or len(words) < MIN_PARENT_WORDS:
        return False
    return len(words & content_words(child)) < min_shared


def is_refusal(text: str) -> bool:
    """Whether a rewriter's answer declines the task (curly apostrophes count too)."""
    return text.strip().lower().replace("\u2019", "'").startswith(REFUSAL_PREFIXES)


def _drop_reason(text: str, max_chars: int | None) -> str | None:
    stripped = text.strip() if isinstance(text, str) else ""
    if not stripped:
        return "empty"
    if is_refusal(stripped):
        return "refusal"
    if max_chars is not None and len(stripped) > max_chars:
        return "too_long"
    return None

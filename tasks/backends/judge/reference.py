"""Where the reference answers come from that a judge compares each checkpoint's answers with.

==========  ==========================================================================
kind        the reference answer to a held-out prompt
==========  ==========================================================================
column      a column of the held-out set's own file or dataset (answers written beside
            the questions)
file        a file of yours (JSONL, JSON, CSV or parquet, any fsspec URL) with a prompt
            and an answer column, matched by prompt id (spacing and case ignored)
generate    generated once by a named model through any generation backend (greedy by
            default): a hosted API model, a Hub id, a local checkpoint
==========  ==========================================================================

Each ``load()`` gives ``answers(prompts, seed, progress) -> [answer or None]``; the ``reference``
stage (``tasks.judge``) writes what it returns as the run's ``reference`` artifact, once, so a
generated reference is paid for once per run. A prompt without an answer (a file that does not
cover it) is None: the judge leaves it out and counts it.

An answer cell is a text, a mapping with ``content`` (a turn) or a list of them (its first):
the shape of Arena-Hard's and MT-Bench's answer files.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from eva_core.schema import prompt_id
from eva_runtime.errors import EvaError, first_line
from tasks.backends.generate import GenerationBackend, OpenAIGeneration, TransformersGeneration
from tasks.backends.protocols import Progress, close_after, no_progress, stats_of
from tasks.checkpoints import gguf_path, is_gguf, local_checkpoint
from tasks.content_hashes import checkpoint_hash, hash_file, is_hub_id
from tasks.prompt_datasets import dataset_key, load_dataset_split
from tasks.prompt_files import read_columns
from tasks.prompt_rows import cell_text
from tasks.prompts import PromptsConfig

FIELD = "evaluate.judge.reference"
FORMATS = (".jsonl", ".json", ".ndjson", ".csv", ".parquet")


class ReferenceError(EvaError, ValueError):
    """Reference answers that cannot be read as the config asks (file, column, conflicts)."""


def answer_text(cell: Any) -> str | None:
    """A reference cell as text: a string, a turn's ``content``, a list's first; None for an
    empty or missing one."""
    if isinstance(cell, Mapping):
        cell = cell.get("content")
    elif isinstance(cell, list | tuple):
        cell = answer_text(cell[0]) if cell else None
    if cell is None:
        return None
    text = str(cell)
    return text if text.strip() else None


def by_prompt(
    prompts: Sequence[Any], answers: Sequence[Any], where: str, multi_turn: Any
) -> dict[str, str]:
    """Answers keyed by the prompt id of each row's prompt cell (read as the held-out stage
    reads it); two different answers for one prompt are refused."""
    out: dict[str, str] = {}
    for row, (cell, answer) in enumerate(zip(prompts, answers, strict=True)):
        text, prompt = answer_text(answer), cell_text(cell, multi_turn)
        if text is None or not isinstance(prompt, str) or not prompt.strip():
            continue
        key = prompt_id(prompt)
        if out.get(key, text) != text:
            raise ReferenceError(
                f"{where}: row {row} gives a second, different answer to {prompt[:60]!r}",
                field=FIELD,
                hint="one reference answer per prompt (prompts match ignoring spacing and case)",
            )
        out[key] = text
    return out


class KnownAnswers:
    """Reference answers read from a table, looked up by prompt."""

    def __init__(self, answers: dict[str, str]):
        self.known = answers

    def answers(
        self, prompts: Sequence[str], seed: int, progress: Progress = no_progress
    ) -> list[str | None]:
        return [self.known.get(prompt_id(p)) for p in prompts]


class ColumnReference(BaseModel):
    """A column of the held-out set's own file or dataset."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ("pyarrow",)
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["column"] = "column"
    column: str = Field(
        description="The held-out file's or dataset's column holding each prompt's reference "
        "answer (a text, a turn with content, or a list of them: the first)."
    )
    heldout: PromptsConfig | None = Field(
        default=None,
        json_schema_extra={"key": "unless default"},
        description="Filled in by the run: the held-out set (heldout) whose column is read; a "
        "value given is replaced.",
    )

    def origin_key(self) -> dict[str, str]:
        """The bytes of the file or dataset the column is read from key the stage."""
        held = self._heldout()
        if held.dataset is not None:
            return dataset_key(
                held.dataset, config_name=held.dataset_config, split=held.split,
                storage_options=held.storage_options,
            )  # fmt: skip
        assert held.path is not None
        return {"file_sha256": hash_file(held.path, held.storage_options)}

    def check(self) -> None:
        self.load()

    def load(self) -> KnownAnswers:
        held = self._heldout()
        where = f"{FIELD}.column: {held.path or held.dataset}"
        try:
            if held.dataset is not None:
                data = load_dataset_split(
                    held.dataset, config_name=held.dataset_config, split=held.split,
                    storage_options=held.storage_options,
                )  # fmt: skip
                names = list(data.column_names)
                columns = {c: data[c] for c in (held.prompt_column, self.column) if c in names}
            else:
                assert held.path is not None
                ext = os.path.splitext(held.path.split("?")[0])[1].lower()
                columns = read_columns(held.path, ext, held.storage_options)
                names = list(columns)
        except (OSError, ValueError) as exc:
            raise ReferenceError(f"{where}: {first_line(exc, with_type=False)}") from None
        if self.column not in names:
            raise ReferenceError(
                f"{where} has no column {self.column!r} (columns: {', '.join(names)})",
                field=f"{FIELD}.column",
                hint="name the column that holds the reference answers",
            )
        prompts = columns[held.prompt_column]
        return KnownAnswers(by_prompt(prompts, columns[self.column], where, held.multi_turn))

    def _heldout(self) -> PromptsConfig:
        held = self.heldout
        if held is None or held.origin is None:
            raise ReferenceError(
                "a column of the held-out set needs a held-out file or dataset",
                field=f"{FIELD}.column",
                hint="set heldout.path or heldout.dataset, or use reference kind file or generate",
            )
        return held


class FileReference(BaseModel):
    """A file of reference answers with a prompt and an answer column."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ("pyarrow",)
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["file"] = "file"
    path: str = Field(
        description="JSONL, JSON, CSV or parquet file (any fsspec URL) of reference answers."
    )
    prompt_column: str = Field(default="prompt", description="The file's prompt column.")
    answer_column: str = Field(default="answer", description="The file's answer column.")
    storage_options: dict[str, Any] = Field(
        default_factory=dict, description="fsspec options for path."
    )

    def origin_key(self) -> dict[str, str]:
        return {"file_sha256": hash_file(self.path, self.storage_options)}

    def check(self) -> None:
        self.load()

    def load(self) -> KnownAnswers:
        where = f"{FIELD}.path: {self.path}"
        ext = os.path.splitext(self.path.split("?")[0])[1].lower()
        if ext not in FORMATS:
            raise ReferenceError(f"{where}: not one of {', '.join(FORMATS)}")
        try:
            columns = read_columns(self.path, ext, self.storage_options)
        except Exception as exc:  # missing, unreadable, malformed: one line, whichever
            raise ReferenceError(f"{where}: cannot be read ({first_line(exc)})") from None
        for name in ("prompt_column", "answer_column"):
            if (column := getattr(self, name)) not in columns:
                raise ReferenceError(
                    f"{where} has no column {column!r} (columns: {', '.join(columns)})",
                    field=f"{FIELD}.{name}",
                    hint=f"set {name} to the column that holds it",
                )
        prompts, answers = columns[self.prompt_column], columns[self.answer_column]
        return KnownAnswers(by_prompt(prompts, answers, where, "first"))


class GeneratedAnswers:
    """Reference answers generated by a model, one greedy answer per prompt by default."""

    def __init__(self, config: GeneratedReference):
        self.config = config
        self.counts: Counter[str] = Counter()

    def stats(self) -> dict[str, int]:
        """The reference model's generation counts (an HTTP backend's requests and tokens, and
        the answers cut at the length cap), since load over every ``answers`` call, each of
        which loads the model anew."""
        return dict(self.counts)

    def answers(
        self, prompts: Sequence[str], seed: int, progress: Progress = no_progress
    ) -> list[str | None]:
        model = self.config.model
        if not isinstance(self.config.generation, OpenAIGeneration):  # the endpoint's name
            model = local_checkpoint(model, f"{FIELD}.model")
        with close_after(self.config.generation.load(model)) as generator:
            out, finished = generator.generate(list(prompts), 1, seed, progress).firsts()
            self.counts.update(stats_of(generator))
        # Judged as they are, but said: a cut-off reference answer is easier to beat.
        self.counts["truncated"] += finished.count(False)
        return [a if a.strip() else None for a in out]


class GeneratedReference(BaseModel):
    """Answers generated once, by a model the config names."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ()
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["generate"] = "generate"
    model: str = Field(
        description="The reference model: a Hub id, a local checkpoint or a GGUF file "
        "(transformers, vllm, served), or the name an OpenAI-compatible endpoint serves it "
        "under (openai; generation.llm.model, when set, is sent instead)."
    )
    generation: GenerationBackend = Field(
        default_factory=lambda: TransformersGeneration(temperature=0.0),
        description="How the reference model answers: any generation backend (greedy "
        "transformers by default; kind: openai for an API model).",
    )

    def origin_key(self) -> dict[str, str]:
        """A local checkpoint is keyed by its bytes; a Hub id or a served name by itself."""
        if is_gguf(self.model):
            return {"checkpoint": hash_file(gguf_path(self.model))}
        local = os.path.isdir(self.model) and not is_hub_id(self.model)
        return {"checkpoint": checkpoint_hash(self.model)} if local else {}

    def check(self) -> None:
        """Nothing to read before the run: the model loads when the stage runs."""

    def load(self) -> GeneratedAnswers:
        return GeneratedAnswers(self)


REFERENCE_KINDS = ("column", "file", "generate")


def _kind(value: Any) -> str | None:
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if kind in REFERENCE_KINDS else None


ReferenceSource = Annotated[
    Annotated[ColumnReference, Tag("column")]
    | Annotated[FileReference, Tag("file")]
    | Annotated[GeneratedReference, Tag("generate")],
    Discriminator(
        _kind,
        custom_error_type="unknown_reference",
        custom_error_message="unknown reference 'kind': expected one of "
        + ", ".join(repr(k) for k in REFERENCE_KINDS),
    ),
]
"""``reference: ReferenceSource`` in the judge's config."""


def for_heldout(source: Any, heldout: PromptsConfig) -> Any:
    """``source`` as the run reads it: a column of the held-out set learns which set that is."""
    if isinstance(source, ColumnReference):
        return source.model_copy(update={"heldout": heldout})
    return source

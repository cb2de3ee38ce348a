"""Reward models as ``transformers`` sequence classifiers (Skywork-Reward, ArmoRM and friends).

One forward pass over ``[user prompt, assistant response]`` gives one scalar per response. Two
output conventions exist in the wild: plain ``*ForSequenceClassification`` heads with one label
(Skywork: the reward is ``logits[:, 0]``) and custom heads whose output carries a ``score`` next
to per-objective ``rewards`` (ArmoRM, loaded with ``trust_remote_code``). ``output="auto"``
takes ``score`` when the model's output has one and the single logit otherwise.

Batches are always right-padded with the *model's* pad id, whatever the tokenizer's
``padding_side``: under a causal mask real tokens never attend to trailing pads, so a response
scores the same alone or in a padded batch, for absolute-position models (GPT-2) too, and both
pooling rules in use pick the last real token ("rightmost non-pad", transformers' generic head;
"first pad minus one", older custom heads such as ArmoRM's, which left padding would break).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from eva_runtime.errors import ConfigError
from tasks.backends.devices import Device, ModelRef
from tasks.backends.protocols import Progress, no_progress

if TYPE_CHECKING:  # imported where used: reading a config does not pay for torch
    import torch
    from transformers import PreTrainedTokenizerBase

# Where a reward model sits in a config, for errors (it may also be evaluate.reward or
# online.reward: the stage's name in the failure line says which).
FIELD = "annotate.reward"


def resolve_device_dtype(device: str, dtype: str) -> tuple[str, torch.dtype]:
    import torch

    """``"auto"`` device = cuda when available; ``"auto"`` dtype = bf16 where CUDA supports it."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    explicit = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype)
    if explicit is not None:
        return device, explicit
    bf16_ok = device.startswith("cuda") and torch.cuda.is_bf16_supported()
    return device, torch.bfloat16 if bf16_ok else torch.float32


def use_chat_template(tokenizer: Any, setting: bool | Literal["auto"], model: str) -> bool:
    """Resolve the ``chat_template`` setting against what the tokenizer actually has."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if setting is True and not has_template:
        raise ConfigError(
            f"chat_template: true, but the tokenizer of {model} has no chat template",
            field=f"{FIELD}.chat_template",
            hint="set it to auto (a template when the tokenizer has one) or false",
        )
    return has_template if setting == "auto" else bool(setting)


def encode_conversation(tokenizer: Any, prompt: str, response: str, template: bool) -> list[int]:
    """Token ids of one (prompt, response) exchange, as the reward model was trained to see it.

    With a template the rendered text already holds bos and the turn markers, so it is encoded
    without adding special tokens again (a doubled bos shifts every score). Without one, the
    fallback is ``prompt + "\\n\\n" + response`` with the tokenizer's own special tokens.
    """
    if template:
        messages = [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": response},
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(f"{prompt}\n\n{response}")["input_ids"])


def encode_all(
    tokenizer: Any,
    prompts: Sequence[str],
    responses: Sequence[Sequence[str]],
    template: bool,
    max_length: int,
) -> tuple[list[tuple[int, int, list[int]]], int]:
    """``(prompt index, response index, token ids)`` of every conversation that fits in
    ``max_length`` tokens, and how many did not (those are scored NaN, never truncated: a
    truncated response would be judged on text it does not end with)."""
    items = [
        (i, j, encode_conversation(tokenizer, prompt, response, template))
        for i, (prompt, rs) in enumerate(zip(prompts, responses, strict=True))
        for j, response in enumerate(rs)
    ]
    valid = [it for it in items if 0 < len(it[2]) <= max_length]
    return valid, sum(len(it[2]) > max_length for it in items)


class SequenceClassifierReward(BaseModel):
    """Score responses with a ``transformers`` sequence-classification reward model."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ("torch", "transformers")

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["sequence_classifier"] = "sequence_classifier"
    model: ModelRef = Field(description="Checkpoint directory or hub id of the reward model.")
    trust_remote_code: bool = Field(
        default=False,
        description="Run the checkpoint's own modelling code (ArmoRM needs it). Off unless set: "
        "it executes code shipped with the weights.",
    )
    batch_size: int = Field(default=8, ge=1, description="Sequences per forward pass.")
    device: Device = Field(default="auto", description='"auto" = cuda when available, else cpu.')
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto", description='"auto" = bfloat16 on a CUDA device that supports it.'
    )
    max_length: int = Field(
        default=4096,
        ge=1,
        description="Longest conversation in tokens (capped at the model's "
        "max_position_embeddings); longer ones get NaN (unscored) rather than a score of a "
        "truncated conversation the model never saw whole.",
    )
    chat_template: bool | Literal["auto"] = Field(
        default="auto",
        description='"auto": the tokenizer\'s chat template over [user, assistant] when it has '
        'one, else "prompt\\n\\nresponse"; true requires a template; false always concatenates.',
    )
    output: Literal["auto", "logits", "score"] = Field(
        default="auto",
        description='"score": the output\'s `score` (ArmoRM); "logits": logits[:, 0] (one label, '
        'Skywork); "auto": `score` when the output has one, else logits[:, 0].',
    )

    def load(self) -> SequenceClassifierScorer:
        device, dtype = resolve_device_dtype(self.device, self.dtype)
        # trust_remote_code is always passed as a bool: left as None, transformers would ask on
        # stdin (with a timeout) before running a local checkpoint's code.
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        model = AutoModelForSequenceClassification.from_pretrained(
            self.model, dtype=dtype, device_map=device, trust_remote_code=self.trust_remote_code
        )
        model.eval()
        tokenizer = AutoTokenizer.from_pretrained(
            self.model, trust_remote_code=self.trust_remote_code
        )
        return SequenceClassifierScorer(model, tokenizer, self)


class SequenceClassifierScorer:
    """A loaded reward model that satisfies the ``RewardModel`` protocol."""

    def __init__(
        self, model: Any, tokenizer: PreTrainedTokenizerBase, config: SequenceClassifierReward
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.use_template = use_chat_template(tokenizer, config.chat_template, config.model)
        model_config = model.config
        if hasattr(model_config, "use_cache"):
            model_config.use_cache = False  # one forward pass: a KV cache is memory for nothing
        text_config = model_config.get_text_config()
        pad = getattr(text_config, "pad_token_id", None)
        # The head finds the last real token by comparing ids with the *config's* pad id, so
        # that is the id to pad with. Without one, transformers refuses batches > 1: score one
        # sequence at a time rather than invent a pad id the head would not recognise.
        self.pad_id: int | None = pad
        self.batch_size = config.batch_size if pad is not None else 1
        # Past its position table a model crashes (GPT-2) or extrapolates untrained: NaN instead.
        positions = getattr(text_config, "max_position_embeddings", None)
        self.max_length = min(config.max_length, positions or config.max_length)
        self._counts: Counter[str] = Counter(too_long=0)  # since load (``ReportsStats``)

    def _values(self, out: Any, rows: int) -> torch.Tensor:
        mode = self.config.output
        score = None if mode == "logits" else getattr(out, "score", None)
        if mode == "score" and score is None:
            raise ConfigError(
                f"output: score, but the output of {self.config.model} has no `score` attribute",
                field=f"{FIELD}.output",
                hint="auto or logits reads a plain classifier's single logit",
            )
        if score is None:
            logits = out.logits if hasattr(out, "logits") else out[0]
            if logits.shape[-1] != 1:
                raise ConfigError(
                    f"the reward model has {logits.shape[-1]} labels; a scalar reward needs "
                    "num_labels=1",
                    field=f"{FIELD}.model",
                    hint="a model with one label, or output: score for a head that returns `score`",
                )
            score = logits
        values = score.float().reshape(rows, -1)
        if values.shape[1] != 1:
            raise ConfigError(
                f"the `score` of {self.config.model} has {values.shape[1]} values per sequence; "
                "a scalar reward needs 1",
                field=f"{FIELD}.model",
                hint="a model whose head returns one score per sequence",
            )
        return values[:, 0].cpu()

    def stats(self) -> dict[str, int]:
        """Conversations left unscored as too long, since load (``ReportsStats``)."""
        return dict(self._counts)

    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[Sequence[str]],
        progress: Progress = no_progress,
    ) -> list[list[float]]:
        """One reward per response (NaN for conversations over ``self.max_length`` tokens)."""
        import torch

        out = [[math.nan] * len(rs) for rs in responses]
        valid, too_long = encode_all(
            self.tokenizer, prompts, responses, self.use_template, self.max_length
        )
        self._counts.update(too_long=too_long)
        # Longest first: batches hold similar lengths (little padding), and a batch that does
        # not fit in memory fails at the start of a long stage rather than at its end.
        valid.sort(key=lambda it: -len(it[2]))
        device = self.model.device
        for start in range(0, len(valid), self.batch_size):
            chunk = valid[start : start + self.batch_size]
            width = max(len(ids) for _, _, ids in chunk)
            input_ids = torch.full((len(chunk), width), self.pad_id or 0, dtype=torch.long)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, (_, _, ids) in enumerate(chunk):
                input_ids[row, : len(ids)] = torch.tensor(ids)
                attention[row, : len(ids)] = 1
            with torch.inference_mode():
                result = self.model(
                    input_ids=input_ids.to(device), attention_mask=attention.to(device)
                )
            for (i, j, _), value in zip(
                chunk, self._values(result, len(chunk)).tolist(), strict=True
            ):
                out[i][j] = float(value)
            progress(min(1.0, (start + len(chunk)) / len(valid)))
        progress(1.0)
        return out

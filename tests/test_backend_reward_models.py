"""The transformers reward-model backend, on tiny checkpoints built here and loaded back.

Every model is saved with ``save_pretrained`` and read through the backend's own
``from_pretrained`` path: Llama and GPT-2 sequence classifiers (Skywork-style single logit), an
ArmoRM-style custom head registered with the Auto classes, and the same head shipped as
checkpoint code behind ``trust_remote_code``.
"""

from __future__ import annotations

import json
import math
import random
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    LlamaConfig,
    LlamaForSequenceClassification,
    LlamaModel,
    LlamaPreTrainedModel,
    PreTrainedTokenizerFast,
)
from transformers.utils import ModelOutput

from eva_runtime.errors import ConfigError
from eva_world import world
from eva_world.tiny_lm import build_char_tokenizer
from tasks.backends.protocols import RewardModel
from tasks.backends.reward.sequence_classifier import (
    SequenceClassifierReward,
    SequenceClassifierScorer,
)

TEMPLATE = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}{{ eos_token }}{% endfor %}"
PROMPTS = ["1+2=", "12+345=", "r:abcdef=", "9-3="]
RESPONSES = [["3", "21", ""], ["753", "7"], ["fedcba", "abc", "f"], ["6", "66666"]]


def _tokenizer(template: bool = True) -> PreTrainedTokenizerFast:
    # Left padding on purpose: the backend must not depend on the tokenizer's padding side.
    tok = build_char_tokenizer(world.ALPHABET + "ua\n")
    if template:
        tok.chat_template = TEMPLATE
    return tok


def _llama_config(tok: PreTrainedTokenizerFast) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.2,  # scores far enough apart that a mix-up shows
        num_labels=1,
        pad_token_id=tok.pad_token_id,
    )


def _flat(rows: list[list[float]]) -> list[float]:
    return [x for row in rows for x in row]


def _save(model: nn.Module, tok: PreTrainedTokenizerFast, path: Path) -> str:
    model.save_pretrained(path)  # type: ignore[operator]
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    torch.manual_seed(0)
    tok = _tokenizer()
    return _save(
        LlamaForSequenceClassification(_llama_config(tok)), tok, tmp_path_factory.mktemp("l")
    )


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    torch.manual_seed(0)
    tok = _tokenizer(template=False)
    config = GPT2Config(
        vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=1, n_head=2, num_labels=1,
        initializer_range=0.2,
        pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    return _save(GPT2ForSequenceClassification(config), tok, tmp_path_factory.mktemp("g"))


def _load(path: str, **overrides: object) -> SequenceClassifierScorer:
    return SequenceClassifierReward(model=path, **overrides).load()  # type: ignore[arg-type]


def test_loads_on_cpu_in_float32_and_resolves_the_template(llama_dir: str, gpt2_dir: str):
    rm = _load(llama_dir)
    assert isinstance(rm, RewardModel)
    assert rm.model.device.type == "cpu" and rm.model.dtype == torch.float32
    assert rm.use_template and not _load(gpt2_dir).use_template  # "auto" follows the tokenizer
    assert not _load(llama_dir, chat_template=False).use_template
    with pytest.raises(ConfigError, match="has no chat template") as e:
        _load(gpt2_dir, chat_template=True)
    assert e.value.field == "annotate.reward.chat_template"


@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_a_response_scores_the_same_alone_and_in_any_padded_batch(
    which: str, llama_dir: str, gpt2_dir: str
):
    # GPT-2 has absolute positions: left padding would shift them and change every score.
    path = llama_dir if which == "llama" else gpt2_dir
    alone = [
        [_load(path).score([p], [[r]])[0][0] for r in rs]
        for p, rs in zip(PROMPTS, RESPONSES, strict=True)
    ]
    flat = [r for rs in alone for r in rs]
    assert len({round(r, 3) for r in flat}) == len(flat)  # distinct: a mix-up would show
    for batch_size in (2, 3, 16):
        together = _load(path, batch_size=batch_size).score(PROMPTS, RESPONSES)
        assert [len(r) for r in together] == [len(r) for r in RESPONSES]
        assert _flat(together) == pytest.approx(flat, abs=1e-5)


def test_progress_reaches_one_and_over_long_conversations_are_nan(llama_dir: str, gpt2_dir: str):
    seen: list[float] = []
    rm = _load(llama_dir, batch_size=2, max_length=12)
    out = rm.score(["1+2="], [["3", "3" * 20]], seen.append)
    assert math.isfinite(out[0][0]) and math.isnan(out[0][1])
    assert rm.stats() == {"too_long": 1}
    assert seen == sorted(seen) and seen[-1] == 1.0
    rm.score(["1+2=", "4+4="], [["3" * 20], ["8" * 20, "8"]])
    assert rm.stats() == {"too_long": 3}  # since load: the second call's two add to the first's
    # Past GPT-2's 64 positions: NaN, where a forward pass would crash.
    capped = _load(gpt2_dir)
    assert capped.max_length == 64
    out = capped.score(["1+2="], [["3" * 80, "3"]])
    assert math.isnan(out[0][0]) and math.isfinite(out[0][1])


def test_without_a_pad_id_sequences_are_scored_one_at_a_time(llama_dir: str, tmp_path: Path):
    model = AutoModelForSequenceClassification.from_pretrained(llama_dir)
    model.config.pad_token_id = None
    path = _save(model, _tokenizer(), tmp_path)
    rm = _load(path, batch_size=8)
    assert rm.batch_size == 1
    expected = _flat(_load(llama_dir).score(PROMPTS, RESPONSES))
    assert _flat(rm.score(PROMPTS, RESPONSES)) == pytest.approx(expected, abs=1e-5)


SWAP = str.maketrans(world.DIGITS + world.LETTERS, world.LETTERS + world.DIGITS)


def _encode(tok: PreTrainedTokenizerFast, prompt: str, response: str) -> list[int]:
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    return tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)[
        "input_ids"
    ]


def test_a_trained_reward_model_ranks_held_out_good_responses_above_bad(tmp_path: Path):
    """Bradley-Terry training on "the correct answer beats the same answer in the wrong
    alphabet" (digits for a letters task and vice versa), then scoring unseen prompts."""
    tok = _tokenizer()
    prompts = world.sample_prompts(world.SFT_DISTRIBUTION, 300, seed=0)
    train, held = prompts[:200], prompts[200:]
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(_llama_config(tok))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(0)
    for _ in range(40):
        batch = rng.sample(train, 32)
        seqs = [_encode(tok, p, world.solve(p)) for p in batch]
        seqs += [_encode(tok, p, world.solve(p).translate(SWAP)) for p in batch]
        ids = torch.full((len(seqs), max(map(len, seqs))), tok.pad_token_id, dtype=torch.long)
        for row, s in enumerate(seqs):
            ids[row, : len(s)] = torch.tensor(s)
        rewards = model(input_ids=ids, attention_mask=(ids != tok.pad_token_id).long()).logits[:, 0]
        loss = -F.logsigmoid(rewards[:32] - rewards[32:]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    rm = _load(_save(model, tok, tmp_path), batch_size=7)
    scores = rm.score(held, [[world.solve(p), world.solve(p).translate(SWAP)] for p in held])
    wins = sum(good > bad for good, bad in scores)
    assert wins >= 0.95 * len(held), f"{wins}/{len(held)}"


# --- ArmoRM-style custom head: per-objective `rewards` and a combined `score` ----------------


class TinyArmoConfig(LlamaConfig):
    model_type = "tiny_armo"

    def __init__(self, num_objectives: int = 3, **kwargs: object):
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.num_objectives = num_objectives


@dataclass
class ArmoOutput(ModelOutput):
    rewards: torch.Tensor | None = None
    score: torch.Tensor | None = None


class TinyArmoForRewardModel(LlamaPreTrainedModel):
    config_class = TinyArmoConfig

    def __init__(self, config: TinyArmoConfig):
        super().__init__(config)
        self.model = LlamaModel(config)
        self.regression_layer = nn.Linear(config.hidden_size, config.num_objectives, bias=False)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kw):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        # ArmoRM's pooling rule: the token before the first pad, which needs right padding.
        last = (torch.eq(input_ids, self.config.pad_token_id).int().argmax(-1) - 1) % hidden.shape[
            1
        ]
        rewards = self.regression_layer(hidden[torch.arange(len(hidden)), last])
        weights = torch.tensor([0.5, 2.0, -1.0])[: rewards.shape[-1]]
        return ArmoOutput(rewards=rewards, score=(rewards * weights).sum(-1, keepdim=True))


AutoConfig.register("tiny_armo", TinyArmoConfig, exist_ok=True)
AutoModelForSequenceClassification.register(TinyArmoConfig, TinyArmoForRewardModel, exist_ok=True)


@pytest.fixture(scope="module")
def armo_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    torch.manual_seed(0)
    tok = _tokenizer()
    base = _llama_config(tok).to_dict()
    base.pop("model_type", None)
    model = TinyArmoForRewardModel(TinyArmoConfig(**base))
    return _save(model, tok, tmp_path_factory.mktemp("armo"))


def test_auto_output_takes_the_custom_heads_score(armo_dir: str):
    rm = _load(armo_dir, batch_size=3)
    assert isinstance(rm.model, TinyArmoForRewardModel)
    got = rm.score(PROMPTS, RESPONSES)
    tok = rm.tokenizer
    for p, rs, row in zip(PROMPTS, RESPONSES, got, strict=True):
        for r, value in zip(rs, row, strict=True):
            ids = torch.tensor([_encode(tok, p, r)])  # type: ignore[arg-type]
            out = rm.model(input_ids=ids)
            assert value == pytest.approx(out.score.item(), abs=1e-5)
            assert value != pytest.approx(out.rewards[0, 0].item(), abs=1e-5)
    same = _load(armo_dir, output="score", batch_size=3).score(PROMPTS, RESPONSES)
    assert _flat(same) == _flat(got)
    with pytest.raises(ConfigError, match="3 labels") as e:
        _load(armo_dir, output="logits").score(PROMPTS, RESPONSES)
    assert e.value.field == "annotate.reward.model" and "output: score" in (e.value.hint or "")


def test_output_score_on_a_plain_classifier_is_a_clear_error(llama_dir: str):
    with pytest.raises(ConfigError, match="no `score` attribute") as e:
        _load(llama_dir, output="score").score(PROMPTS, RESPONSES)
    assert e.value.field == "annotate.reward.output"


def test_a_score_of_several_values_per_sequence_names_the_model(llama_dir: str):
    rm = _load(llama_dir, output="score")
    with pytest.raises(ConfigError, match="has 2 values per sequence") as e:
        rm._values(ModelOutput(score=torch.zeros(3, 2)), rows=3)
    assert e.value.field == "annotate.reward.model"


REMOTE_CODE = textwrap.dedent(
    """
    import torch
    from torch import nn
    from transformers import LlamaConfig, LlamaModel, LlamaPreTrainedModel
    from transformers.modeling_outputs import SequenceClassifierOutput


    class TinyRemoteConfig(LlamaConfig):
        model_type = "tiny_remote_rm"


    class TinyRemoteRM(LlamaPreTrainedModel):
        config_class = TinyRemoteConfig

        def __init__(self, config):
            super().__init__(config)
            self.model = LlamaModel(config)
            self.head = nn.Linear(config.hidden_size, 1)
            self.post_init()

        def forward(self, input_ids, attention_mask=None, **kwargs):
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask)[0]
            last = hidden[torch.arange(len(hidden)), attention_mask.sum(-1) - 1]
            return SequenceClassifierOutput(logits=self.head(last))
    """
)


def test_trust_remote_code_is_off_by_default_and_passed_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import transformers.dynamic_module_utils as dynamic

    # transformers copies checkpoint code into a modules cache: keep it inside the test.
    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    namespace: dict[str, object] = {}
    exec(REMOTE_CODE, namespace)  # the same classes the checkpoint ships, to make its weights
    tok = _tokenizer()
    base = _llama_config(tok).to_dict()
    base.pop("model_type", None)
    model = namespace["TinyRemoteRM"](namespace["TinyRemoteConfig"](**base))  # type: ignore[operator]
    path = tmp_path / "remote"
    _save(model, tok, path)
    (path / "modeling_tiny_remote.py").write_text(REMOTE_CODE)
    config = json.loads((path / "config.json").read_text())
    config["auto_map"] = {
        "AutoConfig": "modeling_tiny_remote.TinyRemoteConfig",
        "AutoModelForSequenceClassification": "modeling_tiny_remote.TinyRemoteRM",
    }
    (path / "config.json").write_text(json.dumps(config))

    assert SequenceClassifierReward(model=str(path)).trust_remote_code is False
    with pytest.raises(ValueError, match="trust_remote_code"):
        _load(str(path))
    rm = _load(str(path), trust_remote_code=True)
    assert type(rm.model).__name__ == "TinyRemoteRM"
    alone = [
        rm.score([p], [[r]])[0][0] for p, rs in zip(PROMPTS, RESPONSES, strict=True) for r in rs
    ]
    assert _flat(rm.score(PROMPTS, RESPONSES)) == pytest.approx(alone, abs=1e-5)

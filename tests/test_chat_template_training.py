"""The solvers train on a prompt exactly as generation fed it to the model: wrapped in the policy's
chat template when its tokenizer has one, raw otherwise (``tasks.backends.train.chat``).

The policy is the world's tiny model with a character tokenizer given a chat template, saved with
``save_pretrained`` and loaded back by every backend. What generation feeds the model is read off
the model itself (a spy on ``generate``), and what training uses off the trainers TRL builds
through their public entry points: the DPO family's ``train_dataset`` and the ids the online
trainers pass to ``generate`` while they train.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from eva_adapters.trl import CreatorFeed
from eva_core.creator import Creator
from eva_runtime.errors import ConfigError
from eva_world.tiny_lm import (
    TinyModelConfig,
    build_char_tokenizer,
    build_tiny_model,
    save_checkpoint,
)
from eva_world.world import ALPHABET
from tasks.backends.generate.transformers import TransformersGeneration
from tasks.backends.train.dpo import DPOSolverConfig
from tasks.backends.train.objectives import (
    DPONLLSolverConfig,
    ORPOSolverConfig,
    SimPOSolverConfig,
    SPPOSolverConfig,
)
from tasks.backends.train.online import OnlineSolverConfig
from tasks.backends.train.online_trainer import build_online_trainer, cut_ranks_last
from tasks.backends.train.trl_solver import build_trainer

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*importing from 'trl.experimental'",
    "ignore:.*will be removed in v6:FutureWarning",
)

# Role initial, ":", content, end of turn (eos); the generation prompt opens the answer.
TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)
# The same with the BOS token rendered first, as the templates of real models that use one do.
BOS_TEMPLATE = "{{ bos_token }}" + TEMPLATE
PAIRS = [("1+2=", "3", "12"), ("34+5=", "39", "7"), ("6-1=", "5", "51"), ("r:abc=", "cba", "ab")]
SOLVERS = {
    "dpo": DPOSolverConfig,
    "sppo": SPPOSolverConfig,
    "dpo_nll": DPONLLSolverConfig,
    "simpo": SimPOSolverConfig,
    "orpo": ORPOSolverConfig,
}


def _policy(path: Path, template: str | None) -> str:
    tok = build_char_tokenizer(ALPHABET + "ua")
    if template is not None:
        tok.chat_template = template
    save_checkpoint(build_tiny_model(TinyModelConfig(), tok, seed=0), tok, str(path))
    assert AutoTokenizer.from_pretrained(path).chat_template == template  # it round-trips
    return str(path)


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("chat-policies")
    return {
        name: _policy(base / name, template)
        for name, template in (("chat", TEMPLATE), ("bos_chat", BOS_TEMPLATE), ("plain", None))
    }


def _spy_generate(model: Any, calls: list[list[list[int]]] | None = None) -> list[list[list[int]]]:
    """Record the prompt ids (padding removed) of every ``generate`` call on ``model``."""
    calls = [] if calls is None else calls
    original = model.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        calls.append([row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)])
        return original(*args, **kwargs)

    model.generate = generate
    return calls


def _fed_by_sampler(policy: str, setting: Any) -> Callable[[str], list[int]]:
    """The ids the transformers generation backend feeds the model for a prompt."""
    generator = TransformersGeneration(
        chat_template=setting, temperature=0.0, max_new_tokens=1, device="cpu"
    ).load(policy)
    calls = _spy_generate(generator.model)

    def fed(prompt: str) -> list[int]:
        generator.generate([prompt], n=1, seed=0)
        (row,) = calls[-1]
        return row

    return fed


@pytest.mark.parametrize(
    ("kind", "policy", "setting"),
    [
        *((kind, "chat", "auto") for kind in ("dpo", "sppo", "dpo_nll")),
        *((kind, "bos_chat", "auto") for kind in SOLVERS),
        ("dpo", "chat", "never"),
        ("dpo", "plain", "auto"),
    ],
)
def test_preference_rows_start_with_the_ids_generation_feeds(
    policies: dict[str, str], tmp_path: Path, kind: str, policy: str, setting: Any
) -> None:
    path = policies[policy]
    prompts, chosen, rejected = (list(c) for c in zip(*PAIRS, strict=True))
    config = SOLVERS[kind](effective_batch_size=len(PAIRS), chat_template=setting)
    trainer = build_trainer(config, path, prompts, chosen, rejected, str(tmp_path), 0)
    fed = _fed_by_sampler(path, setting)
    tok = AutoTokenizer.from_pretrained(path)
    rows: Any = trainer.train_dataset
    for i, (prompt, good, _) in enumerate(PAIRS):
        expected = fed(prompt)
        templated = policy != "plain" and setting != "never"
        # The template was applied, or not, as the generation setting says.
        assert (expected != tok(prompt)["input_ids"]) is templated
        if "prompt_ids" in rows.column_names:  # DPOTrainer
            assert rows[i]["prompt_ids"] == expected
            sequence = rows[i]["prompt_ids"] + rows[i]["chosen_ids"]
        else:  # CPO / ORPO
            assert rows[i]["prompt_input_ids"] == expected
            sequence = rows[i]["chosen_input_ids"]
        assert sequence[: len(expected)] == expected
        if templated:  # the rest is the answer's turn, as the template renders it
            turns = [{"role": "user", "content": prompt}, {"role": "assistant", "content": good}]
            conversation: Any = tok.apply_chat_template(turns)
            assert sequence == conversation["input_ids"]


def test_the_template_counts_against_the_prompt_cap(policies: dict[str, str], tmp_path: Path):
    path, long = policies["chat"], "12+" * 10 + "3="
    fed = _fed_by_sampler(path, "auto")
    overhead = len(fed(long)) - len(long)  # one token a character
    assert overhead > 0
    config = DPOSolverConfig(effective_batch_size=1, max_prompt_length=12)
    rows: Any = build_trainer(config, path, [long], ["9"], ["8"], str(tmp_path), 0).train_dataset
    # The prompt's last characters, templated as generation would template that text.
    assert rows[0]["prompt_ids"] == fed(long[-(12 - overhead) :])
    with pytest.raises(ConfigError, match="leaves no room for a prompt") as e:
        build_trainer(
            DPOSolverConfig(effective_batch_size=1, max_prompt_length=overhead),
            *(path, [long], ["9"], ["8"], str(tmp_path), 0),
        )
    assert e.value.field == "train.solver.max_prompt_length"
    assert f"above {overhead} tokens" in (e.value.hint or "")


def test_always_refuses_a_tokenizer_without_a_template(policies: dict[str, str], tmp_path: Path):
    config = DPOSolverConfig(effective_batch_size=1, chat_template="always")
    with pytest.raises(ConfigError, match="has no chat template") as e:
        build_trainer(config, policies["plain"], ["1+2="], ["3"], ["4"], str(tmp_path), 0)
    assert e.value.field == "train.solver.chat_template"


class Feed:
    """The online loop's seam over a creator of ``prompts`` (the plain baseline), recording what
    the reward function is handed."""

    def __init__(self, prompts: Sequence[str]):
        self.feed = CreatorFeed(Creator(list(prompts)))
        self.scored: list[tuple[list[str], list[Any], list[Any]]] = []
        self.finished: list[bool] = []

    def score(
        self,
        rows: Sequence[str],
        prompts: Sequence[Any],
        completions: Sequence[Any],
        finished: Sequence[bool] | None = None,
    ):
        self.scored.append((list(rows), list(prompts), list(completions)))
        self.finished += list(finished) if finished is not None else [True] * len(rows)
        return [float(j % 2) for j in range(len(rows))]  # every group has a signal


@pytest.mark.parametrize(
    ("kind", "setting"),
    [("rloo", "auto"), ("grpo", "auto"), ("online_dpo", "auto"), ("rloo", "never")],
)  # fmt: skip
def test_online_trainers_sample_from_the_ids_generation_feeds(
    policies: dict[str, str], tmp_path: Path, kind: Any, setting: Any
) -> None:
    path, prompts = policies["chat"], [p for p, _, _ in PAIRS]
    config = OnlineSolverConfig(
        kind=kind, learning_rate=1e-3, beta=0.1, num_generations=2, prompts_per_step=2,
        max_completion_length=3, device="cpu", chat_template=setting,
    )  # fmt: skip
    feed = Feed(prompts)
    trainer = build_online_trainer(config, path, feed, 1, str(tmp_path), 0)
    calls = _spy_generate(trainer.model)
    trainer.train()
    fed = _fed_by_sampler(path, setting)
    streamed = list(prompts)
    by_ids = {tuple(fed(p)): p for p in streamed}
    generated = [by_ids.get(tuple(row), row) for call in calls for row in call]
    # Every prompt the trainer sampled from is fed exactly as generation feeds it: the step's
    # two prompts, each num_generations times.
    first = [r["prompt"] for r in Creator(list(prompts)).draw(2)]  # the creator's first batch
    expected = [p for p in first for _ in range(2)]
    assert sorted(map(str, generated)) == sorted(expected)
    # The reward function is handed text, whatever form the trainer holds the prompts in.
    for _, texts, completions in feed.scored:
        assert all(isinstance(t, str) for t in [*texts, *completions])
        assert set(texts) <= set(streamed)


@pytest.mark.parametrize("kind", ["rloo", "grpo", "online_dpo"])
def test_online_trainers_tell_the_feed_which_completions_were_cut(
    policies: dict[str, str], tmp_path: Path, kind: Any
) -> None:
    # One new token: a completion finished only if that token ended its turn (eos, decoded to
    # ""); every other one was cut at max_completion_length. RLOO and GRPO mask the cut ones
    # with TRL's own option, on by default.
    path, prompts = policies["chat"], [p for p, _, _ in PAIRS]
    config = OnlineSolverConfig(
        kind=kind, learning_rate=1e-3, beta=0.1, num_generations=2, prompts_per_step=2,
        max_completion_length=1, device="cpu", temperature=2.0,
    )  # fmt: skip
    feed = Feed(prompts)
    trainer = build_online_trainer(config, path, feed, 2, str(tmp_path), 0)
    if kind != "online_dpo":
        assert trainer.args.mask_truncated_completions is True
    else:  # eva's auto ranks cut completions last; TRL's own constant stays off
        assert trainer.args.missing_eos_penalty is None
    trainer.train()
    completions = [c for _, _, cs in feed.scored for c in cs]
    assert len(feed.finished) == len(completions) == 2 * 4
    # Each step's share of cut completions is the one TRL logs for it.
    logged = [e for e in trainer.state.log_history if "loss" in e]
    key = "val/contain_eos_token" if kind == "online_dpo" else "completions/clipped_ratio"
    trl = [e[key] if kind != "online_dpo" else 1 - e[key] for e in logged]
    ours = [feed.finished[4 * k : 4 * k + 4].count(False) / 4 for k in range(2)]
    assert ours == pytest.approx(trl)
    if kind != "online_dpo":  # its two samples here both ran past the one token
        assert 0 < sum(ours) < 2  # some finished, some were cut


class CutPreferred(Feed):
    """A reward that prefers cut completions (5 against 0): the one case in which ranking by
    reward alone chooses a cut completion over a finished one."""

    def score(self, rows, prompts, completions, finished=None):  # type: ignore[no-untyped-def]
        super().score(rows, prompts, completions, finished)
        return [0.0 if f else 5.0 for f in (finished or [True] * len(rows))]


@pytest.mark.parametrize("penalty", ["auto", None])
def test_online_dpo_chooses_the_finished_completion_of_a_pair_by_default(
    policies: dict[str, str], tmp_path: Path, penalty: Any
) -> None:
    # TRL's online DPO pairs completion i with i + B of each batch and chooses the one it
    # compares higher. Spy on what it compares (the reward function it calls).
    config = OnlineSolverConfig(
        kind="online_dpo", learning_rate=1e-3, beta=0.1, prompts_per_step=4,
        max_completion_length=1, device="cpu", temperature=2.0, missing_eos_penalty=penalty,
    )  # fmt: skip
    feed = CutPreferred([p for p, _, _ in PAIRS])
    trainer = build_online_trainer(config, policies["chat"], feed, 4, str(tmp_path), 0)
    compared: list[list[float]] = []
    reward = trainer.reward_funcs[0]
    trainer.reward_funcs[0] = lambda **kw: compared.append(reward(**kw)) or compared[-1]
    recorded: list[float] = []  # what the creator is handed
    record = feed.feed.record
    feed.feed.record = lambda rows, values: recorded.extend(values) or record(rows, values)  # type: ignore[method-assign]
    trainer.train()
    chosen_cut = mixed = 0
    for k, values in enumerate(compared):
        finished = feed.finished[8 * k : 8 * k + 8]
        for i in range(4):
            a, b = (i, i + 4)
            if finished[a] != finished[b]:
                mixed += 1
                chosen = a if values[a] >= values[b] else b
                chosen_cut += not finished[chosen]
    assert mixed > 0  # the draw gave pairs of one finished and one cut completion
    if penalty == "auto":
        assert chosen_cut == 0
        # The creator is handed the reward itself, unshifted: 5 for each cut completion.
        assert recorded == [0.0 if f else 5.0 for f in feed.finished]
    else:
        assert chosen_cut == mixed  # by reward alone, the cut one of each mixed pair


def test_cut_ranks_last_lowers_cut_completions_by_the_span_plus_one() -> None:
    # Ids 9 end a turn. Finite rewards 1 and 3: span 2, so a cut completion loses 3; an
    # unscored one (None) and a NaN stay as they are; the wrapped reward sees every keyword.
    seen: dict[str, Any] = {}

    def reward(**kw: Any) -> list[Any]:
        seen.update(kw)
        return [1.0, None, 3.0, math.nan, 2.0]

    compared = cut_ranks_last(reward, [9])
    out = compared(completion_ids=[[4, 9], [4], [4, 5], [5], []], prompts=["p"] * 5)
    assert out[:3] == [1.0, None, 0.0] and math.isnan(out[3]) and out[4] == -1.0
    assert seen["prompts"] == ["p"] * 5 and compared.__name__ == "reward"


def _math_recipe() -> Any:
    pytest.importorskip("math_verify")
    path = Path(__file__).parents[1] / "infra" / "trl" / "grpo_math.py"
    spec = importlib.util.spec_from_file_location("grpo_math", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("flag", [None, "--no-chat"])
def test_math_recipe_samples_from_the_ids_generation_feeds(
    policies: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str | None
) -> None:
    recipe, path = _math_recipe(), policies["chat"]
    calls: list[list[list[int]]] = []
    base: Any = recipe.GRPOTrainer

    class Spied(base):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            _spy_generate(self.model, calls)

    monkeypatch.setattr(recipe, "GRPOTrainer", Spied)
    data = tmp_path / "math.jsonl"
    data.write_text("".join(f'{{"prompt": "{p}", "answer": "{c}"}}\n' for p, c, _ in PAIRS[:2]))
    recipe.main(
        [
            *("--model", path, "--prompts", str(data), "--out", str(tmp_path / "out")),
            *("--steps", "1", "--num-generations", "2"),
            *("--prompts-per-step", "2", "--max-completion-length", "2"),
            *([flag] if flag else []),
        ]
    )
    fed = _fed_by_sampler(path, "never" if flag == "--no-chat" else "auto")
    assert sorted(row for call in calls for row in call) == sorted(
        fed(p) for p, _, _ in PAIRS[:2] for _ in range(2)
    )


def test_math_recipe_chat_needs_a_template(
    policies: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "math.jsonl"
    data.write_text('{"prompt": "1+2=", "answer": "3"}\n')
    out = str(tmp_path / "out")
    with pytest.raises(SystemExit):
        _math_recipe().main(
            ["--model", policies["plain"], "--prompts", str(data), "--out", out, "--chat"]
        )
    assert "--chat: chat_template: always, but" in capsys.readouterr().err

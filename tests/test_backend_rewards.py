"""The reward backend union, the callable reward, and the vLLM pooling reward."""

from __future__ import annotations

import importlib.util
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from transformers import LlamaConfig, LlamaForSequenceClassification

from eva_runtime.errors import ConfigError
from eva_world import world
from eva_world.tiny_lm import build_char_tokenizer
from tasks.backends.protocols import RewardModel
from tasks.backends.python import PythonComponent
from tasks.backends.reward import RewardBackend
from tasks.backends.reward.function import CallableReward
from tasks.backends.reward.pairwise import PairwiseReward
from tasks.backends.reward.sequence_classifier import SequenceClassifierReward
from tasks.backends.reward.vllm_pooling import VLLMPoolingReward, VLLMPoolingScorer

ADAPTER: TypeAdapter[Any] = TypeAdapter(RewardBackend)


VERIFIER = {"kind": "python", "factory": "eva_world.components:WorldVerifier"}


class StageLike(BaseModel):
    reward: RewardBackend | None = Field(default=None)


# --- the union --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "cls"),
    [
        (VERIFIER, PythonComponent),
        (
            {"kind": "sequence_classifier", "model": "org/rm", "output": "score"},
            SequenceClassifierReward,
        ),
        ({"kind": "vllm_pooling", "model": "/ckpt"}, VLLMPoolingReward),
        ({"kind": "callable", "function": "eva_world.world:reward"}, CallableReward),
        (
            {"kind": "pairwise", "judge": {"llm": {"base_url": "http://h/v1", "model": "m"}}},
            PairwiseReward,
        ),
    ],
)
def test_dicts_validate_into_the_backend_their_kind_names(data: dict[str, Any], cls: type):
    backend = ADAPTER.validate_python(data)
    assert type(backend) is cls
    # A config round-trips through JSON (the stage hashes and stores model_dump(mode="json")).
    assert ADAPTER.validate_json(ADAPTER.dump_json(backend)) == backend
    assert type(StageLike.model_validate({"reward": data}).reward) is cls


def test_no_default_reward_and_unknown_kinds_fail_naming_the_choices():
    # The reward model is the user's to name (the run refuses none, tests/test_own_model.py).
    assert StageLike().reward is None
    with pytest.raises(ValidationError) as info:
        StageLike.model_validate({"reward": {"kind": "armo"}})
    message = str(info.value)
    assert "reward" in message and "'armo'" in message
    assert "'sequence_classifier'" in message and "'pairwise'" in message
    with pytest.raises(ValidationError, match="extra"):
        ADAPTER.validate_python({"kind": "sequence_classifier", "model": "m", "batch": 4})
    with pytest.raises(ValidationError, match="kind"):
        ADAPTER.validate_python({"model": "m"})


# --- callable ---------------------------------------------------------------------------------

EXACT = "tests.support.rewards:exact_match"


def test_a_pointwise_function_scores_every_response_with_its_kwargs():
    rm = CallableReward(function=EXACT, kwargs={"partial": 0.5}).load()
    assert isinstance(rm, RewardModel)
    seen: list[float] = []
    assert rm.score(["1+2=", "10+5="], [["3", "4", "7"], ["15"]], seen.append) == [
        [1.0, 0.5, 0.0],
        [1.0],
    ]
    assert seen == [0.5, 1.0] and rm.stats() == {"failures": 0}


def test_the_world_verifier_is_a_callable_reward_too():
    prompts = ["12+34=", "r:abc="]
    responses = [["64", "46", ""], ["cba", "cb"]]
    rm = CallableReward(function="eva_world.world:reward").load()
    expected = [[world.reward(p, r) for r in rs] for p, rs in zip(prompts, responses, strict=True)]
    assert rm.score(prompts, responses) == expected


def test_a_failing_response_is_nan_and_counted_but_all_failing_raises(
    caplog: pytest.LogCaptureFixture,
):
    rm = CallableReward(function=EXACT).load()
    with caplog.at_level(logging.WARNING):
        out = rm.score(["1+2=", "r:ab="], [["3", "three"], ["ba"]])
    assert out[0][0] == 1.0 and math.isnan(out[0][1]) and math.isnan(out[1][0])
    assert rm.stats() == {"failures": 2}
    assert "raised on 2 of 3 responses" in caplog.text and "ValueError" in caplog.text
    with pytest.raises(RuntimeError, match="raised on all 2 responses"):
        rm.score(["r:ab="], [["ba", "ab"]])
    assert rm.stats() == {"failures": 4}  # since load: the second call's two add to the first's


def test_none_means_unscorable_not_failed():
    rm = CallableReward(function="tests.support.rewards:unscorable").load()
    out = rm.score(["p"], [["?", "ok"]])
    assert math.isnan(out[0][0]) and out[0][1] == 1.0 and rm.stats()["failures"] == 0


def test_a_batched_function_is_called_once_and_its_shape_checked():
    rm = CallableReward(
        function="tests.support.rewards:exact_match_batch", batched=True, kwargs={"partial": 0.5}
    ).load()
    assert rm.score(["1+2=", "2+2="], [["3", "2"], ["5"]]) == [[1.0, 0.5], [0.5]]
    bad = CallableReward(function="tests.support.rewards:wrong_shape", batched=True).load()
    with pytest.raises(ValueError, match="shaped"):
        bad.score(["1+2="], [["3", "4"]])


@pytest.mark.parametrize(
    ("function", "error"),
    [
        ("tests.support.rewards.exact_match", "expected 'package.module:function'"),
        ("tests.support.nowhere:f", "cannot import module 'tests.support.nowhere'"),
        ("tests.support.rewards:missing", "has no attribute 'missing'"),
        ("tests.support.rewards:NOT_CALLABLE", "is a int, not a callable"),
    ],
)
def test_a_bad_function_path_fails_at_validation_naming_the_field(function: str, error: str):
    with pytest.raises(ValidationError) as info:
        ADAPTER.validate_python({"kind": "callable", "function": function})
    (problem,) = info.value.errors()
    assert problem["loc"][-1] == "function" and error in problem["msg"]


# --- vLLM pooling -----------------------------------------------------------------------------

HAS_VLLM = importlib.util.find_spec("vllm") is not None
TEMPLATE = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}{{ eos_token }}{% endfor %}"


def test_vllm_config_validates_without_vllm_and_load_explains_what_is_missing():
    config = VLLMPoolingReward(model="/ckpt")
    assert config.trust_remote_code is False
    if HAS_VLLM:
        pytest.skip("vLLM is installed here")
    with pytest.raises(ImportError, match="vllm_pooling needs vLLM"):
        config.load()


class _Classified:
    def __init__(self, value: float):
        self.outputs = type("Out", (), {"probs": [value]})()


class RecordingLLM:
    """Stands in for ``vllm.LLM`` on CPU: records what it is asked, echoes a length score."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.calls: list[tuple[list[dict[str, list[int]]], Any]] = []

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def classify(self, prompts: list[dict[str, list[int]]], *, pooling_params: Any, use_tqdm: bool):
        self.calls.append((prompts, pooling_params))
        return [_Classified(-float(len(p["prompt_token_ids"]))) for p in prompts]


def test_vllm_scorer_sends_template_token_ids_and_maps_results_back():
    tok = build_char_tokenizer(world.ALPHABET + "ua\n")
    tok.chat_template = TEMPLATE
    llm = RecordingLLM(tok)
    scorer = VLLMPoolingScorer(llm, "raw-params", VLLMPoolingReward(model="m", chunk_size=2))
    out = scorer.score(["1+2=", "r:ab="], [["3", "33"], ["ba" * 40]])
    # One token a character: "u:1+2=<eos>a:3<eos>" is 11; "u:r:ab=<eos>a:" + 80 + "<eos>" 91.
    assert out == [[-11.0, -12.0], [-91.0]]
    assert [len(c[0]) for c in llm.calls] == [2, 1] and all(c[1] == "raw-params" for c in llm.calls)
    first = llm.calls[0][0][0]["prompt_token_ids"]
    assert tok.decode(first) == "u:1+2=<eos>a:3<eos>"  # no extra bos in front of the template
    short = VLLMPoolingScorer(llm, None, VLLMPoolingReward(model="m", max_length=12))
    assert math.isnan(short.score(["1+2="], [["333"]])[0][0]) and short.stats() == {"too_long": 1}
    short.score(["1+2=", "4+4="], [["33333"], ["8", "88888"]])
    assert short.stats() == {"too_long": 3}  # since load: the second call's two add to the first's


def test_vllm_scorer_refuses_a_model_of_several_classes():
    class TwoClasses(RecordingLLM):
        def classify(self, prompts: list[Any], *, pooling_params: Any, use_tqdm: bool):
            answers = [_Classified(0.1) for _ in prompts]
            for a in answers:
                a.outputs.probs.append(0.9)
            return answers

    tok = build_char_tokenizer(world.ALPHABET + "ua\n")
    scorer = VLLMPoolingScorer(TwoClasses(tok), None, VLLMPoolingReward(model="two-heads"))
    with pytest.raises(ConfigError, match="two-heads returns 2 classes") as e:
        scorer.score(["1+2="], [["3"]])
    assert e.value.field == "annotate.reward.model" and "num_labels=1" in (e.value.hint or "")


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_VLLM and torch.cuda.is_available()), reason="needs vLLM and CUDA")
def test_vllm_gives_the_raw_logits_that_transformers_gives(tmp_path: Path):
    tok = build_char_tokenizer(world.ALPHABET + "ua\n")
    tok.chat_template = TEMPLATE
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        num_labels=1, pad_token_id=tok.pad_token_id, initializer_range=0.5,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    prompts, responses = ["1+2=", "r:abc="], [["3", "4", "12"], ["cba", "abc"]]
    hf = SequenceClassifierReward(model=str(tmp_path), dtype="float32").load()
    expected = hf.score(prompts, responses)
    # float32 runs FlexAttention, whose block map grows with the KV cache: at the default 0.9 of
    # an H200 it asked for 63 GiB more and the engine died (the lent H200 run).
    rm = VLLMPoolingReward(
        model=str(tmp_path), dtype="float32", max_length=256, gpu_memory_utilization=0.05
    )
    got = rm.load().score(prompts, responses)
    flat_expected = [x for row in expected for x in row]
    assert [x for row in got for x in row] == pytest.approx(flat_expected, abs=1e-3)
    assert any(not 0.0 <= x <= 1.0 for x in flat_expected)  # a sigmoid would have squashed these


# --- the annotate stage: an unscorable or signal-free batch is said where it happens ----------


def _annotate(tmp_path: Path, reward: dict[str, Any], responses: list[list[str]], **cfg: Any):
    import pyarrow as pa

    from eva_core.schema import seed_records
    from tasks.annotate import AnnotateConfig, annotate
    from tasks.context import RunContext, StageContext

    run = RunContext(root=str(tmp_path), run="t", seed=0)
    ctx = StageContext(run, 1, "annotate", 0, {}, str(tmp_path), run.store(), lambda _: None)
    prompts = ["1+2=", "3+4=", "5+6=", "7+1="][: len(responses)]
    rollouts = seed_records(prompts).append_column(
        "responses", pa.array(responses, pa.list_(pa.string()))
    )
    finished = [[True] * len(rs) for rs in responses]
    rollouts = rollouts.append_column("finished", pa.array(finished, pa.list_(pa.bool_())))
    return annotate.fn(ctx, AnnotateConfig.model_validate({"reward": reward, **cfg}), rollouts)


def test_rewards_beyond_what_float64_gaps_survive_are_one_line_naming_the_first(tmp_path: Path):
    from tasks.stage import StageError

    huge = {"kind": "callable", "function": "tests.support.rewards:huge"}
    with pytest.raises(StageError) as refused:
        _annotate(tmp_path, huge, [["7", "7"], ["2", "12"]])
    line = refused.value.line()
    assert line.startswith(
        "annotate.reward: annotate: reward -1e+308 (prompt 0, response 0; 4 such): rewards "
    )
    assert "within ±1e+150" in line and "scale the reward" in line


def test_a_stage_that_fails_on_unscored_items_says_what_its_backend_counted() -> None:
    from tasks.context import check_failures
    from tasks.stage import StageError

    counts = {"responses": 0, "checker_failures": 8, "no_instructions": 0}
    with pytest.raises(StageError) as refused:
        check_failures("annotate", 2, 2, "all rewards NaN (unscored)", 0.5, "m", counts=counts)
    assert str(refused.value).startswith(
        "annotate: all rewards NaN (unscored) for 2 of 2 (the backend counted checker_failures "
        "8), more than m = 0.5 allows"
    )
    check_failures("annotate", 1, 2, "all rewards NaN (unscored)", 0.5, "m", counts=counts)


def test_annotate_fails_when_most_prompts_are_unscored_and_counts_the_rest(tmp_path: Path):
    from tasks.stage import StageError

    nothing = {"kind": "callable", "function": "tests.support.rewards:unscorable"}
    with pytest.raises(StageError, match=r"all rewards NaN \(unscored\) for 4 of 4"):
        _annotate(tmp_path, nothing, [["?", "?"]] * 4)  # "?" cannot be scored
    # One prompt in four unscored is counted, and the run goes on.
    out = _annotate(tmp_path, nothing, [["?", "?"], ["7", "7"], ["?", "1"], ["8", "1"]])
    assert out.stats["unscored_prompts"] == 1 and out.stats["tied_prompts"] == 3
    with pytest.raises(StageError, match="no preference signal"):
        _annotate(tmp_path, VERIFIER, [["3", "3"], ["7", "7"]], fail_on_no_signal=True)

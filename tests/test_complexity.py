"""Stage ``complexity``: the world's exact difficulty (a judge plugged in by import path), and the
LLM judge over a real local OpenAI-compatible server (answers parsed, failures unscored rather
than fatal)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eva_core.schema import seed_records
from tasks.backends.evolve.judge import JUDGE_TEMPLATE, LLMComplexityJudge, parse_judgement
from tasks.complexity import COMPLEXITY_COLUMNS, ComplexityConfig, complexity
from tasks.context import RunContext, StageContext, StageOutput
from tests.support.openai_server import OpenAICompatibleServer

WORLD = {"kind": "python", "factory": "eva_world.components:WorldDifficulty"}


def run_stage(tmp_path: Path, config: ComplexityConfig, prompts: list[str]) -> StageOutput:
    run = RunContext(root=str(tmp_path), run="t", seed=0)
    fractions: list[float] = []
    ctx = StageContext(run, 1, "complexity", 0, {}, str(tmp_path), run.store(), fractions.append)
    out = complexity.fn(ctx, config, prompts=seed_records(prompts))
    assert fractions and fractions[-1] == 1.0
    assert out.table.column_names == list(COMPLEXITY_COLUMNS)
    return out


def nan_to_none(values: list[float]) -> list[float | None]:
    return [None if math.isnan(v) else v for v in values]


def test_world_difficulty_needs_no_llm(tmp_path: Path):
    # digits + 2 per operand beyond the second (add/sub); string length (rev); NaN otherwise.
    prompts = ["12+34=", "1+2+3=", "53-17=", "r:abcd=", "123+4567+89+1=", "hello"]
    out = run_stage(
        tmp_path, ComplexityConfig.model_validate({"judge": WORLD, "chunk": 4}), prompts
    )
    assert nan_to_none(out.table.column("complexity").to_pylist()) == [4, 5, 4, 4, 14, None]
    assert all(math.isnan(q) for q in out.table.column("quality").to_pylist())
    assert out.stats["mean_complexity"] == round((4 + 5 + 4 + 4 + 14) / 5, 4)
    assert out.stats["mean_quality"] is None and out.stats["unscored"] == 1
    assert out.ui_tables["most-complex"][0] == {
        "prompt": "123+4567+89+1=", "complexity": 14.0, "quality": None,
    }  # fmt: skip


def test_llm_judge_over_http(tmp_path: Path):
    def judge(prompt: str, index: int, request: dict[str, Any]) -> str:
        if "broken" in prompt:
            return "I cannot rate this."
        return "Complexity: 7\nQuality: 8"

    def fail(request: dict[str, Any]) -> tuple[str, float] | None:
        return ("status", 500) if "server error" in str(request) else None

    prompts = ["Explain tides.", "a broken prompt", "Prove Fermat's last theorem.", "server error"]
    with OpenAICompatibleServer(judge, fail) as server:
        llm = {"base_url": server.base_url, "model": "tiny", "max_retries": 0}
        config = ComplexityConfig.model_validate({"judge": {"kind": "llm", "llm": llm}})
        assert isinstance(config.judge, LLMComplexityJudge)
        out = run_stage(tmp_path, config, prompts)
    assert nan_to_none(out.table.column("complexity").to_pylist()) == [7, None, 7, None]
    assert nan_to_none(out.table.column("quality").to_pylist()) == [8, None, 8, None]
    assert out.stats["mean_complexity"] == 7 and out.stats["mean_quality"] == 8
    # 4 requests, no retries (max_retries 0), 1 failure; 1 + 1 tokens for each of 3 answers.
    assert out.stats["unscored"] == 2 and out.stats["backend"] == {
        "requests": 4, "retries": 0, "failures": 1, "prompt_tokens": 3, "completion_tokens": 3,
    }  # fmt: skip
    assert all(r["body"]["temperature"] == 0.0 for r in server.requests)  # it does not sample
    sent = sorted(r["body"]["messages"][-1]["content"] for r in server.requests)
    assert sent == sorted(JUDGE_TEMPLATE.format(prompt=p) for p in prompts)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("Complexity: 7\nQuality: 8", (7.0, 8.0)),
        ("**Complexity**: 6/10\n**Quality**: 9/10", (6.0, 9.0)),
        ("complexity score = 3.5, quality rating: 10", (3.5, 10.0)),
        ("Complexity: 11\nQuality: 0", (None, None)),  # out of range
        ("Quality: 5", (None, 5.0)),
        ("", (None, None)),
    ],
)
def test_parse_judgement(answer: str, expected: tuple[float | None, float | None]):
    assert tuple(nan_to_none(list(parse_judgement(answer)))) == expected


def test_empty_prompt_set(tmp_path: Path):
    run = RunContext(root=str(tmp_path), run="t", seed=0)
    ctx = StageContext(run, 1, "complexity", 0, {}, str(tmp_path), run.store(), lambda _: None)
    empty = seed_records(["x"]).slice(0, 0)
    out = complexity.fn(ctx, ComplexityConfig.model_validate({"judge": WORLD}), prompts=empty)
    assert out.table.num_rows == 0 and out.stats["mean_complexity"] is None
    assert isinstance(out.table, pa.Table)


def test_llm_judge_stops_on_configuration_errors(tmp_path: Path):
    with OpenAICompatibleServer(fail=lambda r: ("status", 401)) as server:
        llm = {"base_url": server.base_url, "model": "tiny"}
        config = ComplexityConfig.model_validate({"judge": {"kind": "llm", "llm": llm}})
        with pytest.raises(RuntimeError, match="HTTP 401"):
            run_stage(tmp_path, config, ["Explain tides."])
        assert len(server.requests) == 1  # a 401 is not retried

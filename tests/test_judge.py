"""The evaluation judge against a real local OpenAI-compatible server that answers scripted
verdicts: both orders, ties, position bias, garbage verdicts, a dead judge, what it costs, and
where the reference answers come from."""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eva_core.schema import prompt_id, seed_records
from eva_runtime.errors import ConfigError
from eva_runtime.llm_retry import LLMEndpointDown
from tasks.backends.judge.llm import JudgeConfig
from tasks.context import RunContext, StageContext
from tasks.judge import judge
from tasks.reference import reference
from tasks.stage import StageError
from tests.support.openai_server import judging, world_answer

PROMPTS = ["1+2=", "3+4=", "5+6=", "7+1="]
CATEGORIES = ["add", "add", "add", "sum"]
TRUTH = {"1+2=": "3", "3+4=": "7", "5+6=": "11", "7+1=": "8"}


def _ctx(tmp_path: Path, artifact: str = "judge") -> StageContext:
    run = RunContext(root=str(tmp_path), run="t", seed=0)
    return StageContext(run, 1, artifact, 5, {}, str(tmp_path), run.store(), lambda _: None)


def _config(url: str, **overrides: Any) -> JudgeConfig:
    llm = {"base_url": url, "model": "judge", "max_retries": 0, "backoff_s": 0.0,
           **overrides.pop("llm", {})}  # fmt: skip
    data = {"llm": llm, "reference": {"kind": "file", "path": "unused.jsonl"}, **overrides}
    return JudgeConfig.model_validate(data).without_reference()


def _tables(responses: list[str], references: list[str | None]) -> tuple[pa.Table, pa.Table]:
    evaluated = seed_records(PROMPTS, CATEGORIES).append_column("response", pa.array(responses))
    known = [(prompt_id(p), r) for p, r in zip(PROMPTS, references, strict=True) if r is not None]
    answers = pa.table({"prompt_id": [k for k, _ in known], "reference": [r for _, r in known]})
    return evaluated, answers


def _judged(tmp_path: Path, config: JudgeConfig, responses, references):
    evaluated, answers = _tables(responses, references)
    return judge.fn(_ctx(tmp_path), config, evaluated, answers)


def fair(prompt: str, a: str, b: str) -> str:
    """A judge that knows the answers: the right one wins, two right or two wrong tie."""
    right_a, right_b = a.rstrip(".") == TRUTH[prompt], b.rstrip(".") == TRUTH[prompt]
    return (
        "Final verdict: [[A=B]]" if right_a == right_b else ("[[A>B]]" if right_a else "[[B>>A]]")
    )


def test_both_orders_are_asked_and_a_fair_judge_scores_wins_ties_and_losses(tmp_path, serve):
    server = serve(respond=judging(fair))
    # Right vs wrong (win), wrong vs right (loss), both wrong (tie), both right but worded
    # differently (tie).
    out = _judged(tmp_path, _config(server.base_url), ["3", "0", "12", "8"],
                  ["x", "7", "10", "8."])  # fmt: skip
    rows = out.table.to_pylist()
    assert [r["score"] for r in rows] == [1.0, 0.0, 0.5, 0.5]
    assert [(r["verdict_policy_as_a"], r["verdict_policy_as_b"]) for r in rows][:2] == [
        ("A>B", "B>>A"), ("B>>A", "A>B"),
    ]  # fmt: skip
    # Every prompt twice: the policy's answer first, then the reference's.
    asked = [json.loads(json.dumps(b["messages"])) for b in server.bodies]
    assert len(asked) == 8
    firsts = [m[-1]["content"] for m in asked]
    assert sum("Assistant A's Answer|>\n3\n" in c for c in firsts) == 1
    assert sum("Assistant B's Answer|>\n3\n" in c for c in firsts) == 1
    assert all(m[0]["role"] == "system" and "[[A>>B]]" in m[0]["content"] for m in asked)
    stats = out.stats
    assert stats["win_rate"] == 0.5 and stats["judged"] == 4 and stats["unjudged"] == 0
    assert stats["ci_low"] <= 0.5 <= stats["ci_high"] and stats["confidence"] == 0.95
    assert stats["ties"] == 4 and stats["consistent"] == 1.0
    assert stats["verdicts"] == {"A>>B": 0, "A>B": 2, "A=B": 4, "B>A": 0, "B>>A": 2,
                                 "unparseable": 0}  # fmt: skip
    assert stats["per_category"] == {"add": 0.5, "sum": 0.5}
    assert stats["per_category_low"]["sum"] == stats["per_category_high"]["sum"] == 0.5
    # Its cost, counted as every stage's: requests, tokens, failures.
    assert stats["backend"]["requests"] == 8 and stats["backend"]["failures"] == 0
    assert stats["backend"]["prompt_tokens"] == 8 and stats["backend"]["completion_tokens"] == 8
    assert stats["comparisons"] == 8 and stats["failed"] == 0
    # The UI's table: the verdicts, then both answers side by side.
    shown = out.ui_tables["verdicts"]
    assert shown[0]["response"] == "3" and shown[0]["reference"] == "x"
    assert shown[0]["verdict_policy_as_a"] == "A>B" and len(shown) == 4


def test_a_judge_biased_to_one_position_gives_one_half(tmp_path, serve) -> None:
    for label in ("A>B", "B>>A"):  # always the first answer, then always the second
        server = serve(respond=judging(lambda p, a, b, label=label: f"[[{label}]]"))
        out = _judged(tmp_path, _config(server.base_url), ["3", "0", "12", "8"],
                      ["x", "7", "10", "9"])  # fmt: skip
        assert [r["score"] for r in out.table.to_pylist()] == [0.5] * 4
        assert out.stats["win_rate"] == 0.5 and out.stats["consistent"] == 0.0


def test_unparseable_verdicts_are_counted_and_left_out(tmp_path, serve) -> None:
    def garbage_sometimes(prompt: str, a: str, b: str) -> str:
        if prompt == "1+2=":
            return "Both are fine, I cannot decide."  # no verdict in either order
        if prompt == "3+4=" and a == "7":  # the policy's answer first: a label off the scale
            return "[[A<B]]"
        return fair(prompt, a, b)

    server = serve(respond=judging(garbage_sometimes))
    out = _judged(tmp_path, _config(server.base_url), ["3", "7", "12", "8"],
                  ["x", "6", "11", "8."])  # fmt: skip
    rows = out.table.to_pylist()
    assert math.isnan(rows[0]["score"]) and rows[0]["verdict_policy_as_a"] is None
    assert rows[0]["judgment_policy_as_a"] == "Both are fine, I cannot decide."
    assert rows[1]["score"] == 1.0  # the one parseable game counts
    assert out.stats["unparseable"] == 3 and out.stats["unjudged"] == 1
    # Judged: a win (1.0), a loss (0.0) and a tie (0.5); the unjudged prompt is left out.
    assert out.stats["judged"] == 3 and out.stats["win_rate"] == 0.5
    assert out.stats["verdicts"]["unparseable"] == 3


def test_a_judge_that_answers_only_garbage_fails_the_stage_in_one_line(tmp_path, serve):
    server = serve(respond=judging(lambda p, a, b: "A is better"))
    with pytest.raises(StageError) as failed:
        _judged(tmp_path, _config(server.base_url), ["3", "0", "12", "8"], ["x", "7", "1", "9"])
    line = failed.value.line()
    assert line.startswith("evaluate.judge.max_unjudged_share: judge: 4 of 4 prompts got no ")
    assert "8 unparseable verdicts" in line and "[[A>B]]" in line and "\n" not in line


def test_identical_answers_tie_without_a_request_and_uncovered_prompts_are_counted(
    tmp_path, serve
) -> None:
    server = serve(respond=judging(fair))
    out = _judged(tmp_path, _config(server.base_url), ["3", "7", "12", "8"],
                  ["3", None, "11", None])  # fmt: skip
    rows = out.table.to_pylist()
    assert rows[0]["identical"] and rows[0]["score"] == 0.5
    assert rows[1]["reference"] is None and math.isnan(rows[1]["score"])
    assert len(server.requests) == 2  # only the third prompt, in both orders
    assert out.stats["identical"] == 1 and out.stats["no_reference"] == 2
    assert out.stats["win_rate"] == 0.25 and out.stats["unjudged"] == 0  # (0.5 + 0) / 2


def test_a_dead_judge_fails_the_stage_in_one_line_naming_it(tmp_path, serve) -> None:
    server = serve(fail=lambda request: ("status", 503))
    one_at_a_time = _config(server.base_url, llm={"concurrency": 1})
    with pytest.raises(LLMEndpointDown) as down:
        _judged(tmp_path, one_at_a_time, ["3", "0", "12", "8"], ["x", "7", "1", "9"])
    line = down.value.line()
    assert line.startswith(f"llm.base_url: {server.base_url} is down or refuses every request")
    assert "HTTP 503" in line and "\n" not in line
    assert len(server.requests) == 3  # the breaker stopped it after 3 of 8 comparisons


def test_a_judge_the_endpoint_does_not_serve_stops_at_once(tmp_path, serve) -> None:
    from tests.support.openai_server import Step

    server = serve(Step(status=404), respond=judging(fair))
    with pytest.raises(Exception, match="HTTP 404"):
        _judged(tmp_path, _config(server.base_url, llm={"concurrency": 1}), ["3", "0", "12", "8"],
                ["x", "7", "1", "9"])  # fmt: skip
    assert len(server.requests) == 1  # a 404 every request would hit: nothing more is sent


# --- the reference answers -------------------------------------------------------------------


def _heldout() -> pa.Table:
    return seed_records(PROMPTS, CATEGORIES)


def test_references_from_a_file_match_prompts_ignoring_spacing_and_case(tmp_path) -> None:
    from tasks.backends.judge.reference import FileReference

    path = tmp_path / "ref.jsonl"
    rows = [{"q": " 1+2= ", "a": "3"}, {"q": "3+4=", "a": [{"content": "7"}]}, {"q": "x", "a": "y"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = FileReference(path=str(path), prompt_column="q", answer_column="a")
    out = reference.fn(_ctx(tmp_path, "reference"), source, _heldout())
    assert out.table.column("reference").to_pylist() == ["3", "7"]
    assert out.stats["references"] == 2 and out.stats["missing"] == 2

    path.write_text(json.dumps({"q": "nothing held out", "a": "y"}) + "\n")
    with pytest.raises(StageError, match="no reference answer to any of the 4"):
        reference.fn(_ctx(tmp_path, "reference"), source, _heldout())
    path.write_text(
        json.dumps({"q": "1+2=", "a": "3"}) + "\n" + json.dumps({"q": "1+2=", "a": "4"})
    )
    with pytest.raises(ValueError, match="row 1 gives a second, different answer"):
        reference.fn(_ctx(tmp_path, "reference"), source, _heldout())


def test_references_from_a_column_of_the_heldout_file(tmp_path) -> None:
    from tasks.backends.judge.reference import ColumnReference, for_heldout
    from tasks.prompts import PromptsConfig

    path = tmp_path / "heldout.jsonl"
    path.write_text("".join(json.dumps({"turns": [p], "gpt4": TRUTH[p]}) + "\n" for p in PROMPTS))
    heldout = PromptsConfig(path=str(path), prompt_column="turns")
    source = for_heldout(ColumnReference(column="gpt4"), heldout)
    out = reference.fn(_ctx(tmp_path, "reference"), source, _heldout())
    assert out.table.column("reference").to_pylist() == [TRUTH[p] for p in PROMPTS]
    with pytest.raises(ValueError, match="has no column 'gpt5'"):
        for_heldout(ColumnReference(column="gpt5"), heldout).check()
    with pytest.raises(ValueError, match="needs a held-out file or dataset"):
        ColumnReference(column="gpt4").check()
    # The file's bytes key the stage: an edited answer makes a new reference.
    before = source.origin_key()
    path.write_text(path.read_text().replace('"gpt4": "3"', '"gpt4": "three"'))
    assert source.origin_key() != before


def test_references_generated_once_by_a_named_model_over_http(tmp_path, serve) -> None:
    from tasks.backends.judge.reference import GeneratedReference

    server = serve(respond=world_answer, model="gpt-4-0314")
    source = GeneratedReference.model_validate({
        "model": "gpt-4-0314",
        "generation": {"kind": "openai", "temperature": 0.0, "llm": {"base_url": server.base_url}},
    })  # fmt: skip
    out = reference.fn(_ctx(tmp_path, "reference"), source, _heldout())
    assert out.table.column("reference").to_pylist() == [TRUTH[p] for p in PROMPTS]
    assert {b["model"] for b in server.bodies} == {"gpt-4-0314"}
    assert out.stats["backend"]["requests"] == 4 and out.stats["source"] == "generate"
    # Each answers call loads the model anew; the counts since load add every call's up.
    answers = source.load()
    answers.answers(PROMPTS[:3], seed=0)
    answers.answers(PROMPTS[3:], seed=0)
    assert answers.stats()["requests"] == 4 and answers.stats()["failures"] == 0


# --- the edge --------------------------------------------------------------------------------


def _run_config(tmp_path: Path, llm: dict[str, Any], ref: dict[str, Any] | None = None):
    from flows.config import validate_config
    from tests.conftest import tiny_run_config

    cfg = tiny_run_config(str(tmp_path / "runs"))
    ref = ref or {"kind": "generate", "model": "m", "generation": {"kind": "openai"}}
    cfg["evaluate"] = {**cfg["evaluate"], "judge": {"llm": llm, "reference": ref}}
    return validate_config(cfg)


def test_the_edge_refuses_a_judge_it_cannot_reach_or_an_unset_key(
    tmp_path, monkeypatch, serve, capsys
):
    from flows.inputs import check_inputs

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    with pytest.raises(ConfigError) as refused:
        check_inputs(_run_config(tmp_path, {"base_url": url, "model": "judge"}))
    line = refused.value.line()
    assert line.startswith(f"evaluate.judge.llm.base_url: {url} cannot be reached (ConnectError")
    assert line.endswith("(start the judge's server, or set it to an OpenAI-compatible endpoint "
                         "that answers)") and "\n" not in line  # fmt: skip
    assert not (tmp_path / "runs").exists()

    monkeypatch.delenv("EVA_TEST_JUDGE_KEY", raising=False)
    keyed = {"base_url": url, "model": "judge", "api_key_env": "EVA_TEST_JUDGE_KEY"}
    with pytest.raises(ConfigError) as refused:
        check_inputs(_run_config(tmp_path, keyed))
    assert refused.value.line().startswith(
        "evaluate.judge.llm.api_key_env: environment variable EVA_TEST_JUDGE_KEY is unset"
    )

    # One that answers passes; a reference file that is not there is refused.
    server = serve(respond=judging(fair))
    live = {"base_url": server.base_url, "model": "tiny"}
    check_inputs(_run_config(tmp_path, live))
    assert "eva: warning" not in capsys.readouterr().err
    # One that does not list the model asked for is a warning: a proxy may serve more.
    check_inputs(_run_config(tmp_path, {**live, "model": "gpt-x"}))
    assert capsys.readouterr().err.strip() == (
        f"eva: warning: evaluate.judge.llm.model: {server.base_url} lists no model 'gpt-x' (it "
        "lists tiny); a request for it may be refused"
    )
    missing = {"kind": "file", "path": str(tmp_path / "nope.jsonl")}
    with pytest.raises(ConfigError, match=r"evaluate.judge.reference.path: .*nope.jsonl: cannot"):
        check_inputs(_run_config(tmp_path, live, missing))


@pytest.mark.parametrize("status", [401, 403, 503])
def test_the_edge_refuses_a_judge_that_refuses_the_key_without_echoing_it(
    tmp_path, monkeypatch, serve, status
):
    """The probe's refusal names the status and what to do; the server's message echoes the
    key it was sent, and the line the user sees does not."""
    from flows.inputs import check_inputs

    server = serve(models_status=status)
    bare = {"base_url": server.base_url, "model": "tiny"}
    with pytest.raises(ConfigError) as refused:
        check_inputs(_run_config(tmp_path, bare))
    line = refused.value.line()
    what = "answers no model" if status == 503 else "refuses the key"
    assert line.startswith(f"evaluate.judge.llm.base_url: {server.base_url} {what} (HTTP {status}")
    hint = "set evaluate.judge.llm.api_key_env" if status < 500 else "start the judge's server"
    assert hint in line and "\n" not in line

    monkeypatch.setenv("EVA_TEST_JUDGE_KEY", "sk-not-for-logs-0123456789")
    keyed = {**bare, "api_key_env": "EVA_TEST_JUDGE_KEY"}
    with pytest.raises(ConfigError) as refused:
        check_inputs(_run_config(tmp_path, keyed))
    line = refused.value.line()
    # The server echoed the key it was sent; the line shows where, not what.
    assert "[redacted]" in line and "sk-not-for-logs" not in line
    if status < 500:
        assert line.endswith("(check the key in EVA_TEST_JUDGE_KEY)")
    assert not (tmp_path / "runs").exists()


def test_a_judge_is_off_by_default_and_leaves_the_evaluate_key_as_it_was(tmp_path) -> None:
    from flows.config import validate_config
    from tasks.evaluate import EvaluateConfig
    from tests.conftest import tiny_run_config

    plain = validate_config(tiny_run_config(str(tmp_path)))
    from tasks.keys import keyed_config

    assert plain.evaluate.judge is None and "judge" not in keyed_config(plain.evaluate)
    judged = _run_config(tmp_path, {"model": "judge"})
    # The evaluate stage runs without the judge: its config, and so its key, is the plain one.
    assert judged.evaluation.without_judge() == plain.evaluation
    assert isinstance(judged.evaluation.without_judge(), EvaluateConfig)
    # The judge stage's config leaves out how the reference was made (that is keyed upstream).
    stage_config = judged.evaluate.judge.without_reference()
    assert "reference" not in stage_config.model_dump()


# --- the recipes -----------------------------------------------------------------------------

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("name", ["base", "dpo", "simpo", "orpo", "sppo", "online-rloo"])
def test_the_paper_recipes_judge_as_arena_hard_does(name: str) -> None:
    from flows.config import OnlineRunConfig, RunConfig, load_config

    model = OnlineRunConfig if name.startswith("online") else RunConfig
    judged = load_config(str(CONFIGS / "paper" / f"{name}.yaml"), None, model).evaluate.judge
    assert judged is not None and judged.llm.model == "gpt-4-1106-preview"
    assert judged.llm.api_key_env == "OPENAI_API_KEY"
    assert (judged.temperature, judged.max_tokens) == (0.0, 4096)  # Arena-Hard's settings
    ref = judged.reference
    assert ref.kind == "generate" and ref.model == "gpt-4-0314"
    assert ref.generation.kind == "openai" and ref.generation.temperature == 0.0


def test_the_own_model_recipe_carries_a_judge_block_to_uncomment() -> None:
    import yaml

    text = (CONFIGS / "own-model.yaml").read_text()
    start = text.index("  # judge:")
    block = [line for line in text[start:].splitlines() if line.startswith("  #")]
    data = yaml.safe_load("\n".join(line.replace("  # ", "  ", 1) for line in block))
    judged = JudgeConfig.model_validate(data["judge"])
    assert judged.reference.kind == "generate" and judged.llm.model


# --- the summary and the charts --------------------------------------------------------------


def _row(name: Any, rate: float, low: float, high: float, **per: list) -> dict[str, Any]:
    detail = {"model": "judge-m", "confidence": 0.9, "judged": 4, "unjudged": 0,
              "unparseable": 0, "failed": 0, "per_category": per}  # fmt: skip
    return {"iteration": name, "heldout_score": 0.5, "judge_win_rate": rate,
            "judge_interval": [low, high], "judge_detail": detail}  # fmt: skip


def test_the_summary_prints_the_win_rate_its_interval_and_each_category() -> None:
    from flows.summary import summary_markdown, summary_table

    rows = [_row("theta_0", 0.25, 0.1, 0.4, add=[0.25, 0.1, 0.4]),
            _row(1, 0.5, 0.3, 0.7, add=[0.5, 0.3, 0.7])]  # fmt: skip
    rows[1]["judge_detail"]["unjudged"] = 2
    text = summary_table(rows).splitlines()
    assert text[0].split()[-2:] == ["judge_win_rate", "judge_interval"]
    assert text[1].endswith("0.250  [0.100, 0.400]") and text[2].endswith("0.500  [0.300, 0.700]")
    assert text[3].startswith("judge_win_rate: judge-m's verdicts") and "90% bootstrap" in text[3]
    assert text[4].startswith("judge, iteration 1: 2 prompts without a usable verdict")
    assert text[5:] == [
        "judge win rate per category:",
        "category               theta_0                     1",
        "     add  0.250 [0.100, 0.400]  0.500 [0.300, 0.700]",
    ]
    markdown = summary_markdown("r", rows)
    heldout = (
        "| iteration | heldout_score | heldout_solved | heldout_truncated | answers_changed "
        "| win_vs_theta_0 |"
    )
    assert f"{heldout} judge_win_rate | judge_interval |" in markdown
    assert "| add | 0.250 [0.100, 0.400] | 0.500 [0.300, 0.700] |" in markdown
    # Without a judge the summary is what it always was.
    plain = [{k: v for k, v in r.items() if not k.startswith("judge")} for r in rows]
    assert "judge" not in summary_table(plain) and "judge" not in summary_markdown("r", plain)


def test_the_charts_draw_the_interval_as_error_bars() -> None:
    from flows.judged import judge_charts

    rows = [_row("theta_0", 0.25, 0.1, 0.4, add=[0.25, 0.1, 0.4]),
            _row(1, 0.5, 0.3, 0.9, add=[0.5, 0.3, 0.9])]  # fmt: skip
    (_, overall), (_, per_category) = judge_charts(rows, "iteration", "it", "iteration")
    assert overall is not None and per_category is not None
    assert overall.bands == {"judge win rate": [(0, 0.1, 0.4), (1, 0.3, 0.9)]}
    assert overall.y.hi >= 0.9 and overall.y.lo <= 0.1  # the axis holds the intervals
    assert overall.svg().count('stroke-width="1.5"') == 6  # a bar and two caps per checkpoint
    assert list(per_category.series) == ["add"]
    assert judge_charts([{"iteration": "theta_0"}], "iteration", "it", "iteration") == []

"""`eva run` with an evaluation judge, on the built-in world: the reference answers generated once
by a named model, every checkpoint judged against them by an LLM judge (both local
OpenAI-compatible servers), the win rate with its interval printed per checkpoint, the verdicts
in the Prefect UI; and a judge that does not answer refused before anything runs."""

from __future__ import annotations

import json
import socket

import pytest
import yaml

from eva_world import world
from flows.cli import main
from tasks.store import RunStore
from tests.conftest import tiny_run_config
from tests.support.openai_server import OpenAICompatibleServer, judging, world_answer

pytestmark = pytest.mark.usefixtures("prefect_api")


def knows_the_answers(prompt: str, a: str, b: str) -> str:
    """A judge that knows the world's answers: the right answer wins, two right or two wrong
    tie; it says so at the end of a judgment, as Arena-Hard's judge is asked to."""
    truth = world.solve(prompt)
    right_a, right_b = a.strip() == truth, b.strip() == truth
    if right_a == right_b:
        return "Both answers are equally good. My final verdict is tie: [[A=B]]"
    return "My final verdict is: " + ("[[A>>B]]" if right_a else "[[B>A]]")


def half_right(prompt: str, index: int, request: dict) -> str:
    """A reference model that answers every other prompt (by length) right, and the rest "?"."""
    return world_answer(prompt, index, request) if len(prompt) % 2 else "?"


def _judge(judge_url: str, reference_url: str) -> dict:
    """The judge section: a judge, and a reference model generating its answers over HTTP."""
    return {
        "llm": {"base_url": judge_url, "model": "gpt-4-1106-preview"},
        "reference": {
            "kind": "generate",
            "model": "gpt-4-0314",
            "generation": {
                "kind": "openai",
                "temperature": 0.0,
                "max_tokens": 16,
                "llm": {"base_url": reference_url},
            },
        },
        "bootstrap_rounds": 200,
    }


def _config(tmp_path, judge_url: str, reference_url: str) -> str:
    cfg = tiny_run_config(str(tmp_path), run="judged")
    cfg["evaluate"]["judge"] = _judge(judge_url, reference_url)
    path = tmp_path / "judged.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_eva_run_prints_the_judge_win_rate_with_its_interval_per_checkpoint(tmp_path, capsys):
    with (
        OpenAICompatibleServer(half_right, model="gpt-4-0314") as reference,
        OpenAICompatibleServer(judging(knows_the_answers)) as judge,
    ):
        path = _config(tmp_path, judge.base_url, reference.base_url)
        assert main(["run", "--config", path]) == 0
        out = capsys.readouterr().out
        generated = len(reference.requests)
        judged = len(judge.requests)

        store = RunStore(str(tmp_path), "judged")
        answers = store.read_manifest(None, "reference")
        assert answers["stats"]["references"] == 24 and generated == 24  # once, one a prompt
        lines = out.splitlines()
        header = next(line for line in lines if "judge_win_rate" in line)
        assert header.split()[-2:] == ["judge_win_rate", "judge_interval"]
        for name, t in (("theta_0", None), ("0", 0), ("1", 1)):
            stats = store.read_manifest(t, "judge")["stats"]
            row = next(line for line in lines[lines.index(header) :] if line.split()[0] == name)
            low, high = stats["ci_low"], stats["ci_high"]
            assert row.endswith(f"{stats['win_rate']:.3f}  [{low:.3f}, {high:.3f}]"), row
            assert 0.0 <= low <= stats["win_rate"] <= high <= 1.0 and low < high
            assert stats["backend"]["requests"] == stats["comparisons"] > 0
        assert any(
            line.startswith("judge_win_rate: gpt-4-1106-preview's verdicts") for line in lines
        )
        assert "judge win rate per category:" in out
        assert judged == sum(
            store.read_manifest(t, "judge")["stats"]["comparisons"] for t in (None, 0, 1)
        )

        # A second launch reuses everything: no reference is generated, nothing is judged again.
        assert main(["run", "--config", path]) == 0
        capsys.readouterr()
        assert (len(reference.requests), len(judge.requests)) == (generated, judged)

    # The UI: each checkpoint's verdicts beside both answers, the summary and the charts.
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from eva_runtime.prefect_ui import POSTER

    assert POSTER.flush(timeout_s=30)
    with get_client(sync_client=True) as client:

        def posted(key: str) -> list:
            found = client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
            )
            return sorted(found, key=lambda a: a.created)

        verdicts = json.loads(str(posted("judged-iter-1-judge-verdicts")[-1].data))
        summary = str(posted("judged-summary")[-1].data)
        charts = str(posted("judged-charts")[-1].data)
    assert len(verdicts) == 24 and list(verdicts[0])[:5] == [
        "prompt_id", "category", "score", "verdict_policy_as_a", "verdict_policy_as_b",
    ]  # fmt: skip
    assert {"prompt", "response", "reference"} <= set(verdicts[0])
    assert "| judge_win_rate | judge_interval |" in summary
    assert "### Judge win rate per category" in summary
    assert "Judge win rate against the reference answers" not in charts  # SVGs, base64
    assert charts.count("](data:image/svg+xml;base64,") == 10


def test_eva_run_with_a_judge_that_does_not_answer_is_refused_in_one_line(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    assert main(["run", "--config", _config(tmp_path, dead, dead)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"eva: error: evaluate.judge.llm.base_url: {dead} cannot be reached")
    assert "\n" not in err and not (tmp_path / "judged").exists()


def test_eva_online_judges_theta_0_and_every_segment(tmp_path, capsys) -> None:
    from tests.test_online import tiny_online_config

    cfg = tiny_online_config(str(tmp_path), run="judged-online", budget=1.0)
    with (
        OpenAICompatibleServer(half_right, model="gpt-4-0314") as reference,
        OpenAICompatibleServer(judging(knows_the_answers)) as judge,
    ):
        cfg["evaluate"]["judge"] = _judge(judge.base_url, reference.base_url)
        path = tmp_path / "online.yaml"
        path.write_text(yaml.safe_dump(cfg))
        assert main(["online", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    store = RunStore(str(tmp_path), "judged-online")
    header = next(line for line in out.splitlines() if line.lstrip().startswith("segment"))
    assert header.split()[-2:] == ["judge_win_rate", "judge_interval"]
    for t in (None, 1):  # theta_0 and the one segment of budget 1
        stats = store.read_manifest(t, "judge")["stats"]
        assert stats["judged"] == 12 and stats["backend"]["requests"] == stats["comparisons"]
        assert f"{stats['win_rate']:.3f}  [{stats['ci_low']:.3f}, {stats['ci_high']:.3f}]" in out
    assert store.read_manifest(2, "judge") is None  # one segment at budget 1

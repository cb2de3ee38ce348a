"""Online eva end to end: TRL's RLOO fed by the buffer, in cached segments that resume exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import yaml

from eva_core.informativeness import informativeness
from flows.cli import main
from flows.config import OnlineRunConfig, validate_config
from tasks.online import STATE_FILE
from tasks.store import RunStore
from tests.conftest import world, world_prompts, world_sft

pytestmark = pytest.mark.usefixtures("prefect_api")


def tiny_online_config(root: str, run: str = "on", **online: Any) -> dict[str, Any]:
    """12 seed prompts, 2 a step, a buffer of 8: every phase within 18 steps (3 segments)."""
    settings: dict[str, Any] = {
        "solver": {
            "learning_rate": 1e-3,
            "num_generations": 3,
            "prompts_per_step": 2,
            "max_completion_length": 8,
            "beta": 0.0,
        },
        "buffer": {"size": 8},
        "budget": 3.0,
        "steps_per_segment": 6,
        "reward": world("components:WorldVerifier"),
        "evolver": world("components:WorldRewriter"),
    }
    settings.update(online)
    return {
        "run": run,
        "root": root,
        "seed": 0,
        "torch_threads": 1,
        "prompts": world_prompts("seed", 12),
        "heldout": world_prompts("heldout", 12),
        "bootstrap": world_sft(steps=30, examples=1000),
        "evaluate": {"generation": {"max_new_tokens": 10, "temperature": 0.0}},
        "online": settings,
    }


def _log(store: RunStore, segments: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for s in range(1, segments + 1):
        rows += store.read_table(store.read_manifest(s, "online")["uri"]).to_pylist()
    return rows


def _state(store: RunStore, segment: int) -> dict[str, Any]:
    model = store.resolve(store.read_manifest(segment, "online")["model_uri"])
    with open(os.path.join(model, STATE_FILE)) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def online_run(tmp_path_factory, prefect_api):
    from flows.online import eva_online

    root = str(tmp_path_factory.mktemp("online"))
    config = validate_config(tiny_online_config(root), OnlineRunConfig)
    rows = eva_online(config)
    return config, rows


def test_segments_walk_through_the_paper_phases(online_run) -> None:
    config, rows = online_run
    store = RunStore(config.root, config.run)
    assert config.online.segments(12) == 3 and len(rows) == 4  # theta_0 + 3 segments
    log = _log(store, 3)
    assert [r["step"] for r in log] == [s for s in range(18) for _ in range(2)]
    by_step = {s: [r for r in log if r["step"] == s] for s in range(18)}
    phases = [rs[0]["phase"] for rs in by_step.values()]
    # Warm-up from D only, until B (size 8) has filled: each step evolves its top prompt into
    # 4 children, which join one step later (evolve_lag 1); the trainer draws one batch ahead.
    # So B holds 4 children after step 1's feedback and 8 after step 2's: step 4 is mix-up.
    assert phases[:4] == ["warmup"] * 4
    assert not any(r["from_buffer"] for s in range(4) for r in by_step[s])
    assert all(sum(r["evolved"] for r in by_step[s]) == 1 for s in range(18))
    # Mix-up: half of each batch from B, the rest from D, until D's 12 prompts are used.
    mix = [s for s, p in enumerate(phases) if p == "mixup"]
    assert mix == [4, 5, 6, 7] and all(sum(r["from_buffer"] for r in by_step[s]) == 1 for s in mix)
    # Bootstrap once D (12 prompts) is used up: everything from B.
    boot = [s for s, rs in by_step.items() if rs[0]["phase"] == "bootstrap"]
    assert boot and all(all(r["from_buffer"] for r in by_step[s]) for s in boot)
    seeds_used = [r["prompt_id"] for r in log if not r["from_buffer"]]
    assert len(seeds_used) == len(set(seeds_used)) == 12  # D once, without replacement
    assert {r["source"] for r in log if r["from_buffer"]} == {"evolved"}
    final = _state(store, 3)
    buffer = final["creator"]["buffer"]
    assert buffer["phase"] == "bootstrap" and len(buffer["entries"]) <= 8


def test_informativeness_comes_from_the_trainers_rewards_and_children_inherit_it(
    online_run,
) -> None:
    config, _ = online_run
    store = RunStore(config.root, config.run)
    log = _log(store, 3)
    rewards = np.array([r["rewards"] for r in log])
    assert rewards.shape == (36, 3) and np.all((rewards >= 0) & (rewards <= 1))  # 18 steps x 2
    np.testing.assert_allclose(
        [r["informativeness"] for r in log], informativeness(rewards, "a_avg")
    )
    # A prompt drawn from B carries its parent's lineage, one level deeper.
    # (A text can be trained twice with two lineages: a child popped from B may be evolved
    # again, later, from another parent; so compare against every depth its parent had.)
    depths: dict[str, set[int]] = {}
    for r in log:
        depths.setdefault(r["prompt_id"], set()).add(r["depth"])
    children = [r for r in log if r["from_buffer"] and r["parent_id"] in depths]
    assert children and all(c["depth"] - 1 in depths[c["parent_id"]] for c in children)
    seg = store.read_manifest(1, "online")["stats"]
    assert seg["children_added"] > 0 and seg["parents"] > 0
    assert seg["mean_reward"] == pytest.approx(float(rewards[:12].mean()), abs=1e-4)


def test_each_segment_changes_the_weights_and_is_evaluated(online_run) -> None:
    from safetensors.numpy import load_file

    config, rows = online_run
    store = RunStore(config.root, config.run)

    def weights(t: int | None, stage: str) -> dict:
        model = store.resolve(store.read_manifest(t, stage)["model_uri"])
        return load_file(os.path.join(model, "model.safetensors"))

    theta0, seg1 = weights(None, "bootstrap"), weights(1, "online")
    assert any(not np.array_equal(theta0[k], seg1[k]) for k in theta0)
    assert all(r["heldout_score"] is not None for r in rows)
    assert [r["budget"] for r in rows[1:]] == [1.0, 2.0, 3.0]


def test_online_run_publishes_its_summary_and_charts(online_run) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    config, _ = online_run
    keys = [f"{config.run}-charts", f"{config.run}-summary"]
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=keys))
        )
    data = {a.key: str(a.data) for a in found}
    charts = data[keys[0]]
    assert charts.startswith(f"## Charts of eva online run `{config.run}`")
    assert charts.count("](data:image/svg+xml;base64,") == 5 and "nothing to draw" not in charts
    assert "win_vs_theta_0" in data[keys[1]] and "What each segment did" in data[keys[1]]
    # A segment's stats: the policy-gradient signal, not RLOO's surrogate loss (0 by design).
    store = RunStore(config.root, config.run)
    stats = store.read_manifest(1, "online")["stats"]
    assert stats["advantage_std"] > 0 and "loss" not in stats
    # The buffer table counts the buffer (8 prompts), not the 12 rows the segment trained on.
    key = f"{config.run}-iter-1-online-buffer"
    with get_client(sync_client=True) as client:
        (table, *_) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
    size = stats["buffer"]["size"]
    assert size == 8 and table.description == (
        f"online iter_1: top {size} of the {size} prompts in the buffer B, by priority"
    )


def test_rerun_is_cached_and_show_prints_the_segments(online_run, capsys) -> None:
    from flows.online import eva_online

    config, rows = online_run
    store = RunStore(config.root, config.run)
    stamps = {s: store.read_manifest(s, "online")["created_at"] for s in (1, 2, 3)}
    assert eva_online(config) == rows
    assert {s: store.read_manifest(s, "online")["created_at"] for s in (1, 2, 3)} == stamps
    assert main(["show", "--root", config.root, "--run", config.run]) == 0
    out = capsys.readouterr().out
    assert "segment" in out and "bootstrap" in out


def test_kill_9_mid_segment_resumes_to_the_same_buffer_and_prompts(tmp_path, online_run):
    config, _ = online_run
    cfg = tiny_online_config(config.root, run="killed")
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "flows.cli", "online", "--config", str(path)]
    store = RunStore(config.root, "killed")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 600
    while store.read_manifest(1, "online") is None and proc.poll() is None:
        assert time.time() < deadline
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # during segment 2 (or its evaluation)
    proc.wait()
    first = store.read_manifest(1, "online")["created_at"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert store.read_manifest(1, "online")["created_at"] == first  # came back Cached
    whole = RunStore(config.root, config.run)
    assert _log(store, 3) == _log(whole, 3)
    assert _state(store, 3) == _state(whole, 3)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("online.buffer.ratio_evol=1.5", "online.buffer.ratio_evol: Input should be less than"),
        ("online.buffer.size=0", "online.buffer.size: Input should be greater than or equal"),
        ("online.buffer.n_new=-1", "online.buffer.n_new: Input should be greater than or equal"),
        (
            "online.solver.kind=ppo",
            "online.solver: Input tag 'ppo' found using 'kind' does not "
            "match any of the expected tags: 'rloo', 'grpo', 'online_dpo', 'python'",
        ),
        ("online.budget=0", "online.budget: Input should be greater than 0"),
        ("online.solver.kind=online_dpo,online.solver.beta=0", "online.solver: online_dpo needs"),
    ],
)
def test_bad_online_input_stops_in_one_line_before_writing(tmp_path, capsys, setting, message):
    root = tmp_path / "runs"
    sets = [arg for item in setting.split(",") for arg in ("--set", item)]
    assert main(["online", "--root", str(root), *sets]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"eva: error: {message}") and "\n" not in err
    assert not root.exists()


@pytest.mark.parametrize("kind", ["grpo", "online_dpo"])
def test_grpo_and_online_dpo_train_on_the_buffer_too(online_run, kind) -> None:
    """The other TRL online trainers: same prompt source, their own reward layouts (online DPO
    scores the batch twice, half a batch apart; the source checks the prompt order)."""
    from safetensors.numpy import load_file

    from flows.online import eva_online

    config, _ = online_run
    setup = RunStore(config.root, config.run)
    theta0 = setup.absolute(setup.read_manifest(None, "bootstrap")["model_uri"])
    cfg = tiny_online_config(config.root, run=kind, budget=1.0)
    cfg["online"]["solver"].update(kind=kind, beta=0.1)
    cfg["bootstrap"] = {"init_checkpoint": theta0}  # instead of the world's SFT
    eva_online(validate_config(cfg, OnlineRunConfig))
    store = RunStore(config.root, kind)
    log = _log(store, 1)
    k = 2 if kind == "online_dpo" else 3
    assert [len(r["rewards"]) for r in log] == [k] * 12
    after = store.resolve(store.read_manifest(1, "online")["model_uri"])
    a, b = (load_file(os.path.join(d, "model.safetensors")) for d in (theta0, after))
    assert any(not np.array_equal(a[key], b[key]) for key in a)

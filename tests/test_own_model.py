"""A user's first own run: their prompts (MT-Bench questions), their Hugging Face policy and
reward model by Hub id, an OpenAI-compatible rewriter, through configs/own-model.yaml.

Nothing can be downloaded here, so the Hub ids resolve through an offline Hub cache that the
tests build (tests/support/tiny_models.py: a Qwen2 policy and a Qwen2 sequence-classification
reward model with a BPE tokenizer trained here), with ``HF_HUB_OFFLINE=1``: the same loading
path a Hub id takes on a user's machine. The rewriter is the suite's local OpenAI-compatible
server. Each run is the real command, ``eva run``, in its own process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.store import RunStore
from tests.support.openai_server import OpenAICompatibleServer
from tests.support.tiny_models import POLICY, REWARD, build_hub_cache

pytestmark = pytest.mark.usefixtures("prefect_api")

PROJECT = Path(__file__).resolve().parents[1]
MT_BENCH = PROJECT / "tests" / "data" / "mt_bench_questions.jsonl"
OWN_MODEL = PROJECT / "configs" / "own-model.yaml"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    texts = [json.loads(line)["turns"][0] for line in MT_BENCH.read_text().splitlines()]
    cache = str(tmp_path_factory.mktemp("hf") / "hub")
    build_hub_cache(cache, texts)
    return cache


def _eva(args: list[str], cwd: Path, hub_cache: str | None = None) -> subprocess.CompletedProcess:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    if hub_cache is not None:
        env.update(HF_HUB_CACHE=hub_cache, HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def _split_mt_bench(tmp_path: Path) -> tuple[Path, Path]:
    """The first 40 questions as the user's prompts, the last 40 as their held-out set."""
    rows = MT_BENCH.read_text().splitlines()
    prompts, heldout = tmp_path / "prompts.jsonl", tmp_path / "heldout.jsonl"
    prompts.write_text("\n".join(rows[:40]) + "\n")
    heldout.write_text("\n".join(rows[40:]) + "\n")
    return prompts, heldout


def test_own_prompts_on_the_default_config_are_refused_before_anything_runs(tmp_path) -> None:
    root = tmp_path / "runs"
    args = ["run", "--root", str(root), "--set", f"prompts.path={MT_BENCH}"]
    done = _eva([*args, "--set", "prompts.prompt_column=turns"], tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    err = done.stderr.strip()
    assert "\n" not in err and err.startswith("eva: error: prompts.path: ")
    assert "row 0 ('Compose an engaging travel blog post" in err
    assert "is not a prompt of the built-in world" in err and "configs/own-model.yaml" in err
    assert not root.exists() and "Prefect server" not in done.stdout  # refused before both


def test_a_run_without_a_policy_or_a_reward_model_is_refused_naming_the_field(tmp_path) -> None:
    prompts, heldout = _split_mt_bench(tmp_path)
    base = ["run", "--root", str(tmp_path / "runs"), "--set", "prompts.prompt_column=turns"]
    base += ["--set", f"prompts.path={prompts}", "--set", f"heldout.path={heldout}"]
    own = tmp_path / "own.yaml"
    own.write_text("run: mine\n")  # a file of the user's: the paper's defaults, nothing named
    done = _eva([*base, "--config", str(own)], tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("eva: error: bootstrap.init_checkpoint: no policy to start from")
    done = _eva([*base, "--config", str(own), "--set", "bootstrap.init_checkpoint=org/m"], tmp_path)
    assert done.stderr.startswith("eva: error: annotate.reward: no reward model (e.g. {kind: ")


def test_own_model_recipe_end_to_end_on_cpu(tmp_path, hub_cache) -> None:
    prompts, heldout = _split_mt_bench(tmp_path)

    def rewrite(prompt: str, index: int, request: dict) -> str:
        # A rewriter that always makes a new, harder prompt of the one it was given.
        given = prompt.split("#The Given Prompt#:")[-1].split("#Rewritten Prompt#:")[0].strip()
        return f"{given[:200]} Answer in exactly {len(given) % 7 + 2} sentences."

    root = tmp_path / "runs"
    with OpenAICompatibleServer(rewrite) as rewriter:
        sets = {
            "prompts.path": prompts, "prompts.prompt_column": "turns",
            "heldout.path": heldout, "heldout.prompt_column": "turns",
            "bootstrap.init_checkpoint": POLICY,
            "annotate.reward.model": REWARD,
            "evolve.evolver.llm.base_url": rewriter.base_url,
            "evolve.evolver.llm.model": "tiny",
            "generate.backend.max_new_tokens": 8, "evaluate.generation.max_new_tokens": 8,
            "iterations": 1, "torch_threads": 1,
        }  # fmt: skip
        args = ["run", "--config", str(OWN_MODEL), "--root", str(root)]
        args += [a for key, value in sets.items() for a in ("--set", f"{key}={value}")]
        done = _eva(args, tmp_path, hub_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "eva run 'own-model'" in done.stdout

    store = RunStore(str(root), "own-model")
    # The policy is the Hub id, loaded through the Hub's cache: never a folder inside the run.
    assert store.read_manifest(None, "bootstrap")["model_uri"] == f"hub:{POLICY}"
    assert not (root / "own-model" / POLICY.split("/")[0]).exists()
    assert store.read_manifest(None, "evaluate")["stats"]["score"] is not None
    # The creator evolved the user's prompts through the rewriter, with lineage.
    evolved = store.read_table(store.read_manifest(1, "evolve")["uri"]).to_pylist()
    assert evolved and all(r["parent_id"] and r["depth"] == 1 for r in evolved)
    assert len(rewriter.requests) >= len(evolved)
    mixed = store.read_table(store.read_manifest(1, "mix")["uri"])
    assert {"evolved", "seed"} <= set(mixed.column("source").to_pylist())
    # The solver trained theta_1 on pairs scored by the user's reward model, and it was scored.
    for t in (0, 1):
        assert store.read_manifest(t, "pairs")["rows"] > 0
        assert store.read_manifest(t, "train")["model_uri"] == f"iter_{t}/model"
        assert store.read_manifest(t, "evaluate")["stats"]["score"] is not None

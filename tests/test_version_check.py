"""What the version check sees beyond a stage's own modules, what it says when it fails, how it
reads code, and what a launch says about it.

Edits are made to copies of the source, handed to the check through ``tasks.source.read`` (the
one place it reads code): the real files are never touched.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tasks import source, versions
from tasks.backends.generate.openai import OpenAIGeneration

SEEDS = versions.SEEDS
CLIENT = "eva_runtime.llm_client"
PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture
def edit(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, str, str], None]]:
    """``edit(module, old, new)``: the check reads ``module`` with ``old`` replaced by ``new``."""
    real = source.read
    edited: dict[str, str] = {}

    def read(module: str) -> str:
        return edited.get(module, real(module))

    def apply(module: str, old: str, new: str) -> None:
        text = edited.get(module, real(module))
        assert text.count(old) == 1, f"{old!r} is not once in {module}"
        edited[module] = text.replace(old, new)
        versions.clear_caches()

    monkeypatch.setattr(source, "read", read)
    versions.clear_caches()
    yield apply
    versions.clear_caches()


@pytest.fixture
def lock(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A lock file recording the current code (not the repository's, which may lag a local
    edit of someone else's)."""
    path = tmp_path / "versions.lock.json"
    monkeypatch.setattr(versions, "LOCK", path)
    versions.write()
    return path


def _changed(problems: list[str]) -> set[str]:
    return {p.split(": ")[0] for p in problems if "its code changed" in p}


def test_editing_a_seed_derivation_fails_the_check_for_every_entry(lock, edit) -> None:
    """The two misses of issue 31: the per-stage seed (which the stage framework hands every
    stage) and the LLM request seed, both in eva_runtime/seeds.py, now fail the check."""
    entries = set(versions.declared())
    assert versions.check() == []
    # The per-stage seed: every stage reads it; every component is handed one.
    edit(SEEDS, "return int(digest[:8], 16)", "return int(digest[:9], 16)")
    assert _changed(versions.check()) == entries
    edit(SEEDS, "return int(digest[:9], 16)", "return int(digest[:8], 16)")
    assert versions.check() == []
    # The request seed.
    edit(SEEDS, 'f"{seed}:{content}"', 'f"{seed}/{content}"')
    problems = versions.check()
    assert _changed(problems) == entries
    assert (
        "component:tasks.backends.generate.openai:OpenAIGeneration: its code changed but its "
        f"version is still {OpenAIGeneration.version} (eva_runtime.seeds:content_seed): bump it "
        "if what it writes can change; if it cannot, record it: python -m tasks.versions --write"
    ) in problems


def test_a_comment_or_docstring_edit_of_the_seeds_passes(lock, edit) -> None:
    edit(SEEDS, '"""Every seed eva derives', '"""All the seeds eva derives')
    edit(
        SEEDS, "    digest = hashlib.sha256(", "    # hashed as text\n    digest = hashlib.sha256("
    )
    edit(SEEDS, "\n\ndef derive_seed(", "\n\n\n# by index\ndef derive_seed(")
    assert versions.check() == []


def test_what_a_failed_request_becomes_counts_how_it_travels_does_not(edit) -> None:
    """In the LLM client, the functions that decide what an answer becomes are in the
    fingerprints of the components that send requests; its retries are in none."""
    llm = [
        "tasks.backends.generate.openai:OpenAIGeneration",
        "tasks.backends.evolve.paper:PaperTemplateEvolver",
        "tasks.backends.evolve.distilabel:DistilabelEvolver",  # through distilabel_llm
        "tasks.backends.reward.pairwise:PairwiseReward",
    ]
    others = ["tasks.backends.generate.transformers:TransformersGeneration"]
    stages = ["tasks.score", "tasks.generate"]

    def codes() -> dict[str, str]:
        out = {c: versions.component_code(c) for c in llm + others}
        return out | {s: versions.stage_code(s) for s in stages}

    before = codes()
    # Retries, backoff and the breaker: how bytes travel.
    edit("eva_runtime.llm_retry", "* random.uniform(0.5, 1.0)", "* random.uniform(0.25, 1.0)")
    assert codes() == before
    # A request that failed for good answers "" (what a stage then writes).
    edit(
        CLIENT,
        '                    raise\n                return ""',
        '                    raise\n                return "?"',
    )
    after = codes()
    assert [c for c in llm if after[c] == before[c]] == []
    assert {k: after[k] for k in others + stages} == {k: before[k] for k in others + stages}


def test_distilabel_failures_count_for_the_distilabel_evolver_only(edit) -> None:
    distilabel = "tasks.backends.evolve.distilabel:DistilabelEvolver"
    paper = "tasks.backends.evolve.paper:PaperTemplateEvolver"
    before = {c: versions.component_code(c) for c in (distilabel, paper)}
    edit("eva_runtime.distilabel_llm", '"generations": [""] * n', '"generations": ["-"] * n')
    assert versions.component_code(distilabel) != before[distilabel]
    assert versions.component_code(paper) == before[paper]


def test_every_named_output_function_exists_and_a_moved_one_is_named(lock, edit) -> None:
    for module, functions in versions.OUTPUT_CODE.items():
        for qualname in functions:
            assert versions._function(module, qualname).startswith(("FunctionDef(", "ClassDef("))
    edit(CLIENT, "    def answers(", "    def answer_all(")
    assert versions.check() == [
        "eva_runtime.llm_client has no LLMClient.answers: update OUTPUT_CODE in "
        "tasks/versions.py to name the code that decides what is written"
    ]


def test_the_check_reads_code_without_importing_it() -> None:
    """Resolving imports never imports a module (a backend's would import torch or TRL)."""
    assert source.find("tasks.backends.train.dpo") is not None
    assert source.find("tasks.backends.train.dpo.DPOSolverConfig") is None  # a name in it
    assert source.find("eva_runtime.seeds") is not None
    assert source.find("no_such_package.module") is None
    name = "tasks.backends.nothing_here"
    assert source.find(name) is None and name not in sys.modules


def test_the_whole_check_imports_no_stage_or_backend() -> None:
    """``python -m tasks.versions`` finds every stage and component by reading the code: no
    stage, backend, torch or TRL is imported."""
    code = (
        "import sys; from tasks import versions; versions.check(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'trl', 'transformers', 'vllm', 'prefect') or m.startswith('tasks.backends') "
        "or m in ('tasks.score', 'tasks.stage', 'tasks.keys')))"
    )
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_reading_finds_what_importing_finds() -> None:
    """Every stage and component, and its version, as importing every module finds them (how
    the check found them before it read code)."""
    import importlib
    import inspect
    import pkgutil

    from pydantic import BaseModel

    from tasks.keys import is_component
    from tasks.stage import Stage

    imported: dict[str, int] = {}
    names = [*versions.PACKAGES]
    for package in versions.PACKAGES:
        root = importlib.import_module(package)
        names += [i.name for i in pkgutil.walk_packages(root.__path__, f"{package}.")]
    for name in [*names, *versions.MODULES]:
        if name in versions.SKIP:
            continue
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if isinstance(obj, Stage) and obj.fn.__module__ == name:
                imported[f"stage:{obj.name}@{name}"] = obj.version
            elif isinstance(obj, type) and obj.__module__ == name:
                if issubclass(obj, BaseModel):
                    found = is_component(obj) and not inspect.isabstract(obj)
                else:
                    found = name.startswith("eva_world") and "version" in vars(obj)
                if found:
                    version = getattr(obj, "version", None)
                    imported[f"component:{name}:{attr}"] = (
                        version if isinstance(version, int) else -1
                    )
    assert {k: v for k, (v, _) in versions.declared().items()} == imported


def test_a_stale_entry_names_the_functions_that_changed(lock, edit) -> None:
    edit("tasks.score", "def score(", "def score(  # a comment is no change\n")
    assert versions.check() == []
    # A method's arithmetic, imported by score; and a constant beside the stage.
    edit("eva_core.informativeness", "return r.mean(axis=1)", "return r.mean(axis=1) + 0")
    edit("tasks.score", "\n@stage(", "\nEXTRA = 2\n\n\n@stage(")
    problems = [p for p in versions.check() if p.startswith("stage:score@")]
    assert problems == [
        "stage:score@tasks.score: its code changed but its version is still 1 "
        "(eva_core.informativeness:_row_mean, tasks.score:<module>): bump it if what it writes "
        "can change; if it cannot, record it: python -m tasks.versions --write"
    ]
    edited = versions.check()
    versions.write()  # recorded as a refactor: the lock names each function it covers
    assert versions.check() == [] != edited
    recorded = json.loads(lock.read_text())
    assert set(recorded["module:tasks.score"]) >= {"score", "<module>"}
    assert set(recorded["module:eva_runtime.llm_client"]) == set(
        versions.OUTPUT_CODE["eva_runtime.llm_client"]
    )


# -- the launch -------------------------------------------------------------------------------


def _run(tmp_path):
    import flows.iteration  # noqa: F401  (a launch imports the stages it calls)
    from flows.config import RunConfig
    from tasks.store import RunStore

    config = RunConfig(root=str(tmp_path / "runs"), run="r")
    return config, RunStore(config.root, config.run)


def _finished(store, iteration: int | None, artifact: str, stage: str) -> None:
    manifest = {"stage": stage, "artifact": artifact, "iteration": iteration, "key": "k"}
    manifest |= {"uri": f"{artifact}.parquet", "bytes": 1, "rows": 1, "content_hash": "c"}
    store.write_manifest(iteration, artifact, manifest)


def test_a_launch_names_the_edited_stages_it_reuses(tmp_path, lock, edit, caplog) -> None:
    from flows.launch import _open

    config, store = _run(tmp_path)
    _finished(store, 1, "score", "score")
    _finished(store, 1, "creator_generate", "generate")
    _finished(store, 1, "mix", "mix")
    caplog.set_level(logging.WARNING)
    _open(config, None)
    assert [r for r in caplog.records if r.name == "eva.launch"] == []  # nothing edited

    edit("tasks.score", "def score(", "def score(  # edited\n")  # a comment: no edit
    assert versions.edited_stages(config) == {}
    edit("tasks.score", "\n@stage(", "\nUNUSED = 1\n\n\n@stage(")  # code, same version
    generate = type(config.generate.backend)
    edit(
        generate.__module__, f"class {generate.__name__}(", f"X = 2\n\n\nclass {generate.__name__}("
    )
    edited = versions.edited_stages(config)
    where = f"{generate.__module__}:{generate.__qualname__}"
    assert edited["score"] == ["its code"] and edited["generate"] == [where]
    # evaluate samples with the same backend; predict imports tasks.score (in its code too)
    assert set(edited) == {"score", "generate", "evaluate", "predict"}

    caplog.clear()
    _open(config, None)
    lines = [r.getMessage() for r in caplog.records if r.name == "eva.launch"]
    assert lines == [
        f"code edited without a version bump (generate: {where}; score: its code): this launch "
        "reuses the finished artifacts of generate, score as they are (keys follow versions, "
        "not code); bump the version if the edit changes what they write, else record it: "
        "python -m tasks.versions --write"
    ]
    assert "\n" not in lines[0]


def test_a_launch_with_nothing_finished_or_a_bumped_version_says_nothing(
    tmp_path, lock, edit, monkeypatch
) -> None:
    from flows.launch import say_edited_code
    from tasks.score import score

    config, store = _run(tmp_path)
    edit("tasks.score", "\n@stage(", "\nUNUSED = 1\n\n\n@stage(")
    assert say_edited_code(config, store) is None  # a fresh run reuses nothing
    _finished(store, None, "prompts", "prompts")
    assert say_edited_code(config, store) is None  # nothing of score's
    _finished(store, 2, "score", "score")
    assert "(score: its code)" in (say_edited_code(config, store) or "")
    monkeypatch.setattr(score, "version", score.version + 1)  # bumped: new keys, no reuse
    assert say_edited_code(config, store) is None


def test_a_launch_check_that_fails_says_so_and_launches(tmp_path, lock, monkeypatch) -> None:
    from flows import launch

    config, store = _run(tmp_path)
    lock.write_text("{not json")
    line = launch.say_edited_code(config, store)
    assert line is not None and line.startswith("could not compare the code with")


def test_a_missing_lock_file_says_nothing(tmp_path, monkeypatch) -> None:
    from flows.launch import say_edited_code

    config, store = _run(tmp_path)
    _finished(store, 1, "score", "score")
    monkeypatch.setattr(versions, "LOCK", tmp_path / "absent.json")  # an install without it
    assert say_edited_code(config, store) is None
    assert json.loads(json.dumps(versions.edited_stages(config))) == {}

"""What the version check sees beyond a stage's own modules, and what a launch says about it.

Edits are made to copies of the source, handed to the check through ``tasks.versions._source``
(the one place it reads code): the real files are never touched.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import pytest

from tasks import versions

SEEDS = versions.SEEDS
CLIENT = "eva_runtime.llm_client"


def _clear_caches() -> None:
    for cached in (versions._parsed, versions._tree, versions._imports, versions._closure):
        cached.cache_clear()


@pytest.fixture
def edit(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, str, str], None]]:
    """``edit(module, old, new)``: the check reads ``module`` with ``old`` replaced by ``new``."""
    real = versions._source
    edited: dict[str, str] = {}

    def source(module: str) -> str:
        return edited.get(module, real(module))

    def apply(module: str, old: str, new: str) -> None:
        text = edited.get(module, real(module))
        assert text.count(old) == 1, f"{old!r} is not once in {module}"
        edited[module] = text.replace(old, new)
        _clear_caches()

    monkeypatch.setattr(versions, "_source", source)
    _clear_caches()
    yield apply
    _clear_caches()


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
        "version is still 1: bump it if what it writes can change, then record it"
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
    edit(CLIENT, "* random.uniform(0.5, 1.0)", "* random.uniform(0.25, 1.0)")
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
    import sys

    assert versions._find("tasks.backends.train.dpo") is not None
    assert versions._find("tasks.backends.train.dpo.DPOSolverConfig") is None  # a name in it
    assert versions._find("eva_runtime.seeds") is not None
    assert versions._find("no_such_package.module") is None
    name = "tasks.backends.nothing_here"
    assert versions._find(name) is None and name not in sys.modules


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

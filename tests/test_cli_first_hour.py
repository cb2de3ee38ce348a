"""A user's first hour with ``eva``: help and a mistyped stage answer at once, without
importing torch or prefect and without touching the run; ``eva show --stage evolve`` prints each
child beside its parent, one line of valid JSON a row however long its texts."""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from flows import commands, inspect_commands
from flows.cli import main
from flows.config import OnlineRunConfig, RunConfig, validate_config
from tasks.store import RunStore
from tests.conftest import tiny_run_config
from tests.test_online import tiny_online_config

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("torch", "transformers", "prefect", "datasets", "trl")

# Runs eva's CLI in a fresh interpreter and reports, after it, which heavy modules it imported.
PROBE = textwrap.dedent(f"""
    import contextlib, io, json, sys
    from flows.cli import main
    with contextlib.redirect_stdout(io.StringIO()):
        status = main(sys.argv[1:])
    print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))
    sys.exit(status)
""")


def _eva(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _stored_run(root: str, online: bool = False) -> RunStore:
    """A run as a launch records it (its config.json), nothing run yet."""
    config: RunConfig | OnlineRunConfig
    if online:
        config = validate_config(tiny_online_config(root, run="r"), OnlineRunConfig)
    else:
        config = validate_config(tiny_run_config(root, run="r", iterations=2), RunConfig)
    store = RunStore(root, "r")
    store.write_json(f"{store.base}/config.json", config.model_dump(mode="json"))
    return store


def _snapshot(store: RunStore) -> dict[str, tuple[int, int]]:
    """Every path under the run (folders included) with its mtime and size."""
    found = {}
    for folder, dirs, files in os.walk(store.base):
        for name in [*dirs, *files]:
            st = os.stat(os.path.join(folder, name))
            found[os.path.join(folder, name)] = (st.st_mtime_ns, st.st_size)
    return found


@pytest.mark.parametrize("argv", [["--help"], ["stage", "--help"], ["show", "--rows", "x"]])
def test_help_and_usage_errors_import_nothing_heavy(argv) -> None:
    done = _eva(*argv)
    assert done.returncode == (2 if "x" in argv else 0), done.stderr
    assert json.loads(done.stdout) == []  # no torch, transformers or prefect: ~0.1 s, not ~3 s


@pytest.mark.parametrize("module", ["flows.cli", "flows.config"])
def test_importing_the_cli_imports_nothing_heavy(module: str) -> None:
    """The CLI, and the config with every stage's (what `eva config` and `eva show` read): a
    stage makes its Prefect task when a flow first calls it."""
    code = f"import {module}, sys; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("online", "name", "iteration", "line"),
    [
        (False, "evolv", "1", "evolv does not run in iteration 1 of r (did you mean evolve?)"),
        (False, "evolve", "0", "evolve does not run in iteration 0 of r (it runs generate, "
         "annotate, pairs, train, evaluate)"),
        (False, "evolve", "setup", "evolve does not run in setup of r (it runs prompts, "
         "heldout, bootstrap, evaluate)"),
        (True, "evalute", "1", "evalute does not run in segment 1 of r (did you mean evaluate?)"),
        (True, "evolve", "2", "evolve does not run in segment 2 of r (it runs online, evaluate)"),
    ],
)  # fmt: skip
def test_a_mistyped_stage_is_refused_before_anything_starts_or_writes(
    tmp_path, online, name, iteration, line
) -> None:
    store = _stored_run(str(tmp_path), online)
    before = _snapshot(store)
    done = _eva("stage", name, "--run", "r", "--root", str(tmp_path), "--iteration", iteration)
    assert done.returncode == 2
    assert done.stderr == f"eva: error: {line}\n"
    # Refused before a flow or a Prefect API could start: prefect was not even imported ...
    assert json.loads(done.stdout) == []
    # ... and the run is exactly as it was: config.json not rewritten, no .scratch made.
    assert _snapshot(store) == before


def test_the_stage_names_are_the_flows_own() -> None:
    """``eva stage`` checks a name against lists of its own; they must be the artifacts the
    flows call, read here from the flows' code (a stage's name, or the ``artifact=`` given)."""
    from flows import iteration, online

    def called(fn) -> set[str]:
        fn = getattr(fn, "fn", fn)  # a Prefect flow: its function
        module = sys.modules[fn.__module__]
        from tasks.stage import Stage

        names = set()
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn)))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                stage = getattr(module, node.func.id, None)
                if isinstance(stage, Stage):
                    given = [k.value for k in node.keywords if k.arg == "artifact"]
                    if given:
                        artifact = ast.literal_eval(given[0])  # a literal in every flow
                        names.add(str(artifact))
                    else:
                        names.add(stage.name)
        return names

    assert called(iteration.setup) == set(commands.SETUP_ARTIFACTS)
    assert called(iteration.solver_step) == set(commands.SOLVER_ARTIFACTS)
    assert called(iteration.eva_iteration) == set(commands.CREATOR_ARTIFACTS)
    assert called(iteration.dpo_iteration) == set()  # iteration 0 is a solver step alone
    assert called(online.eva_online) == set(commands.SEGMENT_ARTIFACTS)


def test_the_cli_run_name_is_the_configs() -> None:
    from flows.config import RUN_NAME

    assert commands.RUN_NAME.pattern == RUN_NAME.pattern


def _table(store: RunStore, iteration: int, artifact: str, rows: list[dict], **inputs: str):
    uri, digest, size = store.write_table(iteration, artifact, pa.Table.from_pylist(rows))
    manifest = {
        "artifact": artifact, "iteration": iteration, "key": artifact, "uri": uri, "bytes": size,
        "rows": len(rows), "content_hash": digest, "seconds": 0.1, "stats": {},
        "inputs": {name: {"uri": ref, "content_hash": ""} for name, ref in inputs.items()},
    }  # fmt: skip
    store.write_manifest(iteration, artifact, manifest)
    return uri


def test_show_evolve_prints_each_child_beside_its_parent_cut_per_field(tmp_path, capsys) -> None:
    store = _stored_run(str(tmp_path))
    long_parent = "reverse: " + "abcdefghij" * 50
    subset = _table(store, 1, "sample", [
        {"prompt_id": "p1", "prompt": "1+2=", "parent_id": None},
        {"prompt_id": "p2", "prompt": long_parent, "parent_id": None},
    ])  # fmt: skip
    _table(store, 1, "evolve", [
        {"prompt_id": "c1", "prompt": "11+2=", "source": "evolved", "parent_id": "p1",
         "responses": ["x" * 30] * 40},
        {"prompt_id": "c2", "prompt": long_parent + "k", "source": "evolved", "parent_id": "p2",
         "responses": []},
        {"prompt_id": "c3", "prompt": "7+7=", "source": "evolved", "parent_id": "gone",
         "responses": []},
    ], subset=subset)  # fmt: skip
    args = ["show", "--run", "r", "--root", str(tmp_path), "--iteration", "1", "--stage", "evolve"]
    assert main([*args, "--chars", "100"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = [json.loads(line) for line in lines[-3:]]  # every row is one line of valid JSON
    assert list(rows[0])[:3] == ["prompt_id", "prompt", "parent_prompt"]  # beside the child
    assert rows[0]["parent_prompt"] == "1+2=" and rows[0]["parent_id"] == "p1"
    # A long text is cut where it is, saying by how much; the fields after it are all there.
    assert rows[1]["prompt"] == long_parent[:100] + f"... (+{len(long_parent) + 1 - 100} chars)"
    assert rows[1]["parent_prompt"] == long_parent[:100] + f"... (+{len(long_parent) - 100} chars)"
    assert rows[1]["parent_id"] == "p2" and rows[1]["responses"] == []
    # A long list keeps the items that fit, then says how many more there were.
    responses = rows[0]["responses"]
    assert responses == ["x" * 30] * 3 + ["... (+37 more)"]
    assert "parent_prompt" not in rows[2]  # a parent in no input is left out, not guessed
    # --chars 0 prints every field whole.
    assert main([*args, "--chars", "0"]) == 0
    whole = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()[-3:]]
    assert whole[1]["parent_prompt"] == long_parent and len(whole[0]["responses"]) == 40


def test_shorten_cuts_texts_and_lists_inside_any_value() -> None:
    value = {"a": "x" * 12, "b": [10, 200, 3000], "c": {"d": ["y" * 12, "z"]}, "e": 1.5}
    assert inspect_commands.shorten(value, 0) == value
    assert inspect_commands.shorten(value, 5) == {
        "a": "xxxxx... (+7 chars)",
        "b": [10, 200, "... (+1 more)"],  # at least one item, then those within 5 chars
        "c": {"d": ["yyyyy... (+7 chars)", "... (+1 more)"]},
        "e": 1.5,
    }


@pytest.mark.parametrize("command", ["stage evolve --iteration 1", "show"])
def test_a_path_for_a_run_name_is_refused_at_once(tmp_path, command) -> None:
    done = _eva(*command.split(), "--run", "../r", "--root", str(tmp_path))
    assert done.returncode == 2 and json.loads(done.stdout) == []
    assert done.stderr == (
        "eva: error: --run '../r': a run name (letters, digits, '_', '.', '-'; at most 128 "
        "characters), not a path\n"
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [  # --name becomes part of artifact, log and scratch paths (it failed deep in the flow)
        (["--heldout", "ifeval", "--name", "x/y"], "--name: 'x/y' is not a name: letters, dig"),
        (["--heldout", "ifevals"], "--heldout: 'ifevals' is neither a prompt file (.jsonl, "),
    ],
)
def test_evaluate_refuses_a_path_for_a_name_and_a_mistyped_ifeval_at_once(
    tmp_path, argv, said
) -> None:
    store = _stored_run(str(tmp_path))
    before = _snapshot(store)
    done = _eva("evaluate", "--run", "r", "--root", str(tmp_path), *argv)
    assert done.returncode == 2 and json.loads(done.stdout) == []
    assert done.stderr.startswith(f"eva: error: argument {said}") and done.stderr.count("\n") == 1
    assert _snapshot(store) == before

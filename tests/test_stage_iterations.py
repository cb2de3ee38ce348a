"""``eva stage`` refuses an iteration (online: a segment) its run does not have in one line,
before any flow runs: the run's folder is left exactly as it was."""

from __future__ import annotations

import os

import pytest

from flows.cli import main
from flows.config import OnlineRunConfig, validate_config
from tasks.store import RunStore
from tests.conftest import tiny_run_config
from tests.test_online import tiny_online_config


def _store_config(root: str, cfg: dict, model: type) -> RunStore:
    """A run as a launch records it (its config.json), nothing run yet."""
    store = RunStore(root, cfg["run"])
    store.write_json(f"{store.base}/config.json", validate_config(cfg, model).model_dump())
    return store


def _snapshot(store: RunStore) -> dict[str, tuple[float, int]]:
    return {
        os.path.join(d, f): (
            os.stat(os.path.join(d, f)).st_mtime,
            os.stat(os.path.join(d, f)).st_size,
        )
        for d, _, files in os.walk(store.base)
        for f in files
    }


@pytest.mark.parametrize(
    ("online", "iteration", "message"),
    [
        (True, "0", "--iteration 0: run r has segments 1 to 1"),
        (True, "2", "--iteration 2: run r has segments 1 to 1"),
        (False, "3", "--iteration 3: run r has iterations 0 to 2"),
    ],
)
def test_an_iteration_the_run_lacks_is_refused_before_anything_runs(
    tmp_path, capsys, online, iteration, message
) -> None:
    from flows.config import RunConfig

    root = str(tmp_path)
    if online:
        store = _store_config(root, tiny_online_config(root, run="r"), OnlineRunConfig)
    else:
        store = _store_config(root, tiny_run_config(root, run="r", iterations=2), RunConfig)
    before = _snapshot(store)
    args = ["stage", "online" if online else "pairs", "--run", "r", "--root", root]
    assert main([*args, "--iteration", iteration, "--force"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"eva: error: {message} (--iteration setup addresses X_0, the held-out set and theta_0)"
    )
    assert _snapshot(store) == before  # no flow ran: config.json not even rewritten

"""``eva`` ends with its command's exit status, every time (issue 35: about one launch in ten
aborted with SIGABRT at exit, after it had done and written everything).

The cause was Arrow's, through how eva read parquet: ``pq.read_table`` on a source that is a
Python object (an fsspec file: every table of a run on S3; a user's parquet prompt file) hands
it to Arrow's thread pool, which may drop it on a worker thread after the read returned;
dropping a Python object takes the GIL, a worker that asks for it while the interpreter exits is
stopped inside Arrow's C++ code, and the process aborts ("terminate called without an active
exception"). eva now reads such bytes from a buffer Arrow owns (``tasks.store.parquet_table``).
Measured on 2 cores, 3 launches at a time: ``eva show --iteration 0 --stage generate`` on an S3
run aborted 3 times in 40 before, none in 60 after.

The launch here is that one, the cheapest real command whose last work before exiting is such a
read, twenty times against a local S3 server; ``PYTHONFAULTHANDLER=1`` makes an abort print
every thread's stack, which the failure message carries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tasks.store import parquet_table
from tests.conftest import all_cores, tiny_run_config

PROJECT = str(Path(__file__).resolve().parents[1])
LAUNCHES = 20


def _eva(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    from prefect.settings import PREFECT_API_URL

    env = {
        **os.environ,
        "PYTHONPATH": PROJECT,
        "PYTHONFAULTHANDLER": "1",
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
    }
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *argv],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_bytes_are_read_from_a_buffer_arrow_owns(tmp_path) -> None:
    table = pa.table({"prompt_id": ["a", "b"], "responses": [["x", "y"], ["z"]]})
    pq.write_table(table, tmp_path / "t.parquet")
    data = (tmp_path / "t.parquet").read_bytes()
    assert parquet_table(data).equals(pq.read_table(tmp_path / "t.parquet"))
    assert parquet_table(pa.py_buffer(data)).equals(parquet_table(data))
    # A user's parquet prompt file is read the same way.
    from tasks.prompt_files import read_columns

    assert read_columns(str(tmp_path / "t.parquet"), ".parquet", {}) == table.to_pydict()


def test_twenty_launches_that_read_a_run_on_s3_all_exit_0(
    prefect_api, policy_dir, local_s3, tmp_path
) -> None:
    root = "s3://eva-bucket/runs"
    config = tiny_run_config(root, "s3", iterations=0, bootstrap={"init_checkpoint": policy_dir})
    config["storage_options"] = local_s3
    (tmp_path / "s3.json").write_text(json.dumps(config))
    done = _eva("run", "--config", str(tmp_path / "s3.json"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]

    options = json.dumps(local_s3)
    show = ("show", "--run", "s3", "--root", root, "--storage-options", options)
    stage = ("--iteration", "0", "--stage", "generate", "--rows", "2")
    with all_cores(), ThreadPoolExecutor(3) as pool:  # 3 at a time on 2 cores, as measured
        launches = list(pool.map(lambda _: _eva(*show, *stage, cwd=tmp_path), range(LAUNCHES)))
    codes = Counter(done.returncode for done in launches)
    failed = [done for done in launches if done.returncode != 0]
    assert codes == {0: LAUNCHES}, "\n\n".join(
        f"exit {done.returncode}:\n{done.stderr[-4000:]}" for done in failed[:2]
    )
    for done in launches:  # each printed what it read: it finished its work, then exited
        assert '"uri": "iter_0/generate.parquet"' in done.stdout, done.stderr[-2000:]

"""eva's temporary Prefect server: writes that wait instead of failing, and no orphan."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

PROJECT = str(Path(__file__).resolve().parents[1])


def _holds_write_lock_after_a_read(db: Path) -> bool:
    """Open a Prefect transaction on ``db``, read in it, and ask whether another connection
    can write meanwhile (it is not allowed to wait: timeout 0)."""
    import sqlalchemy as sa
    from prefect.server.database.configurations import AioSqliteConfiguration

    async def probe() -> bool:
        config = AioSqliteConfiguration(connection_url=f"sqlite+aiosqlite:///{db}")
        engine = await config.engine()
        try:
            session = await config.session(engine)
            async with session, config.begin_transaction(session):
                await session.execute(sa.text("SELECT count(*) FROM t"))
                other = sqlite3.connect(db, timeout=0)
                try:
                    other.execute("INSERT INTO t VALUES (2)")
                    other.commit()
                    return False
                except sqlite3.OperationalError as exc:
                    assert "database is locked" in str(exc)
                    return True
                finally:
                    other.close()
        finally:
            await engine.dispose()

    return asyncio.run(probe())


def test_write_transactions_take_the_lock_before_their_first_read(tmp_path, monkeypatch) -> None:
    from prefect.server.database.configurations import AioSqliteConfiguration

    from eva_runtime.prefect_server import begin_writes_immediate

    db = tmp_path / "t.db"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE t (x INTEGER)")
    # Prefect's own mode: a transaction that has only read holds no lock, so a write can
    # commit under it, and the transaction's own first write then fails ("database is locked"
    # at once: its snapshot is stale; the busy timeout does not apply).
    assert not _holds_write_lock_after_a_read(db)
    monkeypatch.setattr(  # restored after the test
        AioSqliteConfiguration, "begin_transaction", AioSqliteConfiguration.begin_transaction
    )
    begin_writes_immediate()
    begin_writes_immediate()  # idempotent: one wrapper, not two
    assert AioSqliteConfiguration.begin_transaction.eva_immediate  # type: ignore[attr-defined]
    # eva's: the transaction took the write lock at BEGIN, so the other writer must wait.
    assert _holds_write_lock_after_a_read(db)


def _subflows_after_tasks(rounds: int) -> int:
    """An eva iteration's shape, ``rounds`` times: a task finishes (the server files its events)
    and the flow opens a subflow (the API inserts its tracking task run). Returns how many
    requests the client retried after a 503."""
    from prefect import flow, task

    from eva_runtime.prefect_api import no_heartbeats
    from eva_runtime.prefect_server import counting_retries

    @task
    def stage(i: int) -> int:
        return i

    @flow
    def iteration(i: int) -> int:
        return stage(i)

    @flow
    def run(rounds: int) -> list[int]:
        out = []
        for i in range(rounds):
            stage(i)
            out.append(iteration(i))
        return out

    with counting_retries() as retries, no_heartbeats():
        assert run(rounds) == list(range(rounds))
    return retries.count


def test_subflows_opened_after_tasks_are_never_answered_503(prefect_api) -> None:
    # Prefect's own temporary server answers some of these 503 (the client then waits 2-4 s).
    assert _subflows_after_tasks(20) == 0


def test_eva_prefect_server_is_a_lasting_server_with_the_same_change(tmp_path) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from eva_runtime.process import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(
        PREFECT_HOME=str(tmp_path / "home"),
        PREFECT_SERVER_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp_path / 'p.db'}",
    )
    cli = [sys.executable, "-c", "import sys; from flows.cli import main; sys.exit(main())"]
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [*cli, "prefect-server", "--host", "127.0.0.1", "--port", str(port)],
        env=env, cwd=PROJECT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            try:
                if httpx.get(f"{url}/api/health", trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "no answer from eva prefect-server in 120 s"
            time.sleep(0.2)
        assert "<html" in httpx.get(url, trust_env=False).text.lower()  # with its UI
        # ...which calls this server's port, not Prefect's default 4200.
        ui = httpx.get(f"{url}/ui-settings", trust_env=False).json()
        assert ui["api_url"] == f"{url}/api"
        with temporary_settings(updates={PREFECT_API_URL: f"{url}/api"}):
            assert _subflows_after_tasks(10) == 0
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def test_eva_prefect_server_refuses_what_would_start_it_elsewhere(capsys) -> None:
    from flows.cli import main

    assert main(["prefect-server", "--background"]) == 2
    assert "run it in the foreground" in capsys.readouterr().err


def test_the_temporary_server_stops_with_the_command_even_when_it_is_killed(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(
        EVA_PREFECT_SERVER="temporary",
        PREFECT_SERVER_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp_path / 'p.db'}",
    )
    hold = (
        "import time, flows; from eva_runtime.prefect_api import prefect_api\n"
        "with prefect_api(lambda line: print(line, flush=True)) as url:\n    time.sleep(300)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", hold], env=env, cwd=PROJECT, stdout=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("eva: started a temporary Prefect server at http://127.0.0.1:")
        url = line.split(" at ")[1].split()[0]
        assert httpx.get(f"{url}/health", trust_env=False).json() is True
    finally:
        proc.send_signal(signal.SIGKILL)  # no atexit, no finally: only the guard is left
        proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/health", timeout=1, trust_env=False)
        except httpx.HTTPError:
            return  # gone
        time.sleep(0.2)
    pytest.fail(f"the temporary server at {url} outlived eva's SIGKILL by 30 s")


def test_a_server_that_cannot_start_fails_in_one_message_with_its_log(tmp_path) -> None:
    from eva_runtime.prefect_server import ServerStartError, temporary_server

    missing = tmp_path / "no" / "such" / "dir" / "p.db"
    url = f"sqlite+aiosqlite:///{missing}"
    with (
        pytest.raises(ServerStartError, match="the Prefect server exited with code") as err,
        temporary_server(database_url=url),
    ):
        pytest.fail("the body must not run")
    assert "unable to open database file" in str(err.value)
    # The one line the CLI prints carries the cause, not just "... ends with:".
    line = err.value.line()
    assert line.startswith("the Prefect server exited with code 3 before it was ready (")
    assert "OperationalError) unable to open database file); command: " in line, line


def test_a_prefect_home_whose_folder_is_missing_is_one_line_naming_it(tmp_path, monkeypatch):
    # Prefect makes PREFECT_HOME only where its parent exists (it warns otherwise), and the
    # server then died at startup with an empty line where its cause should be.
    import subprocess
    import sys

    home = tmp_path / "no" / "such" / ".prefect"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), EVA_PREFECT_SERVER="temporary")
    root = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "--root", str(root), "--set", "iterations=0"],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line == (
        f"eva: error: PREFECT_HOME: {home} does not exist, and the Prefect server keeps its "
        f"database there (create it (mkdir -p {home}), or set PREFECT_HOME to a folder that "
        "exists)"
    )
    assert not root.exists() and not home.exists()

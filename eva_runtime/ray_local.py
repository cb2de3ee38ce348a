"""A one-node Ray cluster on 127.0.0.1, for tests, benches and trying ``ray:`` on a laptop.

``with LocalRayCluster(num_cpus=2) as cluster:`` starts ``ray start --head --block`` as a child
of this process, on free ports and in a private temporary folder, waits until its Jobs API
accepts jobs, and yields; ``cluster.address`` is what a stage's ``ray.address`` takes. On exit
it stops that process and then every process it had started (GCS, raylet, dashboard, workers,
job drivers), by pid, and removes the folder: nothing is left running, and no other Ray
cluster on the machine is touched (``ray stop`` would stop them all).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from types import TracebackType

import httpx
import psutil

from eva_runtime.engines import free_port


class LocalRayCluster:
    def __init__(
        self, num_cpus: int = 2, startup_timeout_s: float = 120.0, stop_grace_s: float = 3.0
    ):
        self.num_cpus, self.startup_timeout_s = num_cpus, startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.address = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir = ""
        self.processes: list[psutil.Process] = []  # what stop() stopped, for callers to check

    def __enter__(self) -> LocalRayCluster:
        # Short: Ray's unix sockets live under it, and their paths must fit in 107 bytes.
        self._dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
        dashboard = free_port()
        bin_dir = os.path.dirname(sys.executable)
        ray = os.path.join(bin_dir, "ray")
        argv = [
            ray, "start", "--head", "--block", "--disable-usage-stats",
            "--node-ip-address", "127.0.0.1", "--port", str(free_port()),
            "--num-cpus", str(self.num_cpus), "--num-gpus", "0",
            "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
            "--dashboard-port", str(dashboard),
            "--dashboard-agent-listen-port", str(free_port()),
            "--ray-client-server-port", str(free_port()),
            "--temp-dir", self._dir,
        ]  # fmt: skip
        log = open(os.path.join(self._dir, "ray-start.log"), "wb")
        # Its own session: whatever it starts, and does not move to another session, is found
        # by session id at stop, even once reparented (no ray stop: that stops every cluster).
        # This Python's bin first on its PATH: a job's `python` is then this environment's.
        env = {**os.environ, "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}
        self._proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        log.close()  # the child holds its own descriptor
        self.address = f"http://127.0.0.1:{dashboard}"
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        assert self._proc is not None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {self._proc.returncode}: {self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                # The Jobs API answers once the head's dashboard agent is up.
                if httpx.get(f"{self.address}/api/jobs/", timeout=5).status_code == 200:
                    return
            time.sleep(0.5)
        raise TimeoutError(f"Ray did not start in {self.startup_timeout_s:g} s: {self.log()}")

    def log(self) -> str:
        """The last lines ``ray start`` printed."""
        path = os.path.join(self._dir, "ray-start.log")
        with contextlib.suppress(OSError), open(path, errors="replace") as f:
            return " | ".join(f.read().strip().splitlines()[-5:])
        return ""

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None:
            self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def stop(self) -> None:
        """SIGTERM to every process of this cluster, SIGKILL to what is left after
        ``stop_grace_s`` (raylet and ``ray start`` ignore SIGTERM for long). Its processes are
        ``ray start``'s process tree (job drivers run in sessions of their own) and anything in
        ``ray start``'s session (orphans: the raylet's agents outlive it by a moment)."""
        assert self._proc is not None
        sid = self._proc.pid  # a session leader's pid is its session id
        procs: dict[int, psutil.Process] = {}

        def collect() -> list[psutil.Process]:
            for pid in psutil.pids():
                with contextlib.suppress(OSError, psutil.Error):
                    if pid not in procs and os.getsid(pid) == sid:
                        procs[pid] = psutil.Process(pid)
            for p in list(procs.values()):
                with contextlib.suppress(psutil.Error):
                    procs.update({c.pid: c for c in p.children(recursive=True)})
            return [p for p in procs.values() if p.is_running()]

        for p in collect():
            with contextlib.suppress(psutil.Error):
                p.terminate()
        psutil.wait_procs(collect(), timeout=self.stop_grace_s)
        for _ in range(3):  # anything started while the others went down, too
            alive = collect()
            for p in alive:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            psutil.wait_procs(alive, timeout=10)
        self._proc.wait()
        self._proc = None
        self.processes = list(procs.values())

"""A one-node Ray cluster on 127.0.0.1, for tests, benches and trying ``ray:`` on a laptop.

``with LocalRayCluster(num_cpus=2) as cluster:`` starts ``ray start --head --block`` as a
``ManagedProcess`` (``eva_runtime.process``), on free ports and in a private temporary folder,
waits until its Jobs API accepts jobs, and yields; ``cluster.address`` is what a stage's
``ray.address`` takes. On exit it stops the process tree (GCS, raylet, dashboard, workers, and
the job drivers, which run in sessions of their own) and removes the folder: nothing is left
running, also when eva is killed, and no other Ray cluster on the machine is touched (``ray
stop`` would stop them all).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from types import TracebackType

import httpx
import psutil

from eva_runtime.process import ManagedProcess, free_port, log_tail


class LocalRayCluster:
    def __init__(
        self, num_cpus: int = 2, startup_timeout_s: float = 120.0, stop_grace_s: float = 3.0
    ):
        self.num_cpus, self.startup_timeout_s = num_cpus, startup_timeout_s
        self.stop_grace_s = stop_grace_s  # raylet and `ray start` ignore SIGTERM for long
        self.address = ""
        self._proc: ManagedProcess | None = None
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
        # This Python's bin first on its PATH: a job's `python` is then this environment's.
        env = {"PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}
        self._proc = ManagedProcess(
            argv, env=env, stop_s=self.stop_grace_s, log_path=self._log_path()
        )
        self.address = f"http://127.0.0.1:{dashboard}"
        try:
            self._proc.wait_until(self._jobs_api_up, self.startup_timeout_s, what="ray start")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _jobs_api_up(self) -> bool:
        # The Jobs API answers once the head's dashboard agent is up.
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.address}/api/jobs/", timeout=5).status_code == 200
        return False

    def _log_path(self) -> str:
        return os.path.join(self._dir, "ray-start.log")

    def log(self) -> str:
        """The last lines ``ray start`` printed."""
        return " | ".join(log_tail(self._log_path(), 5).strip().splitlines())

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
        """Stop every process of this cluster (``ManagedProcess.stop``: SIGTERM, then SIGKILL
        after ``stop_grace_s``); ``processes`` are what ran when it was asked to."""
        assert self._proc is not None
        running = []
        for pid in self._proc.members():
            with contextlib.suppress(psutil.Error):
                running.append(psutil.Process(pid))
        self._proc.stop()
        self._proc = None
        self.processes = running

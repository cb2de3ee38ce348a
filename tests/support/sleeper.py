"""A stand-in for a launched training: ``python -m tests.support.sleeper '<json>'``.

It starts a worker in a session of its own (as a Ray job driver or a detached helper would be),
writes ``"<parent pid> <own pid> <worker pid>"`` to the file the JSON's ``pids`` names, prints a
progress mark and a line, and sleeps: a launch that only ends when it is stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from eva_runtime.progress import progress_line


def main() -> None:
    spec = json.loads(sys.argv[1])
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
    )
    tmp = spec["pids"] + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getppid()} {os.getpid()} {worker.pid}")
    os.replace(tmp, spec["pids"])
    print(progress_line(fraction=0.5), flush=True)
    print("training", flush=True)
    time.sleep(300)


if __name__ == "__main__":
    main()

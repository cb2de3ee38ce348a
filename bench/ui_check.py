"""What a user sees in the Prefect UI, checked in a real browser.

Starts a Prefect server, runs a small eva run against it, opens the run's artifacts in headless
Chromium (Debian's `chromium` package), saves screenshots to ``--out`` and checks the rendered
pages: the charts artifact shows its eight charts as images, the summary its held-out columns,
the evolved-prompt and drawn-prompt tables show lineage columns, the creator's decision (draw
rank, weight share) and the originals `mix` kept. Exits 1 naming what is missing.

Screenshots go to ``--out`` (default ``runs-bench/ui``, not tracked); ``--update-docs`` also
copies them over the tracked ones in ``docs/ui``, which a plain check leaves alone.

    python -m bench.ui_check                  # check; screenshots in runs-bench/ui
    python -m bench.ui_check --update-docs    # and refresh docs/ui
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from functools import partial
from typing import Any

import yaml

from eva_runtime.poll import wait_until
from eva_runtime.process import free_port
from flows.config import PROJECT_DIR

RUN = "ui"
# The world demo, smaller: a minute of SFT, 200 prompts, two iterations.
CONFIG = {
    "extends": os.path.join(PROJECT_DIR, "configs", "world.yaml"),
    "run": RUN,
    "iterations": 2,
    "prompts": {"source": {"options": {"size": 200}}},
    "heldout": {"source": {"options": {"size": 100}}},
    "bootstrap": {"builder": {"options": {"sft": {"steps": 300}}}},
}
# artifact key suffix -> texts its rendered page must contain
CHECKS: dict[str, tuple[str, ...]] = {
    "charts": ("Charts of eva run",),
    "summary": ("win_vs_theta_0", "What each iteration did"),
    "iter-1-evolve-evolved": ("parent_id", "root_id", "depth", "parent_informativeness"),
    "iter-1-sample-drawn": ("draw_rank", "weight_share", "root_id"),
    "iter-1-mix-originals-kept": ("prompt_id", "root_id"),
    "iter-1-score-distribution": ("share", "prompts"),
    "iter-1-score-most-informative": ("informativeness", "parent_id"),
}
CHARTS = 8  # flows.run_charts.offline_charts
DOCS = os.path.join(PROJECT_DIR, "docs", "ui")


def _api(url: str, body: dict[str, Any] | None = None) -> Any:
    req = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _healthy(url: str) -> bool:
    try:
        return _api(url) is True
    except OSError:
        return False  # not listening yet


def _chromium(args: list[str]) -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("ui_check: needs Chromium (Debian: apt-get install chromium)")
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000",
           "--window-size=1400,1800", *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", default=os.path.join("runs-bench", "ui"), help="screenshots here")
    p.add_argument(
        "--update-docs", action="store_true",
        help=f"also copy the screenshots over the tracked ones in {DOCS}",
    )  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    work = tempfile.mkdtemp(prefix="eva-ui-")
    env = {**os.environ, "PREFECT_HOME": os.path.join(work, "prefect"),
           "PREFECT_UI_API_URL": f"{base}/api", "PREFECT_API_URL": f"{base}/api",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONPATH": PROJECT_DIR}  # fmt: skip
    server = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "prefect"), "server", "start",
         "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    missing: list[str] = []
    try:
        wait_until(
            partial(_healthy, f"{base}/api/health"), 120, interval_s=1.0,
            what=f"answer from the Prefect server at {base}",
        )  # fmt: skip
        config = os.path.join(work, "ui.yaml")
        with open(config, "w") as f:
            yaml.safe_dump({**CONFIG, "root": os.path.join(work, "runs")}, f)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "flows.cli", "run", "--config", config],
                       env=env, check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        print(f"eva run against {base}: {time.perf_counter() - started:.0f} s")
        for suffix, texts in CHECKS.items():
            key = f"{RUN}-{suffix}"
            found = _api(f"{base}/api/artifacts/filter",
                         {"artifacts": {"key": {"any_": [key]}}, "limit": 1})  # fmt: skip
            if not found:
                missing.append(f"{key}: no such artifact")
                continue
            url = f"{base}/artifacts/artifact/{found[0]['id']}"
            dom = _chromium(["--dump-dom", url])
            _chromium([f"--screenshot={os.path.join(args.out, suffix + '.png')}", url])
            lacks = [t for t in texts if t not in dom]
            if suffix == "charts":
                images = dom.count('src="data:image/svg+xml;base64,')
                if images < CHARTS:
                    lacks.append(f"{CHARTS} chart images (rendered {images})")
            print(f"{key}: {'ok' if not lacks else 'missing ' + ', '.join(lacks)}")
            missing += [f"{key}: {t}" for t in lacks]
        runs = _api(f"{base}/api/flow_runs/filter",
                    {"flow_runs": {"name": {"like_": f"{RUN} @"}}, "limit": 1})  # fmt: skip
        if runs:
            _chromium([f"--screenshot={os.path.join(args.out, 'run.png')}",
                       f"{base}/runs/flow-run/{runs[0]['id']}"])  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    if missing:
        print("ui_check: FAILED\n  " + "\n  ".join(missing))
        return 1
    print(f"ui_check: every page shows what it should; screenshots in {args.out}")
    if args.update_docs:
        print(f"ui_check: {', '.join(update_docs(args.out, DOCS))} copied to {DOCS}")
    return 0


def update_docs(out: str, docs: str) -> list[str]:
    """Copy the screenshots of a passing check over the docs' copies; returns their names."""
    names = sorted(n for n in os.listdir(out) if n.endswith(".png"))
    for name in names:
        shutil.copyfile(os.path.join(out, name), os.path.join(docs, name))
    return names


if __name__ == "__main__":
    sys.exit(main())

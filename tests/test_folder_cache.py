"""The cache of built folders (a GGUF file's checkpoint, a checkpoint's CTranslate2 model): built
once, rebuilt when damaged, nothing left behind by a build killed midway, one build when two
processes need the same folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eva_runtime.folder_cache import CacheError, cached_folder, intact

PROJECT = Path(__file__).resolve().parents[1]


def _build(out: str) -> None:
    os.makedirs(out)
    Path(out, "weights.bin").write_bytes(b"w" * 1000)
    Path(out, "config.json").write_text("{}")


def test_a_folder_is_built_once_and_rebuilt_when_damaged(tmp_path: Path) -> None:
    root = str(tmp_path / "cache")
    folder, built = cached_folder(root, "abc", _build, {"from": "test"})
    assert built and intact(folder) and folder == os.path.join(root, "abc")
    assert cached_folder(root, "abc", _build, {}) == (folder, False)
    os.remove(os.path.join(folder, "weights.bin"))  # deleted by hand
    assert not intact(folder)
    assert cached_folder(root, "abc", _build, {}) == (folder, True)
    Path(folder, "weights.bin").write_bytes(b"w" * 10)  # another size: damaged
    assert cached_folder(root, "abc", _build, {}) == (folder, True)
    assert sorted(os.listdir(root)) == ["abc", "abc.lock"]


def test_a_cache_dir_that_is_a_file_is_refused_before_building(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    calls = []
    with pytest.raises(CacheError) as refused:
        cached_folder(str(blocker / "gguf"), "abc", calls.append, {})
    assert calls == [] and refused.value.field == "EVA_CACHE_DIR"
    assert f"{blocker} is a file" in refused.value.line()


SLOW_BUILD = """
import os, sys, time
from eva_runtime.folder_cache import cached_folder
def build(out):
    os.makedirs(out)
    with open(os.path.join(out, "weights.bin"), "wb") as f:
        f.write(b"w" * 100000)
    print("building", flush=True)
    time.sleep(float(sys.argv[2]))
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write("{}")
    with open(os.path.join(sys.argv[1], "builds.log"), "a") as f:
        f.write("built\\n")
print(cached_folder(sys.argv[1], "key", build, {})[1], flush=True)
"""


def _builder(root: Path, seconds: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", SLOW_BUILD, str(root), str(seconds)],
        cwd=PROJECT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_a_build_killed_midway_leaves_nothing_the_next_one_keeps(tmp_path: Path) -> None:
    builder = _builder(tmp_path, 60)
    assert builder.stdout is not None and builder.stdout.readline() == "building\n"
    staging = [name for name in os.listdir(tmp_path) if ".tmp-" in name]
    assert len(staging) == 1
    os.kill(builder.pid, signal.SIGKILL)
    builder.wait()
    folder, built = cached_folder(str(tmp_path), "key", _build, {})
    assert built and intact(folder)
    assert not [name for name in os.listdir(tmp_path) if ".tmp-" in name]


def test_two_processes_that_need_one_folder_build_it_once(tmp_path: Path) -> None:
    first = _builder(tmp_path, 2)
    assert first.stdout is not None and first.stdout.readline() == "building\n"
    second = _builder(tmp_path, 2)  # waits for the first's lock, then finds the folder built
    outs = [p.communicate(timeout=120)[0].split() for p in (first, second)]
    assert outs == [["True"], ["False"]]
    assert (tmp_path / "builds.log").read_text() == "built\n"
    assert intact(str(tmp_path / "key"))


def test_a_stale_staging_folder_of_another_key_is_swept_only_when_its_builder_is_gone(
    tmp_path: Path,
) -> None:
    running = _builder(tmp_path, 30)
    assert running.stdout is not None and running.stdout.readline() == "building\n"
    dead = tmp_path / "other.tmp-1-deadbeef"
    dead.mkdir()
    cached_folder(str(tmp_path), "third", _build, {})
    names = os.listdir(tmp_path)
    assert "other.tmp-1-deadbeef" not in names  # no process holds other's lock
    assert any(name.startswith("key.tmp-") for name in names)  # its builder is at work
    running.kill()
    running.wait()
    time.sleep(0.1)

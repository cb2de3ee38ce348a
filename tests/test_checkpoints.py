"""A checkpoint named as a GGUF file: what is refused, in one line, before anything runs (its
conversion is tests/test_real_model.py's)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from eva_runtime.errors import ConfigError
from flows.model_checks import check_checkpoint
from tasks.bootstrap import BootstrapConfig
from tasks.checkpoints import gguf_path, is_gguf
from tasks.content_hashes import is_hub_id

PROJECT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("package:no_such_pkg/x.gguf", "no installed Python package 'no_such_pkg'"),
        ("package:pytest/model.gguf", "package 'pytest' has no file 'model.gguf'"),
        ("./missing.gguf", "no GGUF file at './missing.gguf'"),
    ],
)
def test_a_gguf_that_is_not_there_is_refused_naming_it(ref: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BootstrapConfig(init_checkpoint=ref)


def test_a_gguf_is_a_file_never_a_hub_id(tmp_path: Path) -> None:
    assert is_gguf("org/Model.Q4.GGUF") and not is_hub_id("org/model.Q4_1.gguf")
    assert is_hub_id("org/model")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert gguf_path(str(model)) == str(model)
    assert BootstrapConfig(init_checkpoint=str(model)).init_checkpoint == str(model)


def test_without_the_gguf_package_the_run_is_refused_in_one_line(tmp_path, monkeypatch) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a)
    )
    with pytest.raises(ConfigError) as refused:
        check_checkpoint(str(model))
    line = refused.value.line()
    assert line.startswith("bootstrap.init_checkpoint: reading a .gguf checkpoint needs the gguf")
    assert "pip install gguf" in line and "\n" not in line


def test_the_cli_names_the_field_of_a_missing_model_file(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "--config", "configs/smollm2-if.yaml",
         "--root", str(tmp_path), "--set", "bootstrap.init_checkpoint=./gone.gguf"],
        cwd=PROJECT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("eva: error: bootstrap.init_checkpoint") and "gone.gguf" in line

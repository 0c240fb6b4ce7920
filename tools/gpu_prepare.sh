#!/usr/bin/env bash
# Prepare, on a machine with network access, everything the GPU check
# (tools/gpu_check.sh, docs/gpu.md) needs on a GPU machine that has none, or
# whose own Python is too new for MXNet 1.9. Writes into OUTDIR (default
# .gpu/, ignored by git):
#   wheels/   mxnet-cu117==1.9.1 and the rest of requirements.txt for CPython 3.11
#             (+ setuptools, and the CUDA 11.7 runtime from nvidia-cuda-runtime-cu11)
#   debs/     Debian's python3.11 runtime (for a GPU machine whose own Python is
#             3.12 or newer, which numpy 1.23.5 and so MXNet 1.9.1 cannot use)
#   stubs/    stand-ins for the other CUDA 11 libraries libmxnet.so loads
#             (tools/cuda_stubs.py: 1.8 GB of wheels otherwise, and no kernel of
#             theirs has Hopper code): setup succeeds, computation fails loudly
#   parts/    all of it as one tar split into 60 MB parts, for transfers that
#             limit the size of a file; gpu_check.sh joins them (docs/gpu.md)
# Usage: tools/gpu_prepare.sh [--dry-run] [OUTDIR]
set -euo pipefail
DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; shift; fi
OUT="${1:-.gpu}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
run() { echo "+ $*"; if [[ $DRY == 0 ]]; then "$@"; fi; }

mkdir -p "$OUT/wheels" "$OUT/debs" "$OUT/parts" "$OUT/stubs"   # also in a dry run: the plan is written there
# The CPU mxnet wheel is replaced by the CUDA 11.7 build (509 MB; it loads the CUDA 11
# libraries dynamically: the runtime is carried, the others are stubbed below).
grep -v '^mxnet==' "$ROOT/requirements.txt" | grep -v '^#' | grep -v '^ruff\|^hypothesis' \
    > "$OUT/requirements-gpu.txt" || true
printf 'mxnet-cu117==1.9.1\nnvidia-cuda-runtime-cu11==11.7.99\nsetuptools==69.5.1\n' \
    >> "$OUT/requirements-gpu.txt"
run "$PY" -m pip download --only-binary=:all: --python-version 3.11 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 -d "$OUT/wheels" -r "$OUT/requirements-gpu.txt"
# Python 3.11 itself, unpacked there with dpkg -x (no root filesystem changes).
(cd "$OUT/debs" && run apt-get download python3.11 python3.11-minimal libpython3.11 \
    libpython3.11-minimal libpython3.11-stdlib libexpat1 libdb5.3 libnsl2 libtirpc3 \
    libffi8 libssl3 zlib1g libbz2-1.0 liblzma5 libsqlite3-0 libncursesw6 libtinfo6 \
    libreadline8 libuuid1 libgomp1 libquadmath0 libgfortran5)
# Stubs for the CUDA 11 libraries other than the runtime (see tools/cuda_stubs.py).
if [[ $DRY == 0 ]]; then
    unzip -o -q "$OUT"/wheels/mxnet_cu117-*.whl mxnet/libmxnet.so -d "$OUT/tmp"
    "$PY" "$ROOT/tools/cuda_stubs.py" "$OUT/tmp/mxnet/libmxnet.so" "$OUT/stubs"
    rm -rf "$OUT/tmp"
fi
# The native library built here (against the same MXNet headers), in case the
# GPU machine has no C++ compiler.
run cp "$ROOT"/mxnet_mpi/_libmxnet_mpi*.so "$OUT/wheels/"
run rm -f "$OUT"/parts/stack.tar.part-*
run tar -C "$OUT" -cf "$OUT/stack.tar" wheels debs stubs requirements-gpu.txt
run split -b 60M -d "$OUT/stack.tar" "$OUT/parts/stack.tar.part-"
run rm -f "$OUT/stack.tar"
if [[ $DRY == 0 ]]; then
    ls -l "$OUT/parts"
    echo "parts: $(ls "$OUT/parts" | wc -l); copy them to the GPU machine, then make gpu-check (docs/gpu.md)"
fi

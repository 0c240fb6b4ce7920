# One-command entry points (see README). Everything lives in .venv/.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
NP ?= 2
# Open MPI refuses to run as root without these; harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
# Open MPI transport defaults (mxnet_mpi/transport.py, which `import mxnet_mpi`
# applies too): 4 TCP connections per peer. A value set in the environment or
# on the command line wins; MXNET_MPI_TRANSPORT_DEFAULTS=0 turns them off. The
# one that depends on the host (no OFI BTL without an RDMA device) is left to
# `import mxnet_mpi` in each rank.
ifneq ($(filter 0 false no off,$(MXNET_MPI_TRANSPORT_DEFAULTS)),)
else
OMPI_MCA_btl_tcp_links ?= 4
export OMPI_MCA_btl_tcp_links
endif

.PHONY: run test build venv lint bench clean bench-allreduce bench-epoch bench-overlap \
	bench-overhead bench-faults bench-cluster bench-preempt bench-startup data gpu-prepare gpu-check

run: build
	$(VENV)/bin/mpirun -np $(NP) --oversubscribe $(PY) examples/train_gluon.py --steps 20

# Three workers on two cores: much of a test's time is starting MXNet in fresh
# processes (about 0.7 s of CPU each with tests/site, 1.6 s without) and waiting
# on timeouts, which a third worker fills (measured on 2 cores, same commit:
# 444 s with two workers, 369 s with three). A file stays on one worker, so its shared results are made once;
# tests/conftest.py starts the longest first. compileall: with
# PYTHONDONTWRITEBYTECODE set, each process would compile the package again.
test: build
	$(PY) -m compileall -q mxnet_mpi tests _mxnet_mpi_autoload.py
	$(PY) -m pytest tests -q -n 3 --dist loadfile --no-loadscope-reorder

build: $(VENV)/.built

# Rebuild the native library only when its sources or the stack change. The
# editable install also puts the start-up hook (mxnet_mpi_autoload.pth) into
# the venv, so `kvstore='mpi'` works there under plain mpirun, as after `pip install`.
$(VENV)/.built: $(VENV)/.deps setup.py pyproject.toml mxnet_mpi_autoload.pth \
		$(wildcard kvstore/*.cc kvstore/*.h)
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	$(PY) -c "import mxnet_mpi._native"
	touch $@

venv: $(VENV)/.deps

$(VENV)/.deps: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip==26.3 setuptools==84.2.1 wheel==0.48.0
	$(PY) -m pip install -q -r requirements.txt
	touch $@

lint: build
	$(VENV)/bin/ruff check mxnet_mpi tests examples benchmarks tools setup.py _mxnet_mpi_autoload.py

clean:
	rm -rf build *.egg-info mxnet_mpi/*.so $(VENV)/.built

# Benchmarks (tables on stdout; CSV + PNG in benchmarks/results/). Extra options:
# make bench-allreduce BENCH_ARGS=--quick. Horovod rows need benchmarks/setup_horovod.sh.
# Each CSV gets a note beside it (machine, date, load, command, commit);
# BENCH_NOTE='machine shared with ...' adds to it. Then `make report`.
bench-allreduce: build
	$(PY) benchmarks/allreduce.py --np $(NP) $(BENCH_ARGS)

bench-epoch: build
	$(PY) benchmarks/epoch_time.py $(BENCH_ARGS)

bench-overlap: build
	$(PY) benchmarks/overlap.py --np $(NP) $(BENCH_ARGS)

bench-overhead: build
	$(PY) benchmarks/overhead.py --np $(NP) $(BENCH_ARGS)

# docs/benchmarks.md (and the generated blocks of other docs pages) from benchmarks/results/.
# Standard library only: needs no build.
.PHONY: report
report:
	$(or $(wildcard $(PY)),$(PYTHON)) benchmarks/report.py

# GPU check (docs/gpu.md): prepare the parts here, run the check on a GPU machine.
GPU_STAGE ?= .gpu
GPU_RESULTS ?= gpu-results
gpu-prepare: build
	tools/gpu_prepare.sh .gpu

gpu-check:
	tools/gpu_check.sh $(GPU_STAGE) $(GPU_RESULTS)

bench-faults: build
	$(PY) benchmarks/faults.py $(BENCH_ARGS)

# MPI's start with and without mxnet_mpi's transport defaults (about a minute)
bench-startup: build
	$(PY) benchmarks/startup.py $(BENCH_ARGS)

# 2 hosts as network namespaces over shaped links (needs root): BENCH_ARGS=--quick
bench-cluster: build
	$(PY) benchmarks/cluster.py $(BENCH_ARGS)

# Overlap across steps: funneled with pre-emption on and off, on the cluster in a
# box (needs root; BENCH_ARGS=--shm for 2 ranks on this machine)
bench-preempt: build
	$(PY) benchmarks/preempt.py $(BENCH_ARGS)

# Small generated datasets for the examples (nothing downloaded).
data: build
	$(PY) examples/make_imagenet_rec.py --out data/imagenet-small
	$(PY) examples/make_cifar10.py --out data

"""``import mxnet_mpi.horovod as hvd``: the public API of ``horovod.mxnet``
0.28.1 on mxnet_mpi's engine-embedded collectives.

A script written for Horovod runs with only its import line changed, under
plain ``mpirun``. Semantics follow Horovod's: ``allreduce`` **averages** by
default (``op=hvd.Sum`` sums; ``hvd.Min``, ``hvd.Max``, ``hvd.Product``);
``DistributedTrainer`` and ``DistributedOptimizer`` sum gradients and divide
by the process set's size through the optimizer's rescaling; ``rank()`` and
the other queries raise ValueError before ``init()``; ``alltoall`` with
``splits`` returns (tensor, received splits).

Collectives on the global process set run on the world, in the free
functions' (chained) stream. Every other process set has an MPI
sub-communicator of its ranks and a funneled stream of its own (made when the
set is registered, collectively over the world), so collectives of different
sets never wait for each other's order. What deliberately differs is listed in
docs/horovod.md: Adasum, ``init(comm=...)`` with less than the whole world,
process sets made from mpi4py communicators, cycle marks in the timeline.
"""

from __future__ import annotations

import os
import warnings

from . import timeline
from .horovod_collectives import (  # noqa: F401  (the public API)
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_object,
    allreduce,
    allreduce_,
    alltoall,
    broadcast,
    broadcast_,
    broadcast_object,
    grouped_allgather,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_reducescatter,
    reducescatter,
)
from .horovod_state import (  # noqa: F401  (the public API)
    ProcessSet,
    _require_init,
    _state,
    add_process_set,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    size,
    split_list,
)
from .horovod_training import (  # noqa: F401  (the public API; the compressions' classes)
    SETTINGS_UPDATES,
    Compression,
    DistributedOptimizer,
    DistributedTrainer,
    _FP16Compression,
    _NoCompression,
    broadcast_parameters,
)
from .world import finalize, on_exit

# Pickles (saved optimizer states) and reprs name the public classes here,
# where they are used from, not in the module that holds them.
for _cls in (ProcessSet, Compression, DistributedOptimizer, DistributedTrainer,
             _NoCompression, _FP16Compression):
    _cls.__module__ = __name__
del _cls


def shutdown() -> None:
    """End this rank's part in the job: writes a running timeline, finalises
    MPI (init() cannot follow)."""
    if _state.timeline_path is not None:
        stop_timeline()
    finalize()
    _state.__init__()
    global_process_set.ranks = []


# ---------------------------------------------------------------- timeline
def _write_timeline() -> None:
    me = rank()
    path = _state.timeline_path
    # Horovod's file for rank 0, the others beside it (and every rank's in a directory)
    own = me == 0 and not timeline.names_directory(path)
    timeline.write(path if own else timeline.rank_path(path, me), me)


def _timeline_at_exit() -> None:
    if _state.timeline_path is not None:
        _write_timeline()


def start_timeline(file_path, mark_cycles: bool = False) -> None:
    """Record every collective of this process from now on: rank 0 writes
    `file_path`, rank r > 0 ``<stem>.rank<r>.<suffix>`` beside it (a
    directory: each rank ``trace.rank<r>.json`` in it), at stop_timeline() (or
    at exit). Starting again switches files."""
    _require_init()
    if timeline.requested():
        raise ValueError("the timeline already records for %s=%s (from MPI initialisation to "
                         "exit); unset it to use hvd.start_timeline"
                         % (timeline.ENV_VAR, timeline.requested()))
    if not isinstance(file_path, (str, os.PathLike)):
        raise ValueError("file_path must be a path, got %s" % type(file_path).__name__)
    if mark_cycles:
        warnings.warn("hvd.start_timeline(mark_cycles=True): mxnet_mpi's timeline has no "
                      "cycle marks (it records each collective's wait for inputs, queueing and "
                      "MPI time); mark_cycles is ignored", stacklevel=2)
    if _state.timeline_path is not None:
        stop_timeline()
    _state.timeline_path = os.fspath(file_path)
    timeline.start()
    if not _state.timeline_hooked:
        _state.timeline_hooked = True
        on_exit(_timeline_at_exit)


def stop_timeline() -> None:
    """Stop recording and write the timeline (nothing if none is recording)."""
    _require_init()
    if _state.timeline_path is None:
        return
    try:
        _write_timeline()
    finally:
        _state.timeline_path = None
        timeline.stop()

"""The MPI world of this process: lazy initialisation, ranks, communicators.

MPI is initialised on first use (not at import), by the native library's
owner thread, and finalised at interpreter exit after MXNet's engine has
drained. A world of size 1 (no mpirun) behaves like any other.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
from dataclasses import dataclass

import mxnet as mx

from . import timeline
from ._native import LIB, check
from .errors import MPIKVStoreError
from .settings import env_number

THREAD_SERIALIZED = 2
THREAD_MULTIPLE = 3

# Reliability settings, read once when MPI is initialised (README: "When
# things go wrong"). name -> default
SETTINGS = {
    "MXNET_MPI_CHECK_SIGNATURES": 1.0,  # ranks agree on each collective (key, shape, dtype)
    "MXNET_MPI_STALL_WARN_S": 60.0,     # warn about a collective waiting this long
    "MXNET_MPI_STALL_ABORT_S": 600.0,   # abort the job when it has waited this long
    "MXNET_MPI_HEALTH_INTERVAL_S": 1.0,  # period of the cross-rank health rounds; 0 = off
}


def _setting(name: str) -> float:
    return env_number(name, SETTINGS[name])


@dataclass(frozen=True)
class Communicator:
    """A native MPI communicator: ``id`` is the library's handle (0 = world)."""

    id: int
    rank: int
    size: int

    def split(self, color: int, key: int | None = None) -> Communicator | None:
        """Collective over this communicator, as MPI_Comm_split; None if color < 0."""
        return _split(self.id, color, self.rank if key is None else key)

    def dup(self) -> Communicator:
        """Collective over this communicator: a new one with the same members."""
        comm = _split(self.id, 0, self.rank)
        assert comm is not None
        return comm

    def free(self) -> None:
        if self.id > 0 and _state.world is not None:
            LIB.mxmpi_comm_free(self.id)


@dataclass
class _State:
    world: Communicator | None = None
    local_rank: int = 0
    local_size: int = 1
    thread_level: int = 0


_state = _State()
_lock = threading.Lock()


def init() -> Communicator:
    """Initialise MPI (idempotent) and return the world communicator."""
    with _lock:
        if _state.world is not None:
            return _state.world
        warn, abort = _setting("MXNET_MPI_STALL_WARN_S"), _setting("MXNET_MPI_STALL_ABORT_S")
        if abort < warn:
            raise MPIKVStoreError("MXNET_MPI_STALL_ABORT_S (%g) must be >= "
                                  "MXNET_MPI_STALL_WARN_S (%g)" % (abort, warn))
        LIB.mxmpi_configure(int(_setting("MXNET_MPI_CHECK_SIGNATURES")), warn, abort,
                            _setting("MXNET_MPI_HEALTH_INTERVAL_S"))
        if timeline.requested():
            timeline.start()
        # Open MPI's default non-blocking allreduce (what mode 'concurrent' uses)
        # is ~2.5x slower than its blocking one for large arrays here; reduce-
        # scatter + allgather (Rabenseifner) matches it (benchmarks/allreduce.py).
        # Read by MPI_Init; the user's own setting wins.
        os.environ.setdefault("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3")
        out = [ctypes.c_int() for _ in range(5)]
        check(LIB.mxmpi_init(THREAD_MULTIPLE, *[ctypes.byref(o) for o in out]))
        provided, rank, size, local_rank, local_size = (o.value for o in out)
        if provided < THREAD_SERIALIZED:
            LIB.mxmpi_finalize()
            raise RuntimeError(
                "mxnet_mpi: MPI was initialised (e.g. by mpi4py) with thread level %d; "
                "mxnet_mpi calls MPI from its own thread and needs at least "
                "MPI_THREAD_SERIALIZED" % provided)
        _state.world = Communicator(0, rank, size)
        _state.local_rank, _state.local_size = local_rank, local_size
        _state.thread_level = provided
        atexit.register(finalize)
        if size > 1 and os.environ.get("MXNET_MPI_ABORT_ON_EXCEPTION", "1") != "0":
            _install_abort_hook()
        return _state.world


def finalize() -> None:
    """Wait for MXNet's engine, then free communicators and finalise MPI."""
    with _lock:
        if _state.world is None:
            return
        mx.nd.waitall()
        if timeline.requested():
            timeline.dump(timeline.requested(), _state.world.rank)
        LIB.mxmpi_finalize()
        _state.world = None
        from . import modes
        modes._forget()


def _split(parent: int, color: int, key: int) -> Communicator | None:
    init()
    if _state.thread_level < THREAD_MULTIPLE:
        # Without MPI_THREAD_MULTIPLE no collective may be running meanwhile.
        mx.nd.waitall()
    out = ctypes.c_int()
    check(LIB.mxmpi_comm_split(parent, color, key, ctypes.byref(out)))
    if out.value < 0:
        return None
    r, s = ctypes.c_int(), ctypes.c_int()
    check(LIB.mxmpi_comm_info(out.value, ctypes.byref(r), ctypes.byref(s)))
    return Communicator(out.value, r.value, s.value)


def _install_abort_hook() -> None:
    """An uncaught exception on one rank aborts the job instead of hanging its peers."""
    previous = sys.excepthook

    def hook(etype, value, tb):
        previous(etype, value, tb)
        sys.stderr.write("mxnet_mpi: rank %d raised %s; aborting the MPI job\n"
                         % (_state.world.rank if _state.world else -1, etype.__name__))
        sys.stderr.flush()
        LIB.mxmpi_abort(1)

    sys.excepthook = hook


def world() -> Communicator:
    """The world communicator (initialises MPI on first call)."""
    return init()


def rank() -> int:
    """This process's rank in MPI_COMM_WORLD."""
    return init().rank


def size() -> int:
    """Number of processes in MPI_COMM_WORLD."""
    return init().size


def local_rank() -> int:
    """Rank among the processes on this host (use it to pick a GPU)."""
    init()
    return _state.local_rank


def local_size() -> int:
    """Number of processes on this host."""
    init()
    return _state.local_size


def thread_level() -> int:
    """The MPI thread level provided (2 = serialized, 3 = multiple)."""
    init()
    return _state.thread_level

"""ctypes binding to the native library built from kvstore/."""

from __future__ import annotations

import ctypes
import importlib.util

import mxnet  # noqa: F401  (libmxnet.so must be loaded before our library)
from mxnet.base import NDArrayHandle

# collective kinds (kvstore/request.h OpKind)
ALLREDUCE = 0
BROADCAST = 1
ALLGATHER = 2
ALLTOALL = 3
REDUCE_SCATTER = 4

# request flags (kvstore/request.h RequestFlags)
FLAG_AVERAGE = 1
FLAG_COMPRESS_FP16 = 2
FLAG_MIN = 4
FLAG_MAX = 8
FLAG_PRODUCT = 16

# store kinds (kvstore/store.h ExecKind)
EXEC_CHAINED = 0
EXEC_FUNNELED = 1
EXEC_CONCURRENT = 2

DEFAULT_STORE = 0  # created by mxmpi_init over the world: the free functions' store


class NativeError(RuntimeError):
    """An error reported by the native MPI layer."""


class CallDesc(ctypes.Structure):
    """One collective as the native library takes it (kvstore/engine_ops.h)."""

    _fields_ = [
        ("op", ctypes.c_int32), ("dtype", ctypes.c_int32), ("root", ctypes.c_int32),
        ("priority", ctypes.c_int32), ("flags", ctypes.c_int32), ("nparts", ctypes.c_int32),
        ("ins", ctypes.POINTER(NDArrayHandle)), ("outs", ctypes.POINTER(NDArrayHandle)),
        ("shapes", ctypes.POINTER(ctypes.c_int64)),
        ("desc", ctypes.c_char_p), ("label", ctypes.c_char_p), ("token", ctypes.c_char_p),
        ("splits", ctypes.POINTER(ctypes.c_int64)), ("nsplits", ctypes.c_int64),
        ("row", ctypes.c_int64), ("aux", NDArrayHandle), ("name", ctypes.c_char_p),
    ]


def _load() -> ctypes.CDLL:
    spec = importlib.util.find_spec("mxnet_mpi._libmxnet_mpi")
    if spec is None or not spec.origin:
        raise ImportError("mxnet_mpi's native library is not built: run `make build` "
                          "(or `pip install -e .`) in the mxnet-mpi checkout")
    # RTLD_GLOBAL: Open MPI's components resolve libmpi symbols through it.
    lib = ctypes.CDLL(spec.origin, mode=ctypes.RTLD_GLOBAL)
    lib.mxmpi_last_error.restype = ctypes.c_char_p
    i, d, i64 = ctypes.c_int, ctypes.c_double, ctypes.c_int64
    pi, pi64 = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int64)
    lib.mxmpi_init.argtypes = [i, pi, pi, pi, pi, pi]
    lib.mxmpi_announce_finish.argtypes = []
    lib.mxmpi_finalize.argtypes = []
    lib.mxmpi_python_exit.argtypes = []
    lib.mxmpi_abort.argtypes = [i]
    lib.mxmpi_forked.argtypes = []
    lib.mxmpi_configure.argtypes = [d, d, d]
    lib.mxmpi_comm_split.argtypes = [i, i, i, pi]
    lib.mxmpi_comm_info.argtypes = [i, pi, pi]
    lib.mxmpi_comm_free.argtypes = [i]
    lib.mxmpi_store_create.argtypes = [i, i, ctypes.c_char_p, i64, i64, i64, i, i, pi]
    lib.mxmpi_store_push.argtypes = [i, ctypes.POINTER(CallDesc), i, i, pi, ctypes.c_char_p]
    lib.mxmpi_store_join.argtypes = [i]
    lib.mxmpi_store_close.argtypes = [i]
    lib.mxmpi_store_info.argtypes = [i, pi64, pi64, pi64]
    lib.mxmpi_server_wait.argtypes = [NDArrayHandle, ctypes.c_char_p, i, pi64]
    lib.mxmpi_hold_write.argtypes = [NDArrayHandle, ctypes.c_char_p, pi64]
    lib.mxmpi_release_write.argtypes = [i64, NDArrayHandle]
    lib.mxmpi_timeline_start.argtypes = []
    lib.mxmpi_timeline_stop.argtypes = []
    lib.mxmpi_timeline_dump.argtypes = [ctypes.c_char_p, i]
    return lib


LIB = _load()


def last_error() -> str:
    return LIB.mxmpi_last_error().decode(errors="replace")


def check(rc: int) -> None:
    """Raise NativeError with the library's message if a call failed."""
    if rc != 0:
        raise NativeError(last_error())


def server_wait(arr, desc: str, begin: bool, wait_id: int = 0) -> int:
    """Mark a parameter-server wait on NDArray `arr` as a health flight: `begin`
    (an engine op reading `arr`, queued before the request that writes it)
    returns an id; the end call with that id (queued after the request) closes
    it. A flight that outlives the stall settings warns and aborts the job."""
    out = ctypes.c_int64(wait_id)
    check(LIB.mxmpi_server_wait(arr.handle, desc.encode(), int(begin), ctypes.byref(out)))
    return out.value


def hold_write(arr, desc: str) -> int:
    """Push an engine op that holds float64 host array `arr` as written until
    release_write(ticket, ...): readers of `arr` may be pushed before its value
    is computed. Stall warnings name `desc`, and whether the release is pushed."""
    ticket = ctypes.c_int64()
    check(LIB.mxmpi_hold_write(arr.handle, desc.encode(), ctypes.byref(ticket)))
    return ticket.value


def release_write(ticket: int, src) -> None:
    """Push an op that copies `src` (same size, float64, host) into the held array
    once `src` is computed, and ends the held write."""
    check(LIB.mxmpi_release_write(ticket, src.handle))

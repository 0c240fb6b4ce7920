"""ctypes binding to the native library built from kvstore/."""

from __future__ import annotations

import ctypes
import importlib.util

import mxnet  # noqa: F401  (libmxnet.so must be loaded before our library)
from mxnet.base import NDArrayHandle

ALLREDUCE = 0
BROADCAST = 1

# executor kinds (kvstore/executors.h)
EXEC_CHAINED = 0
EXEC_FUNNELED = 1
EXEC_CONCURRENT = 2


class NativeError(RuntimeError):
    """An error reported by the native MPI layer."""


def _load() -> ctypes.CDLL:
    spec = importlib.util.find_spec("mxnet_mpi._libmxnet_mpi")
    if spec is None or not spec.origin:
        raise ImportError("mxnet_mpi's native library is not built: run `make build` "
                          "(or `pip install -e .`) in the mxnet-mpi checkout")
    # RTLD_GLOBAL: Open MPI's components resolve libmpi symbols through it.
    lib = ctypes.CDLL(spec.origin, mode=ctypes.RTLD_GLOBAL)
    lib.mxmpi_last_error.restype = ctypes.c_char_p
    i = ctypes.c_int
    pi = ctypes.POINTER(ctypes.c_int)
    lib.mxmpi_init.argtypes = [i, pi, pi, pi, pi, pi]
    lib.mxmpi_finalize.argtypes = []
    lib.mxmpi_abort.argtypes = [i]
    d = ctypes.c_double
    lib.mxmpi_configure.argtypes = [i, d, d, d]
    lib.mxmpi_comm_split.argtypes = [i, i, i, pi]
    lib.mxmpi_comm_info.argtypes = [i, pi, pi]
    lib.mxmpi_comm_free.argtypes = [i]
    lib.mxmpi_push.argtypes = [i, NDArrayHandle, NDArrayHandle, NDArrayHandle, ctypes.c_int64,
                               i, i, i, i, ctypes.c_char_p, i, i]
    lib.mxmpi_executor_create.argtypes = [i, i, ctypes.c_int64, i, pi]
    lib.mxmpi_executor_free.argtypes = [i]
    lib.mxmpi_timeline_start.argtypes = []
    lib.mxmpi_timeline_dump.argtypes = [ctypes.c_char_p, i]
    return lib


LIB = _load()


def check(rc: int) -> None:
    """Raise NativeError with the library's message if a call failed."""
    if rc != 0:
        raise NativeError(LIB.mxmpi_last_error().decode())

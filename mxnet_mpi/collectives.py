"""Engine-embedded collectives on single NDArrays.

Each call validates its arguments on the Python thread, then pushes one op
into MXNet's dependency engine and returns at once: the input is a read
dependency, the output a write dependency. MPI runs later, on the native
owner thread, when the engine has made the input ready.
"""

from __future__ import annotations

import os

import mxnet as mx
import numpy as np

from . import _native, modes
from .errors import MPIKVStoreError
from .world import Communicator

# numpy dtype -> MXNet dtype code (mshadow TypeFlag)
DTYPE_CODES = {
    np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.float16): 2,
    np.dtype(np.uint8): 3, np.dtype(np.int32): 4, np.dtype(np.int8): 5,
    np.dtype(np.int64): 6,
}
SUPPORTED_DTYPES = tuple(str(d) for d in DTYPE_CODES)

# Contexts whose memory the CPU (and so MPI) can address directly.
_HOST_DEVICE_TYPES = ("cpu", "cpu_pinned", "cpu_shared")


def _engine_is_synchronous() -> bool:
    return os.environ.get("MXNET_ENGINE_TYPE", "") == "NaiveEngine"


def check_array(arr, what: str, sparse_hint: str = "") -> None:
    """Raise MPIKVStoreError unless `arr` is a dense NDArray of a supported dtype."""
    if not isinstance(arr, mx.nd.NDArray):
        raise MPIKVStoreError("%s must be an mxnet NDArray, got %s" % (what, type(arr).__name__))
    if arr.stype != "default":
        raise MPIKVStoreError(
            "%s has storage type '%s'; MPI stores reduce dense arrays only%s"
            % (what, arr.stype, sparse_hint))
    if np.dtype(arr.dtype) not in DTYPE_CODES:
        raise MPIKVStoreError("%s has dtype %s; supported dtypes are %s"
                              % (what, np.dtype(arr.dtype), ", ".join(SUPPORTED_DTYPES)))


def check_same_layout(ref, arr, what: str) -> None:
    """Raise MPIKVStoreError unless `arr` has the shape and dtype of `ref`."""
    if tuple(arr.shape) != tuple(ref.shape) or np.dtype(arr.dtype) != np.dtype(ref.dtype):
        raise MPIKVStoreError("%s has shape %s and dtype %s, expected shape %s and dtype %s"
                              % (what, tuple(arr.shape), np.dtype(arr.dtype),
                                 tuple(ref.shape), np.dtype(ref.dtype)))


def _push(op: int, src, dst, comm: Communicator, root: int, priority: int, name: str,
          chain, executor: int) -> None:
    count = int(np.prod(src.shape, dtype=np.int64))
    _native.check(_native.LIB.mxmpi_push(
        op, src.handle, dst.handle, chain.handle if chain is not None else None, count,
        DTYPE_CODES[np.dtype(src.dtype)], comm.id, root, int(priority), name.encode(),
        int(_engine_is_synchronous()), executor))


def _on_host(arr) -> bool:
    return arr.context.device_type in _HOST_DEVICE_TYPES


def collective(op: int, src, dst, comm: Communicator, *, root: int = 0, priority: int = 0,
               name: str = "", chain=None, executor: int | None = None) -> None:
    """Push allreduce (sum of `src` over `comm` into `dst`) or broadcast (root's `src`
    into every `dst`). `src` may be `dst` (in place). `chain`: an extra engine
    variable to write (serialises collectives); `executor`: a native executor
    from ``modes.create_executor`` (default: the process-wide chained one,
    with the process-wide chain). Device arrays are staged through host
    memory with engine copies, so ordering is still the engine's."""
    if executor is None:
        executor, chain = modes.default_executor(), modes.chain_var()
    if not name:
        name = "%s shape=%s %s" % ("allreduce_" if op == _native.ALLREDUCE else "broadcast_",
                                   tuple(src.shape), np.dtype(src.dtype))
    if _on_host(src) and _on_host(dst):
        _push(op, src, dst, comm, root, priority, name, chain, executor)
        return
    host = mx.nd.empty(src.shape, ctx=mx.cpu_pinned(), dtype=src.dtype)
    src.copyto(host)
    _push(op, host, host, comm, root, priority, name, chain, executor)
    host.copyto(dst)


def allreduce_(src, dst, comm: Communicator, **kw) -> None:
    """Sum `src` over all ranks of `comm` into `dst` (engine op, returns at once)."""
    collective(_native.ALLREDUCE, src, dst, comm, **kw)


def broadcast_(src, dst, comm: Communicator, root: int = 0, **kw) -> None:
    """Copy rank `root`'s `src` into `dst` on every rank (engine op, returns at once)."""
    collective(_native.BROADCAST, src, dst, comm, root=root, **kw)

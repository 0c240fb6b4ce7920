"""Collectives on NDArrays, each an engine op (read its input, write its output):
allreduce (sum, average, min, max or product), broadcast, allgather, alltoall,
reduce_scatter and a grouped allreduce issued as one unit. This is
mxnet_mpi's one public collective API (``mxnet_mpi.allreduce_`` and
``mxnet_mpi.broadcast_`` are these functions); ``mxnet_mpi.horovod`` wraps it
with Horovod's signatures and defaults.

Where a collective runs: by default on the free functions' stream over the
world (the ``chained`` mode); ``comm=c`` runs it over a communicator made by
``mxnet_mpi.world().split(...)``/``.dup()`` (the free functions' chained
stream of that communicator); ``store=kv`` on the stream of any of our stores
(that store's mode and communicator). Like every collective here, ranks agree
on each one before its data moves: a shape, dtype or split that does not
match across ranks is the same ``MPIKVStoreError`` on every rank, and bad
input found on one rank fails the collective on its peers too. ``allgather``
and ``alltoall`` first exchange the first dimensions (one small collective
whose result the Python thread waits for) to size their output.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import numbers
from typing import Sequence

import mxnet as mx
import numpy as np

from . import _native
from .collectives import (
    FLOAT_DTYPES,
    Call,
    ThreadWarning,
    check_array,
    on_host,
    stream_for,
    token_call,
)
from .errors import MPIKVStoreError
from .world import Communicator, init

# Reductions of allreduce (`op=`): name -> request flag.
REDUCTIONS = {"sum": 0, "average": _native.FLAG_AVERAGE, "min": _native.FLAG_MIN,
              "max": _native.FLAG_MAX, "product": _native.FLAG_PRODUCT}


def _place(store, comm) -> tuple:
    """(stream, communicator) a collective runs on: `store`'s, `comm`'s free
    functions' stream, or the world's."""
    if store is not None and comm is not None:
        raise MPIKVStoreError("give store= or comm=, not both")
    if store is not None:
        if not (hasattr(store, "stream") and hasattr(store, "comm")):
            raise MPIKVStoreError("store= takes one of mxnet_mpi's stores (mx.kv.create('mpi'), "
                                  "...), got %s" % type(store).__name__)
        return store.stream, store.comm
    if comm is not None:
        if not isinstance(comm, Communicator):
            raise MPIKVStoreError("comm= takes a communicator from mxnet_mpi.world() (or its "
                                  ".split()/.dup()), got %s" % type(comm).__name__)
        return stream_for(comm), comm
    return stream_for(None), init()


def _stream(store, comm=None):
    return _place(store, comm)[0]


def _comm(store, comm=None):
    return _place(store, comm)[1]


def _check_args(name, priority) -> None:
    if name is not None and not isinstance(name, str):
        raise MPIKVStoreError("name must be a string or None, got %s" % type(name).__name__)
    if isinstance(priority, bool) or not isinstance(priority, numbers.Integral):
        raise MPIKVStoreError("priority must be an integer, got %s" % type(priority).__name__)
    if name is None:
        _unnamed.note()


# Unnamed collectives of one shape from two threads pair by the order each rank
# happened to push them, mixing the threads' values; names make ranks compare them.
_unnamed = ThreadWarning(
    "mxnet_mpi: collectives without name= are issued from threads %(first)r and %(now)r: "
    "ranks pair them by the order they were pushed, which threads can make differ between "
    "ranks; give each a name= (docs/store.md#threads)")


def _old_spelling(verb: str, arg) -> None:
    """The old `mxnet_mpi.allreduce_(src, dst, comm)` form passed an array second."""
    if isinstance(arg, mx.nd.NDArray):
        raise MPIKVStoreError(
            "%s(src, dst, comm) is no longer the signature: use %s(tensor, comm=comm) (in "
            "place; mxnet_mpi.ops.%s(tensor, comm=comm) for a new array). See "
            "docs/collectives.md" % (verb, verb, verb.rstrip("_")))


def _host(arr):
    """`arr`, or a host copy of it (engine copy) when it lives on a device."""
    return arr if on_host(arr) else arr.as_in_context(mx.cpu())


def _row(shape: tuple) -> int:
    return int(np.prod(shape[1:])) if len(shape) > 1 else 1


def _text(name: str | None, verb: str, shape_text: str, dtype) -> str:
    return "%s%s %s %s" % (verb, " %r" % name if name else "", shape_text, np.dtype(dtype))


def _push(store, call: Call, comm=None) -> None:
    _pushed[0] += 1   # before: a call refused natively still took its place
    _stream(store, comm).push([call])


_pushed = [0]


def _agreed(verb: str, op: int):
    """Bad input found here, before this rank issued anything, still takes part
    (as a failure token) in the collective its peers issue first, so they get
    the error too instead of waiting for this rank."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            before = _pushed[0]
            try:
                return fn(*args, **kwargs)
            except MPIKVStoreError as exc:
                if _pushed[0] == before:
                    where = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
                    try:
                        stream = _stream(where.get("store"), where.get("comm"))
                    except MPIKVStoreError:
                        raise exc from None  # no stream to stand in on: the error is that
                    _refuse_on(stream, op, verb, str(exc))
                raise
        return run
    return wrap


def _refuse_on(stream, op: int, verb: str, reason: str) -> None:
    _pushed[0] += 1
    stream.push([token_call(op, np.float32, [()], "%s (refused on this rank)" % verb, verb,
                            reason)])


def refuse(reason: str, store=None, comm=None) -> None:
    """This rank cannot take part in the next collective its peers run on this
    stream (e.g. it failed to prepare its input): they fail it with an
    MPIKVStoreError naming this rank and `reason`, instead of waiting, and
    later collectives stay paired."""
    _refuse_on(_stream(store, comm), _native.ALLREDUCE, "collective", reason)


@contextlib.contextmanager
def refusing(store=None, comm=None):
    """An exception raised in the block before it pushed any collective makes
    this rank refuse (see refuse) the next collective on that stream: for code
    that checks or prepares input before calling these functions."""
    before = _pushed[0]
    try:
        yield
    except Exception as exc:
        if _pushed[0] == before:
            first = (str(exc).strip().splitlines() or [""])[0]
            try:
                refuse("%s: %s" % (type(exc).__name__, first), store, comm)
            except MPIKVStoreError:
                pass  # no stream to stand in on (the error may be just that)
        raise


def _flags(average, dtype, op: str | None = None) -> int:
    """The request flags of a reduction: `average` (bool) or `op` (a REDUCTIONS name)."""
    if isinstance(average, np.bool_):
        average = bool(average)
    if isinstance(average, mx.nd.NDArray) or average not in (True, False):
        raise MPIKVStoreError("average must be True or False, got %s" % type(average).__name__)
    if op is None:
        op = "average" if average else "sum"
    elif op not in REDUCTIONS:
        raise MPIKVStoreError("unknown reduction op=%r; choose one of %s"
                              % (op, ", ".join(REDUCTIONS)))
    elif average and op != "average":
        raise MPIKVStoreError("average=True and op=%r: give one of them" % (op,))
    if op == "average" and np.dtype(dtype) not in FLOAT_DTYPES:
        raise MPIKVStoreError("averaging needs floating-point arrays, got %s" % np.dtype(dtype))
    return REDUCTIONS[op]


def _reduce_into(tensors: Sequence, outs: Sequence, average: bool, name: str | None,
                 priority: int, store, comm=None, op: str | None = None) -> None:
    """One collective reducing `tensors` into `outs`, as one unit."""
    _check_args(name, priority)
    if not tensors:
        _flags(average, np.float32, op)
        return
    check_array(tensors[0], "tensor 0")
    dtype = np.dtype(tensors[0].dtype)
    for i, (t, o) in enumerate(zip(tensors, outs)):
        check_array(t, "tensor %d" % i)
        check_array(o, "output %d" % i)
        if np.dtype(t.dtype) != dtype:
            raise MPIKVStoreError("a grouped allreduce takes one dtype; tensor %d is %s, tensor 0 "
                                  "is %s" % (i, np.dtype(t.dtype), dtype))
    flags = _flags(average, dtype, op)
    ins = [_host(t) for t in tensors]
    dsts = [o if on_host(o) else mx.nd.empty(o.shape, ctx=mx.cpu(), dtype=o.dtype)
            for o in outs]
    shapes = [tuple(t.shape) for t in tensors]
    desc = _text(name, "allreduce", "shapes=%s" % (shapes,) if len(shapes) > 1
                 else "shape=%s" % (shapes[0],), dtype)
    _push(store, Call(_native.ALLREDUCE, ins, dsts, dtype=dtype, shapes=shapes, desc=desc,
                      label=name or "allreduce", priority=priority, flags=flags), comm)
    for d, o in zip(dsts, outs):
        if d is not o:
            d.copyto(o)


def _host_ctx(tensor):
    """Where a new result is made: the input's own CPU context (cpu(1) too;
    mx.cpu() put it on cpu(0), where the caller's blocks are not), else the
    host, from which it is copied to the input's device."""
    return tensor.context if on_host(tensor) else mx.cpu()


def _like(tensor, out):
    """`out` (made as a legacy NDArray) as the kind of array `tensor` is: an
    mx.np array for an mx.np input (the same memory), as MXNet's own
    operators return."""
    return out.as_np_ndarray() if isinstance(tensor, mx.np.ndarray) else out


def _returned(tensor, out):
    """A result made on the host (`out`) as the caller gets it: on the input's
    device, of the input's kind."""
    return _like(tensor, out if on_host(tensor) else out.as_in_context(tensor.context))


def _tensor_list(tensors) -> list:
    if isinstance(tensors, mx.nd.NDArray) or not isinstance(tensors, (list, tuple)):
        raise MPIKVStoreError("a grouped allreduce takes a list of NDArrays, got %s"
                              % type(tensors).__name__)
    return list(tensors)


@_agreed("allreduce", _native.ALLREDUCE)
def allreduce(tensor, average: bool = False, name: str | None = None, priority: int = 0,
              store=None, *, comm: Communicator | None = None, op: str | None = None):
    """The sum of `tensor` over the ranks (or its average with average=True, or
    op='min'/'max'/'product'), in a new array."""
    check_array(tensor, "tensor")
    out = mx.nd.empty(tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
    _reduce_into([tensor], [out], average, name, priority, store, comm, op)
    return _like(tensor, out)


@_agreed("allreduce", _native.ALLREDUCE)
def allreduce_(tensor, average: bool = False, name: str | None = None, priority: int = 0,
               store=None, *, comm: Communicator | None = None, op: str | None = None):
    """Reduce `tensor` over the ranks in place (sum; average=True or
    op='min'/'max'/'product' for the others); returns it."""
    _old_spelling("allreduce_", average)
    _reduce_into([tensor], [tensor], average, name, priority, store, comm, op)
    return tensor


@_agreed("allreduce", _native.ALLREDUCE)
def grouped_allreduce(tensors: Sequence, average: bool = False, name: str | None = None,
                      priority: int = 0, store=None, *, comm: Communicator | None = None,
                      op: str | None = None) -> list:
    """Allreduce of a list of arrays of one dtype as one collective; new arrays."""
    tensors = _tensor_list(tensors)
    for i, t in enumerate(tensors):
        check_array(t, "tensor %d" % i)   # before reading their shapes
    outs = [mx.nd.empty(t.shape, ctx=t.context, dtype=t.dtype) for t in tensors]
    _reduce_into(tensors, outs, average, name, priority, store, comm, op)
    return [_like(t, o) for t, o in zip(tensors, outs)]


@_agreed("allreduce", _native.ALLREDUCE)
def grouped_allreduce_(tensors: Sequence, average: bool = False, name: str | None = None,
                       priority: int = 0, store=None, *, comm: Communicator | None = None,
                       op: str | None = None) -> list:
    """In-place grouped allreduce (one collective); returns the tensors."""
    tensors = _tensor_list(tensors)
    _reduce_into(tensors, tensors, average, name, priority, store, comm, op)
    return tensors


@_agreed("broadcast", _native.BROADCAST)
def broadcast_(tensor, root_rank: int = 0, name: str | None = None, priority: int = 0,
               store=None, *, comm: Communicator | None = None):
    """Rank `root_rank`'s `tensor` into `tensor` on every rank; returns it.
    `root_rank` is a rank of the communicator the broadcast runs on."""
    _old_spelling("broadcast_", root_rank)
    _check_args(name, priority)
    check_array(tensor, "tensor")
    p = _comm(store, comm).size
    if isinstance(root_rank, bool) or not isinstance(root_rank, numbers.Integral):
        raise MPIKVStoreError("root_rank must be an integer, got %s" % type(root_rank).__name__)
    if not 0 <= root_rank < p:
        raise MPIKVStoreError("root_rank %d is not a rank of a communicator of %d"
                              % (root_rank, p))
    host = _host(tensor)
    _push(store, Call(_native.BROADCAST, [host], [host], dtype=tensor.dtype,
                      shapes=[tuple(tensor.shape)],
                      desc=_text(name, "broadcast", "shape=%s" % (tuple(tensor.shape),),
                                 tensor.dtype) + " from root %d" % root_rank,
                      label=name or "broadcast", root=int(root_rank), priority=priority), comm)
    if host is not tensor:
        host.copyto(tensor)
    return tensor


@_agreed("broadcast", _native.BROADCAST)
def broadcast(tensor, root_rank: int = 0, name: str | None = None, priority: int = 0,
              store=None, *, comm: Communicator | None = None):
    """Rank `root_rank`'s `tensor`, in a new array on every rank."""
    check_array(tensor, "tensor")
    return broadcast_(tensor.copy(), root_rank, name, priority, store, comm=comm)


def _first_dims(tensor) -> tuple:
    if tensor.ndim == 0:
        raise MPIKVStoreError("allgather/alltoall/reduce_scatter need at least one dimension, "
                              "got a 0-d array")
    return tuple(tensor.shape)


def _exchange(store, comm, op: int, send: np.ndarray, what: str, splits=None) -> np.ndarray:
    """A small int64 collective on the Python thread (waits for it)."""
    p = _comm(store, comm).size
    src = mx.nd.array(send, dtype="int64")
    dst = mx.nd.zeros((p,), dtype="int64")
    _push(store, Call(op, [src], [dst], dtype=np.int64, shapes=[tuple(src.shape)],
                      desc=what, label=what, splits=splits, row=1), comm)
    return dst.asnumpy()


@_agreed("allgather", _native.ALLGATHER)
def allgather(tensor, name: str | None = None, priority: int = 0, store=None, *,
              comm: Communicator | None = None):
    """Every rank's `tensor` concatenated along the first dimension, in rank
    order; first dimensions may differ between ranks, the others may not."""
    _check_args(name, priority)
    check_array(tensor, "tensor")
    shape = _first_dims(tensor)
    rest = "shape=(*, %s)" % ", ".join(map(str, shape[1:])) if len(shape) > 1 else "shape=(*,)"
    rows = _exchange(store, comm, _native.ALLGATHER, np.array([shape[0]], dtype=np.int64),
                     _text(name, "allgather first dimensions", rest, tensor.dtype))
    out = mx.nd.empty((int(rows.sum()),) + shape[1:], ctx=_host_ctx(tensor), dtype=tensor.dtype)
    _push(store, Call(_native.ALLGATHER, [_host(tensor)], [out], dtype=tensor.dtype,
                      shapes=[shape], desc=_text(name, "allgather", rest, tensor.dtype),
                      label=name or "allgather", priority=priority, row=_row(shape)), comm)
    return _returned(tensor, out)


def _splits(splits, p: int, rows: int) -> list:
    if splits is None:
        if rows % p:
            raise MPIKVStoreError("alltoall without splits needs a first dimension divisible by "
                                  "the %d ranks, got %d" % (p, rows))
        return [rows // p] * p
    if isinstance(splits, mx.nd.NDArray):
        splits = splits.asnumpy()
    try:
        values = np.asarray(splits)
        ok = values.ndim == 1 and (values.size == 0 or values.dtype.kind in "iu")
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise MPIKVStoreError("alltoall splits must be a list (or 1-d array) of integers, got %r"
                              % (splits,))
    out = [int(v) for v in values]
    if len(out) != p or any(v < 0 for v in out) or sum(out) != rows:
        raise MPIKVStoreError("alltoall splits %s: need %d non-negative rows adding up to the "
                              "first dimension %d" % (out, p, rows))
    return out


@_agreed("alltoall", _native.ALLTOALL)
def alltoall(tensor, splits: Sequence[int] | None = None, name: str | None = None,
             priority: int = 0, store=None, *, comm: Communicator | None = None):
    """Rows [s_0 .. s_0+s_1) etc. of `tensor` go to rank 0, 1, ...; returns
    (the rows received, concatenated in rank order; the rows received from
    each rank as an int32 array). `splits` default: equal parts."""
    _check_args(name, priority)
    check_array(tensor, "tensor")
    shape = _first_dims(tensor)
    p = _comm(store, comm).size
    splits = _splits(splits, p, shape[0])
    rest = "shape=(*, %s)" % ", ".join(map(str, shape[1:])) if len(shape) > 1 else "shape=(*,)"
    recv = _exchange(store, comm, _native.ALLTOALL, np.array(splits, dtype=np.int64),
                     _text(name, "alltoall splits", rest, tensor.dtype), splits=[1] * p)
    out = mx.nd.empty((int(recv.sum()),) + shape[1:], ctx=_host_ctx(tensor), dtype=tensor.dtype)
    received = mx.nd.zeros((p,), ctx=_host_ctx(tensor), dtype="int32")
    _push(store, Call(_native.ALLTOALL, [_host(tensor)], [out], dtype=tensor.dtype,
                      shapes=[shape], desc=_text(name, "alltoall", rest, tensor.dtype),
                      label=name or "alltoall", priority=priority, splits=splits,
                      row=_row(shape), aux=received), comm)
    return _returned(tensor, out), _like(tensor, received)


@_agreed("reduce_scatter", _native.REDUCE_SCATTER)
def reduce_scatter(tensor, average: bool = False, name: str | None = None, priority: int = 0,
                   store=None, *, comm: Communicator | None = None):
    """The sum (or average) over ranks of `tensor`, split along the first
    dimension: rank r gets rows of part r (the first rows % size ranks get one
    row more)."""
    _check_args(name, priority)
    check_array(tensor, "tensor")
    shape = _first_dims(tensor)
    flags = _flags(average, tensor.dtype)
    where = _comm(store, comm)
    mine = shape[0] // where.size + (1 if where.rank < shape[0] % where.size else 0)
    out = mx.nd.empty((mine,) + shape[1:], ctx=_host_ctx(tensor), dtype=tensor.dtype)
    _push(store, Call(_native.REDUCE_SCATTER, [_host(tensor)], [out], dtype=tensor.dtype,
                      shapes=[shape],
                      desc=_text(name, "reduce_scatter", "shape=%s" % (shape,), tensor.dtype),
                      label=name or "reduce_scatter", priority=priority,
                      flags=flags, row=_row(shape)), comm)
    return _returned(tensor, out)

"""Collectives on NDArrays, each an engine op (read its input, write its output):
allreduce, broadcast, allgather, alltoall, reduce_scatter and a grouped
allreduce issued as one unit.

They run on the free functions' stream over the world (``store=None``, the
``chained`` mode) or on the stream of any of our stores (``store=kv``: that
store's mode and communicator). Like every collective here, ranks agree on
each one before its data moves: a shape, dtype or split that does not match
across ranks is the same ``MPIKVStoreError`` on every rank. ``allgather`` and
``alltoall`` first exchange the first dimensions (one small collective whose
result the Python thread waits for) to size their output.
"""

from __future__ import annotations

import functools
import inspect
from typing import Sequence

import mxnet as mx
import numpy as np

from . import _native
from .collectives import FLOAT_DTYPES, Call, check_array, on_host, stream_for, token_call
from .errors import MPIKVStoreError
from .world import init


def _stream(store):
    return stream_for(None) if store is None else store._stream


def _comm(store):
    return init() if store is None else store._comm


def _host(arr):
    """`arr`, or a host copy of it (engine copy) when it lives on a device."""
    return arr if on_host(arr) else arr.as_in_context(mx.cpu())


def _row(shape: tuple) -> int:
    return int(np.prod(shape[1:])) if len(shape) > 1 else 1


def _text(name: str | None, verb: str, shape_text: str, dtype) -> str:
    return "%s%s %s %s" % (verb, " %r" % name if name else "", shape_text, np.dtype(dtype))


def _push(store, call: Call) -> None:
    _pushed[0] += 1   # before: a call refused natively still took its place
    _stream(store).push([call])


_pushed = [0]


def _agreed(verb: str, op: int):
    """Bad input found here, before this rank issued anything, still takes part
    (as a failure token) in the collective its peers issue first, so they get
    the error too instead of waiting for this rank."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            before = _pushed[0]
            store = inspect.signature(fn).bind_partial(*args, **kwargs).arguments.get("store")
            try:
                return fn(*args, **kwargs)
            except MPIKVStoreError as exc:
                if _pushed[0] == before:
                    _stream(store).push([token_call(
                        op, np.float32, [()], "%s (refused on this rank)" % verb, verb,
                        str(exc))])
                raise
        return run
    return wrap


def _flags(average: bool, dtype) -> int:
    if not average:
        return 0
    if np.dtype(dtype) not in FLOAT_DTYPES:
        raise MPIKVStoreError("averaging needs floating-point arrays, got %s" % np.dtype(dtype))
    return _native.FLAG_AVERAGE


def _reduce_into(tensors: Sequence, outs: Sequence, average: bool, name: str | None,
                 priority: int, store) -> None:
    """One collective summing (or averaging) `tensors` into `outs`, as one unit."""
    if not tensors:
        return
    dtype = np.dtype(tensors[0].dtype)
    for i, (t, o) in enumerate(zip(tensors, outs)):
        check_array(t, "tensor %d" % i)
        check_array(o, "output %d" % i)
        if np.dtype(t.dtype) != dtype:
            raise MPIKVStoreError("a grouped allreduce takes one dtype; tensor %d is %s, tensor 0 "
                                  "is %s" % (i, np.dtype(t.dtype), dtype))
    ins = [_host(t) for t in tensors]
    dsts = [o if on_host(o) else mx.nd.empty(o.shape, ctx=mx.cpu(), dtype=o.dtype)
            for o in outs]
    shapes = [tuple(t.shape) for t in tensors]
    desc = _text(name, "allreduce", "shapes=%s" % (shapes,) if len(shapes) > 1
                 else "shape=%s" % (shapes[0],), dtype)
    _push(store, Call(_native.ALLREDUCE, ins, dsts, dtype=dtype, shapes=shapes, desc=desc,
                      label=name or "allreduce", priority=priority,
                      flags=_flags(average, dtype)))
    for d, o in zip(dsts, outs):
        if d is not o:
            d.copyto(o)


@_agreed("allreduce", _native.ALLREDUCE)
def allreduce(tensor, average: bool = False, name: str | None = None, priority: int = 0,
              store=None):
    """The sum (or average) of `tensor` over the ranks, in a new array."""
    out = mx.nd.empty(tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
    _reduce_into([tensor], [out], average, name, priority, store)
    return out


@_agreed("allreduce", _native.ALLREDUCE)
def allreduce_(tensor, average: bool = False, name: str | None = None, priority: int = 0,
               store=None):
    """Sum (or average) `tensor` over the ranks, in place; returns it."""
    _reduce_into([tensor], [tensor], average, name, priority, store)
    return tensor


@_agreed("allreduce", _native.ALLREDUCE)
def grouped_allreduce(tensors: Sequence, average: bool = False, name: str | None = None,
                      priority: int = 0, store=None) -> list:
    """Allreduce of a list of arrays of one dtype as one collective; new arrays."""
    outs = [mx.nd.empty(t.shape, ctx=t.context, dtype=t.dtype) for t in tensors]
    _reduce_into(list(tensors), outs, average, name, priority, store)
    return outs


@_agreed("allreduce", _native.ALLREDUCE)
def grouped_allreduce_(tensors: Sequence, average: bool = False, name: str | None = None,
                       priority: int = 0, store=None) -> list:
    """In-place grouped allreduce (one collective); returns the tensors."""
    _reduce_into(list(tensors), list(tensors), average, name, priority, store)
    return list(tensors)


@_agreed("broadcast", _native.BROADCAST)
def broadcast_(tensor, root_rank: int = 0, name: str | None = None, priority: int = 0,
               store=None):
    """Rank `root_rank`'s `tensor` into `tensor` on every rank; returns it."""
    check_array(tensor, "tensor")
    p = _comm(store).size
    if not 0 <= root_rank < p:
        raise MPIKVStoreError("root_rank %d is not a rank of a world of %d" % (root_rank, p))
    host = _host(tensor)
    _push(store, Call(_native.BROADCAST, [host], [host], dtype=tensor.dtype,
                      shapes=[tuple(tensor.shape)],
                      desc=_text(name, "broadcast", "shape=%s" % (tuple(tensor.shape),),
                                 tensor.dtype),
                      label=name or "broadcast", root=root_rank, priority=priority))
    if host is not tensor:
        host.copyto(tensor)
    return tensor


def broadcast(tensor, root_rank: int = 0, name: str | None = None, priority: int = 0,
              store=None):
    """Rank `root_rank`'s `tensor`, in a new array on every rank."""
    out = tensor.copy()
    return broadcast_(out, root_rank, name, priority, store)


def _first_dims(tensor) -> tuple:
    if tensor.ndim == 0:
        raise MPIKVStoreError("allgather/alltoall/reduce_scatter need at least one dimension, "
                              "got a 0-d array")
    return tuple(tensor.shape)


def _exchange(store, op: int, send: np.ndarray, what: str, splits=None) -> np.ndarray:
    """A small int64 collective on the Python thread (waits for it)."""
    p = _comm(store).size
    src = mx.nd.array(send, dtype="int64")
    dst = mx.nd.zeros((p,), dtype="int64")
    _push(store, Call(op, [src], [dst], dtype=np.int64, shapes=[tuple(src.shape)],
                      desc=what, label=what, splits=splits, row=1))
    return dst.asnumpy()


@_agreed("allgather", _native.ALLGATHER)
def allgather(tensor, name: str | None = None, priority: int = 0, store=None):
    """Every rank's `tensor` concatenated along the first dimension, in rank
    order; first dimensions may differ between ranks, the others may not."""
    check_array(tensor, "tensor")
    shape = _first_dims(tensor)
    rest = "shape=(*, %s)" % ", ".join(map(str, shape[1:])) if len(shape) > 1 else "shape=(*,)"
    rows = _exchange(store, _native.ALLGATHER, np.array([shape[0]], dtype=np.int64),
                     _text(name, "allgather first dimensions", rest, tensor.dtype))
    out = mx.nd.empty((int(rows.sum()),) + shape[1:], ctx=mx.cpu(), dtype=tensor.dtype)
    _push(store, Call(_native.ALLGATHER, [_host(tensor)], [out], dtype=tensor.dtype,
                      shapes=[shape], desc=_text(name, "allgather", rest, tensor.dtype),
                      label=name or "allgather", priority=priority, row=_row(shape)))
    return out if on_host(tensor) else out.as_in_context(tensor.context)


@_agreed("alltoall", _native.ALLTOALL)
def alltoall(tensor, splits: Sequence[int] | None = None, name: str | None = None,
             priority: int = 0, store=None):
    """Rows [s_0 .. s_0+s_1) etc. of `tensor` go to rank 0, 1, ...; returns
    (the rows received, concatenated in rank order; the rows received from
    each rank as an int32 array). `splits` default: equal parts."""
    check_array(tensor, "tensor")
    shape = _first_dims(tensor)
    p = _comm(store).size
    if splits is None:
        if shape[0] % p:
            raise MPIKVStoreError("alltoall without splits needs a first dimension divisible by "
                                  "the %d ranks, got %d" % (p, shape[0]))
        splits = [shape[0] // p] * p
    splits = [int(s) for s in (splits.asnumpy() if isinstance(splits, mx.nd.NDArray) else splits)]
    if len(splits) != p or any(s < 0 for s in splits) or sum(splits) != shape[0]:
        raise MPIKVStoreError("alltoall splits %s: need %d non-negative rows adding up to the "
                              "first dimension %d" % (splits, p, shape[0]))
    rest = "shape=(*, %s)" % ", ".join(map(str, shape[1:])) if len(shape) > 1 else "shape=(*,)"
    recv = _exchange(store, _native.ALLTOALL, np.array(splits, dtype=np.int64),
                     _text(name, "alltoall splits", rest, tensor.dtype), splits=[1] * p)
    out = mx.nd.empty((int(recv.sum()),) + shape[1:], ctx=mx.cpu(), dtype=tensor.dtype)
    received = mx.nd.zeros((p,), dtype="int32")
    _push(store, Call(_native.ALLTOALL, [_host(tensor)], [out], dtype=tensor.dtype,
                      shapes=[shape], desc=_text(name, "alltoall", rest, tensor.dtype),
                      label=name or "alltoall", priority=priority, splits=splits,
                      row=_row(shape), aux=received))
    return (out if on_host(tensor) else out.as_in_context(tensor.context)), received


@_agreed("reduce_scatter", _native.REDUCE_SCATTER)
def reduce_scatter(tensor, average: bool = False, name: str | None = None, priority: int = 0,
                   store=None):
    """The sum (or average) over ranks of `tensor`, split along the first
    dimension: rank r gets rows of part r (the first rows % size ranks get one
    row more)."""
    check_array(tensor, "tensor")
    shape = _first_dims(tensor)
    comm = _comm(store)
    mine = shape[0] // comm.size + (1 if comm.rank < shape[0] % comm.size else 0)
    out = mx.nd.empty((mine,) + shape[1:], ctx=mx.cpu(), dtype=tensor.dtype)
    _push(store, Call(_native.REDUCE_SCATTER, [_host(tensor)], [out], dtype=tensor.dtype,
                      shapes=[shape],
                      desc=_text(name, "reduce_scatter", "shape=%s" % (shape,), tensor.dtype),
                      label=name or "reduce_scatter", priority=priority,
                      flags=_flags(average, tensor.dtype), row=_row(shape)))
    return out if on_host(tensor) else out.as_in_context(tensor.context)

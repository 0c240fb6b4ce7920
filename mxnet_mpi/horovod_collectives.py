"""``mxnet_mpi.horovod``'s collectives (allreduce, allgather, alltoall,
broadcast, reducescatter, their grouped forms, and the object collectives)
with Horovod's reduction ops, on the global set or a process set."""

from __future__ import annotations

import pickle
import warnings
from collections import OrderedDict

import mxnet as mx
import numpy as np

from . import ops
from .collectives import check_array
from .errors import MPIKVStoreError
from .horovod_state import _root_in, _where, global_process_set, rank, size

try:  # Horovod pickles with cloudpickle (lambdas, local classes); plain pickle otherwise
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the environment
    _pickler = pickle


# Reduction ops, with Horovod's values (horovod/common/message.h).
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5
_OP_NAMES = {Average: "average", Sum: "sum", Min: "min", Max: "max", Product: "product"}
_OPS_BY_NAME = {name: value for value, name in _OP_NAMES.items()}


# ---------------------------------------------------------------- collectives
def _reduce_op(average, op) -> int:
    """Horovod's op/average rule: op wins, average is deprecated, default Average."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of "
                             "them.")
    elif average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in "
                      "v1.0", DeprecationWarning, stacklevel=3)
        op = Average if average else Sum
    else:
        op = Average
    op = _OPS_BY_NAME.get(op, op) if isinstance(op, str) else op
    if op == Adasum:
        raise NotImplementedError("Adasum is not implemented by mxnet_mpi.horovod; use hvd.Sum, "
                                  "hvd.Average, hvd.Min, hvd.Max or hvd.Product")
    if op not in _OP_NAMES:
        raise ValueError("unknown reduction op %r; use hvd.Sum, hvd.Average, hvd.Min, hvd.Max "
                         "or hvd.Product" % (op,))
    return op


def _is_integer(tensor) -> bool:
    return np.dtype(tensor.dtype).kind in "iu"


def _scale(tensor, factor) -> None:
    """tensor *= factor (engine ops), unless factor is 1; an integer tensor as
    Horovod scales it: in double precision, truncated toward zero (MXNet's
    own multiply would first cast 0.5 to 0). Legacy and mx.np arrays alike."""
    factor = float(factor)
    if factor == 1.0 or tensor.size == 0:
        return   # nothing to scale (MXNet's legacy operators refuse empty arrays)
    numpy_mode = isinstance(tensor, mx.np.ndarray)
    if _is_integer(tensor) or tensor.dtype == np.float64:
        # MXNet's scalar operators take the factor in float32 (0.3 / 3 became
        # 0.1, so a sum of 10 averaged with postscale 0.3 gave 1 where Horovod
        # gives 0): multiply by a float64 array instead
        lib = mx.np if numpy_mode else mx.nd
        f = lib.array([factor], dtype="float64", ctx=tensor.context).reshape((1,) * tensor.ndim)
        wide = tensor.astype("float64") if _is_integer(tensor) else tensor
        scaled = wide * f if numpy_mode else mx.nd.broadcast_mul(wide, f)
        _assign(tensor, scaled.astype(tensor.dtype) if _is_integer(tensor) else scaled)
    elif tensor.dtype == np.float16:
        # in float32, rounded to half once, as Horovod does (a factor cast to
        # half first, 0.3 -> 0.29993, biased every scaled gradient)
        _assign(tensor, (tensor.astype("float32") * factor).astype("float16"))
    else:
        tensor *= factor


def _assign(tensor, value) -> None:
    """tensor[...] = value, for 0-d mx.np arrays too (they take only `()`)."""
    if tensor.ndim == 0 and isinstance(tensor, mx.np.ndarray):
        tensor[()] = value
    else:
        tensor[:] = value


def _allreduce_into(tensors: list, op: int, name, priority, prescale_factor, postscale_factor,
                    entry) -> None:
    """One collective over `tensors` (one dtype)."""
    for i, t in enumerate(tensors):
        check_array(t, "tensor %d" % i)
    if op == Average and tensors and _is_integer(tensors[0]):
        # as Horovod: the sum scaled by 1/size (truncated), not an error
        members = len(entry.ranks) if entry is not None else size()
        op, postscale_factor = Sum, float(postscale_factor) / members
    for t in tensors:
        _scale(t, prescale_factor)
    ops.grouped_allreduce_(tensors, name=name, priority=priority, store=entry,
                           op=_OP_NAMES[op])
    for t in tensors:
        _scale(t, postscale_factor)


def _as_list(tensors, what: str) -> list:
    if isinstance(tensors, mx.nd.NDArray) or not isinstance(tensors, (list, tuple)):
        raise MPIKVStoreError("hvd.%s takes a list of NDArrays, got %s"
                              % (what, type(tensors).__name__))
    return list(tensors)


def allreduce(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set, op=None):
    """A new array: the average (default), sum, min, max or product of `tensor`
    over the ranks of `process_set`."""
    entry = _where(process_set, "allreduce")
    with ops.refusing(store=entry):
        op = _reduce_op(average, op)
        check_array(tensor, "tensor")
        out = tensor.copy()
        _allreduce_into([out], op, name, priority, prescale_factor, postscale_factor, entry)
    return out


def allreduce_(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set, op=None):
    """In place: the average (default), sum, min, max or product of `tensor`
    over the ranks of `process_set`; returns `tensor`."""
    entry = _where(process_set, "allreduce_")
    with ops.refusing(store=entry):
        op = _reduce_op(average, op)
        _allreduce_into([tensor], op, name, priority, prescale_factor, postscale_factor, entry)
    return tensor


def grouped_allreduce(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set, op=None):
    """New arrays: a list of tensors allreduced as one collective per dtype."""
    entry = _where(process_set, "grouped_allreduce")
    with ops.refusing(store=entry):
        tensors = _as_list(tensors, "grouped_allreduce")
        for i, t in enumerate(tensors):
            check_array(t, "tensor %d" % i)
        outs = [t.copy() for t in tensors]
    return grouped_allreduce_(outs, average, name, priority, prescale_factor, postscale_factor,
                              process_set, op)


def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set, op=None):
    """In place: a list of tensors allreduced as one collective per dtype."""
    entry = _where(process_set, "grouped_allreduce_")
    with ops.refusing(store=entry):
        op = _reduce_op(average, op)
        tensors = _as_list(tensors, "grouped_allreduce_")
        for i, t in enumerate(tensors):
            check_array(t, "tensor %d" % i)
        by_dtype: dict = OrderedDict()
        for t in tensors:
            by_dtype.setdefault(np.dtype(t.dtype), []).append(t)
        for group in by_dtype.values():
            _allreduce_into(group, op, name, priority, prescale_factor, postscale_factor, entry)
    return tensors


def allgather(tensor, name=None, priority=0, process_set=global_process_set):
    """The ranks' `tensor`s concatenated along the first dimension (which may
    differ between ranks), in rank order within `process_set`."""
    entry = _where(process_set, "allgather")
    return ops.allgather(tensor, name=name, priority=priority, store=entry)


def grouped_allgather(tensors, name=None, priority=0, process_set=global_process_set):
    """allgather of each tensor of a list."""
    entry = _where(process_set, "grouped_allgather")
    with ops.refusing(store=entry):
        tensors = _as_list(tensors, "grouped_allgather")
    return [ops.allgather(t, name="%s.%d" % (name, i) if name else None, priority=priority,
                          store=entry) for i, t in enumerate(tensors)]


def alltoall(tensor, splits=None, name=None, priority=0, process_set=global_process_set):
    """Rows of `tensor` scattered to the ranks of `process_set` by `splits`
    (default: equal parts). Returns the rows received, in rank order, and,
    when `splits` is given, the rows received from each rank (int32 NDArray)."""
    entry = _where(process_set, "alltoall")
    out, received = ops.alltoall(tensor, splits=splits, name=name, priority=priority,
                                 store=entry)
    return out if splits is None else (out, received)


def broadcast(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """A new array holding world rank `root_rank`'s `tensor`."""
    entry = _where(process_set, "broadcast")
    with ops.refusing(store=entry):
        root = _root_in(entry, root_rank, "broadcast")
    return ops.broadcast(tensor, root, name=name, priority=priority, store=entry)


def broadcast_(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """World rank `root_rank`'s `tensor` into `tensor` on every rank; returns it."""
    entry = _where(process_set, "broadcast_")
    with ops.refusing(store=entry):
        root = _root_in(entry, root_rank, "broadcast_")
    return ops.broadcast_(tensor, root, name=name, priority=priority, store=entry)


def reducescatter(tensor, op=Average, name=None, priority=0, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """The average (default) or sum over the ranks of `tensor`, split along the
    first dimension: the rank of set rank r gets part r (the first
    rows % size ranks one row more)."""
    entry = _where(process_set, "reducescatter")
    with ops.refusing(store=entry):
        op = _OPS_BY_NAME.get(op, op) if isinstance(op, str) else op
        if op not in (Average, Sum):
            raise ValueError("hvd.reducescatter supports hvd.Average and hvd.Sum, got %r" % (op,))
        check_array(tensor, "tensor")
        if tensor.shape == ():
            raise ValueError("reducescatter does not support scalar inputs")
        if op == Average and _is_integer(tensor):
            # as Horovod (and allreduce here): the sum scaled by 1/size, truncated
            members = len(entry.ranks) if entry is not None else size()
            op, postscale_factor = Sum, float(postscale_factor) / members
        if float(prescale_factor) != 1.0:
            tensor = tensor.copy()
            _scale(tensor, prescale_factor)
    out = ops.reduce_scatter(tensor, average=op == Average, name=name, priority=priority,
                             store=entry)
    _scale(out, postscale_factor)
    return out


def grouped_reducescatter(tensors, op=Average, name=None, priority=0,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each tensor of a list."""
    entry = _where(process_set, "grouped_reducescatter")
    with ops.refusing(store=entry):
        tensors = _as_list(tensors, "grouped_reducescatter")
    return [reducescatter(t, op, "%s.%d" % (name, i) if name else None, priority, process_set,
                          prescale_factor, postscale_factor) for i, t in enumerate(tensors)]


# ---------------------------------------------------------------- objects
def _pickled(obj, what: str) -> mx.nd.NDArray:
    try:
        data = _pickler.dumps(obj)
    except Exception as exc:  # noqa: BLE001 - any pickling failure, named
        raise MPIKVStoreError("hvd.%s: rank %d cannot pickle the %s object: %s: %s"
                              % (what, rank(), type(obj).__name__, type(exc).__name__, exc)
                              ) from exc
    return mx.nd.array(np.frombuffer(data, dtype=np.uint8), dtype="uint8")


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """World rank `root_rank`'s `obj` (pickled; any value elsewhere, e.g. None)
    on every rank of `process_set`."""
    entry = _where(process_set, "broadcast_object")
    name = name or "broadcast_object"
    with ops.refusing(store=entry):
        root = _root_in(entry, root_rank, "broadcast_object")
        if rank() == root_rank:
            payload = _pickled(obj, "broadcast_object")
            length = mx.nd.array([payload.size], dtype="int64")
        else:
            length = mx.nd.zeros((1,), dtype="int64")
    ops.broadcast_(length, root, name=name + ".sz", store=entry)
    if rank() != root_rank:
        payload = mx.nd.zeros((int(length.asscalar()),), dtype="uint8")
    ops.broadcast_(payload, root, name=name + ".t", store=entry)
    if rank() == root_rank:
        return obj
    return pickle.loads(payload.asnumpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Every rank's `obj` (pickled), as a list in rank order within `process_set`."""
    entry = _where(process_set, "allgather_object")
    name = name or "allgather_object"
    with ops.refusing(store=entry):
        payload = _pickled(obj, "allgather_object")
    sizes = ops.allgather(mx.nd.array([payload.size], dtype="int64"), name=name + ".sz",
                          store=entry).asnumpy()
    data = ops.allgather(payload, name=name + ".t", store=entry).asnumpy().tobytes()
    ends = np.cumsum(sizes)
    return [pickle.loads(data[end - n:end]) for n, end in zip(sizes, ends)]

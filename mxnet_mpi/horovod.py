"""``import mxnet_mpi.horovod as hvd``: the part of ``horovod.mxnet`` (0.28.1)
that MXNet users touch, on mxnet_mpi's engine-embedded collectives.

A script written for Horovod runs with only its import line changed, under
plain ``mpirun``. Semantics follow Horovod's: ``allreduce`` **averages** by
default (``op=hvd.Sum`` or ``average=False`` sums); ``DistributedTrainer`` and
``DistributedOptimizer`` sum gradients and divide by ``size()`` through the
optimizer's rescaling, as Horovod does. Collectives run on the world, in the
free functions' (chained) stream; ``process_set`` arguments other than the
global set are refused.
"""

from __future__ import annotations

import types
import warnings
from collections import OrderedDict

import mxnet as mx
import numpy as np

from . import ops
from .batch_sizes import BatchSizes
from .collectives import stream_for
from .errors import MPIKVStoreError
from .world import THREAD_MULTIPLE, finalize, local_rank, local_size, rank, size, thread_level
from .world import init as _init_world

Average = "average"
Sum = "sum"
Adasum = "adasum"
global_process_set = None

__all__ = [
    "Average", "Sum", "Adasum", "Compression", "DistributedOptimizer", "DistributedTrainer",
    "allgather", "allreduce", "allreduce_", "alltoall", "broadcast", "broadcast_",
    "broadcast_parameters", "grouped_allreduce", "grouped_allreduce_", "init",
    "is_initialized", "local_rank", "local_size", "mpi_threads_supported", "rank", "shutdown",
    "size",
]

_initialized = False


def init(comm=None, process_sets=None) -> None:
    """Start MPI (idempotent). Only the world communicator is supported."""
    global _initialized
    if comm is not None or process_sets not in (None, [], ()):
        raise MPIKVStoreError("mxnet_mpi.horovod supports the world communicator only "
                              "(init() without comm/process_sets)")
    _init_world()
    _initialized = True


def shutdown() -> None:
    """End this rank's part in the job (finalises MPI)."""
    global _initialized
    finalize()
    _initialized = False


def is_initialized() -> bool:
    return _initialized


def mpi_threads_supported() -> bool:
    return thread_level() >= THREAD_MULTIPLE


def mpi_enabled() -> bool:
    return True


def mpi_built() -> bool:
    return True


def _global_only(process_set) -> None:
    if process_set is not None:
        raise MPIKVStoreError("mxnet_mpi.horovod supports the global process set only")


def _reduce_op(average, op) -> str:
    if average is not None and op is not None:
        raise ValueError("give either average or op, not both")
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise NotImplementedError("Adasum is not implemented by mxnet_mpi.horovod; use "
                                  "hvd.Average or hvd.Sum")
    if op not in (Average, Sum):
        raise ValueError("unknown reduction op %r" % (op,))
    return op


def _scale(tensor, factor: float):
    """tensor *= factor (an engine op), unless factor is 1."""
    if factor != 1.0:
        tensor *= factor
    return tensor


def _allreduce_into(tensors: list, average, name, priority, prescale_factor, postscale_factor,
                    op) -> None:
    op = _reduce_op(average, op)
    for t in tensors:
        _scale(t, prescale_factor)
    ops.grouped_allreduce_(tensors, average=op == Average, name=name, priority=priority)
    for t in tensors:
        _scale(t, postscale_factor)


def allreduce(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None, op=None):
    """A new array: the average (default) or sum of `tensor` over all ranks."""
    _global_only(process_set)
    out = tensor.copy()
    _allreduce_into([out], average, name, priority, prescale_factor, postscale_factor, op)
    return out


def allreduce_(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None, op=None):
    """In place: the average (default) or sum of `tensor` over all ranks."""
    _global_only(process_set)
    _allreduce_into([tensor], average, name, priority, prescale_factor, postscale_factor, op)
    return tensor


def grouped_allreduce(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None, op=None):
    """New arrays: a list of tensors allreduced as one collective per dtype."""
    _global_only(process_set)
    outs = [t.copy() for t in tensors]
    grouped_allreduce_(outs, average, name, priority, prescale_factor, postscale_factor,
                       op=op)
    return outs


def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None, op=None):
    """In place: a list of tensors allreduced as one collective per dtype."""
    _global_only(process_set)
    by_dtype: dict = OrderedDict()
    for t in tensors:
        by_dtype.setdefault(np.dtype(t.dtype), []).append(t)
    for group in by_dtype.values():
        _allreduce_into(group, average, name, priority, prescale_factor, postscale_factor, op)
    return list(tensors)


def allgather(tensor, name=None, priority=0, process_set=None):
    """Every rank's `tensor` concatenated along the first dimension (which may
    differ between ranks)."""
    _global_only(process_set)
    return ops.allgather(tensor, name=name, priority=priority)


def alltoall(tensor, splits=None, name=None, priority=0, process_set=None):
    """Rows of `tensor` scattered to the ranks by `splits` (default: equal
    parts); returns the rows received, in rank order."""
    _global_only(process_set)
    out, _ = ops.alltoall(tensor, splits=splits, name=name, priority=priority)
    return out


def broadcast(tensor, root_rank, name=None, priority=0, process_set=None):
    """A new array holding rank `root_rank`'s `tensor`."""
    _global_only(process_set)
    return ops.broadcast(tensor, root_rank, name=name, priority=priority)


def broadcast_(tensor, root_rank, name=None, priority=0, process_set=None):
    """Rank `root_rank`'s `tensor` into `tensor` on every rank; returns it."""
    _global_only(process_set)
    return ops.broadcast_(tensor, root_rank, name=name, priority=priority)


class _NoCompression:
    """Gradients travel as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _FP16Compression:
    """Floating-point gradients travel as float16 and come back in their dtype."""

    @staticmethod
    def compress(tensor):
        if np.dtype(tensor.dtype).kind == "f" and np.dtype(tensor.dtype) != np.float16:
            return tensor.astype("float16"), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.astype(ctx) if ctx is not None else tensor


class Compression:
    """Gradient compression for DistributedTrainer (``none`` or ``fp16``)."""

    none = _NoCompression
    fp16 = _FP16Compression


def _split(items: list, groups: int) -> list:
    per = -(-len(items) // groups)
    return [items[i:i + per] for i in range(0, len(items), per)]


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps an optimizer: each update first sums the gradient over ranks; the
    optimizer's rescale_grad is divided by size(), so the step averages."""

    def __init__(self, optimizer, gradient_predivide_factor: float = 1.0,
                 num_groups: int = 0) -> None:
        self._optimizer = optimizer
        self._optimizer.rescale_grad *= gradient_predivide_factor / size()
        self._gradient_predivide_factor = gradient_predivide_factor
        self._num_groups = num_groups

    def __getattr__(self, item):
        return getattr(self._optimizer, item)

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def _do_allreduce(self, index, grad) -> None:
        if size() == 1:
            return
        pre = 1.0 / self._gradient_predivide_factor
        if isinstance(index, (tuple, list)):
            if self._num_groups > 0:
                for i, (grads, idx) in enumerate(zip(_split(list(grad), self._num_groups),
                                                     _split(list(index), self._num_groups))):
                    grouped_allreduce_(grads, average=False, name="%s:%s" % (idx[0], idx[-1]),
                                       priority=-i, prescale_factor=pre)
            else:
                for i in range(len(index)):
                    allreduce_(grad[i], average=False, name=str(index[i]), priority=-i,
                               prescale_factor=pre)
        else:
            allreduce_(grad, average=False, name=str(index), prescale_factor=pre)

    def update(self, index, weight, grad, state):
        self._do_allreduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        self._do_allreduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult):
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        self._optimizer.set_wd_mult(args_wd_mult)


class DistributedTrainer(mx.gluon.Trainer):
    """gluon.Trainer whose gradients are summed over ranks by engine-embedded
    allreduces (one batch of collectives per step) and averaged through the
    trainer's scale, as Horovod's DistributedTrainer does.

    Unlike Horovod, ranks that pass different batch sizes to one step stay
    identical: each divides by the mean batch size of the ranks (docs/store.md,
    "Batch sizes"), which is its own when all are equal."""

    def __init__(self, params, optimizer, optimizer_params=None,
                 compression=Compression.none, gradient_predivide_factor: float = 1.0,
                 prefix: str | None = None, num_groups: int = 0) -> None:
        self._compression = compression
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take DistributedOptimizer as its "
                          "optimizer; it was unwrapped", stacklevel=2)
        if isinstance(params, dict):
            params = OrderedDict(params)
        elif isinstance(params, (list, tuple)):
            params = sorted(params, key=lambda p: p.name)
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._scale *= gradient_predivide_factor / size()
        self._gradient_predivide_factor = gradient_predivide_factor
        if prefix is not None and not isinstance(prefix, str):
            raise ValueError("prefix must be a string")
        self._prefix = prefix or ""
        self._num_groups = num_groups
        self._batch = None          # step()'s batch size, summed in _allreduce_grads
        self._agreed = None         # their sum, read by _update
        self._batch_sizes = None
        self._steps = 0

    def _sum_batch_sizes(self, batch_size, call: str) -> None:
        # A collective of its own, pushed before the gradients: the free
        # functions' stream runs in push order, so it completes without waiting
        # for backprop (a gradient allreduce would make the wait longer).
        if self._batch_sizes is None:
            self._batch_sizes = BatchSizes()
        self._agreed = self._batch_sizes.push(
            stream_for(None), batch_size,
            ("DistributedTrainer.%s %d: sum of batch sizes" % (call, self._steps)).encode())

    def step(self, batch_size, ignore_stale_grad=False):
        self._steps += 1
        self._batch = batch_size
        try:
            super().step(batch_size, ignore_stale_grad)
        finally:
            self._batch = self._agreed = None

    def update(self, batch_size, ignore_stale_grad=False):
        if size() > 1:
            self._sum_batch_sizes(batch_size, "update")
        try:
            super().update(batch_size, ignore_stale_grad)
        finally:
            self._agreed = None

    def _update(self, ignore_stale_grad=False):
        if self._agreed is not None:
            agreed, self._agreed = self._agreed, None
            self._optimizer.rescale_grad = self._scale / agreed.mean()
        super()._update(ignore_stale_grad)

    def _allreduce_grads(self):
        if size() == 1:
            return
        if self._batch is not None:
            self._sum_batch_sizes(self._batch, "step")
            self._batch = None
        pre = 1.0 / self._gradient_predivide_factor
        entries = []
        for i, param in enumerate(self._params):
            if param.grad_req != "null":
                grad = param.list_grad()[0]
                sent, ctx = self._compression.compress(grad)
                entries.append((i, param, grad, sent, ctx))
        if self._num_groups > 0:
            for g, group in enumerate(_split(entries, self._num_groups)):
                grouped_allreduce_([e[3] for e in group], average=False,
                                   name="%s%d:%s%d" % (self._prefix, group[0][0], self._prefix,
                                                       group[-1][0]),
                                   priority=-g, prescale_factor=pre)
        else:
            for i, _, _, sent, _ in entries:
                allreduce_(sent, average=False, name=self._prefix + str(i), priority=-i,
                           prescale_factor=pre)
        for _, _, grad, sent, ctx in entries:
            if sent is not grad:
                grad[:] = self._compression.decompress(sent, ctx)


def _broadcast_after_init(param, root_rank: int, name: str):
    init_impl = param._init_impl

    def wrapped(self, *args, **kwargs):
        init_impl(*args, **kwargs)
        broadcast_(self.data(), root_rank=root_rank, name=name)
    return wrapped


def broadcast_parameters(params, root_rank: int = 0, prefix: str | None = None) -> None:
    """Copy rank `root_rank`'s parameters (a dict of NDArrays or a Gluon
    ParameterDict; deferred-init parameters as soon as they are initialised)
    to every rank."""
    if size() == 1:
        return
    if prefix is not None and not isinstance(prefix, str):
        raise ValueError("prefix must be a string")
    prefix = prefix or ""
    if not isinstance(params, (dict, mx.gluon.ParameterDict)):
        raise ValueError("invalid params of type: %s" % type(params))
    for name, p in sorted(params.items()):
        if isinstance(p, mx.gluon.Parameter):
            try:
                tensor = p.data()
            except mx.gluon.parameter.DeferredInitializationError:
                p._init_impl = types.MethodType(
                    _broadcast_after_init(p, root_rank, prefix + str(name)), p)
                continue
        else:
            tensor = p
        broadcast_(tensor, root_rank, name=prefix + str(name))

"""``mxnet_mpi.horovod``'s training API: DistributedOptimizer,
DistributedTrainer, Compression and broadcast_parameters."""

from __future__ import annotations

import types
import warnings

import mxnet as mx
import numpy as np

from . import joining
from .batch_sizes import BatchSizes, SettingsComparison, step_flags
from .collectives import allreduce_in_place, rank_table
from .consistency import check_trainer_after_writes
from .deferred import settle_deferred
from .horovod_collectives import Sum, allreduce_, broadcast_, grouped_allreduce_
from .horovod_state import (
    ProcessSet,
    _state,
    _stream_of,
    global_process_set,
    rank,
    size,
    split_list,
)
from .mxnet_patches import NOT_APPLIED, WRITES_DESC, written
from .optimizer_fixes import share_noise
from .optimizer_settings import describe
from .param_order import agreed_order
from .stale_grads import COUNTS_DESC, FreshCounts, stale_gradient, zero_stale
from .store_calls import fan_out, sum_over_devices

#: DistributedOptimizer compares the ranks' optimizer settings at most once
#: per this many updates (each comparison read at the next).
SETTINGS_UPDATES = 64


# ---------------------------------------------------------------- training
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
    return [g for g in split_list(items, groups) if g]


def _registered(ranks: list) -> ProcessSet:
    """The registered process set of these world ranks (loading optimizer
    states saved for it); the global set where they are the whole world."""
    if list(ranks) == list(range(size())):
        return global_process_set
    for set_id, entry in _state.sets.items():
        if list(entry.ranks) == list(ranks):
            ps = ProcessSet(ranks)
            ps.process_set_id = set_id
            return ps
    raise ValueError("these optimizer states were saved for a DistributedOptimizer on process "
                     "set %s, which is not registered in this job: register it "
                     "(hvd.add_process_set) before loading them" % (list(ranks),))


def _trainer_set(process_set) -> ProcessSet:
    """A registered process set (this rank a member or not), for the trainers."""
    process_set = global_process_set if process_set is None else process_set
    if not isinstance(process_set, ProcessSet):
        raise ValueError("process_set must be an hvd.ProcessSet, got %s"
                         % type(process_set).__name__)
    if process_set.size() is None:
        raise ValueError("%s is not registered (hvd.init(process_sets=[...]) or "
                         "hvd.add_process_set())" % process_set)
    return process_set


def _share_noise(optimizer, process_set: ProcessSet) -> None:
    """optimizer_fixes.share_noise over the members of `process_set` (this
    rank one of them), where it has several: SGLD's noise alike on each."""
    if process_set.size() > 1:
        share_noise(optimizer, rank() == process_set.ranks[0], lambda arr: allreduce_(
            arr, name="SGLD's noise seed", op=Sum, process_set=process_set))


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps an optimizer: on the ranks of `process_set`, each update first sums
    the gradient over the set; rescale_grad is divided by the set's size, so
    the step averages (on every rank, as in Horovod)."""

    def __init__(self, optimizer, gradient_predivide_factor: float = 1.0,
                 num_groups: int = 0, process_set=global_process_set) -> None:
        self._optimizer = optimizer
        self._process_set = _trainer_set(process_set)
        self._optimizer.rescale_grad *= gradient_predivide_factor / self._process_set.size()
        self._gradient_predivide_factor = gradient_predivide_factor
        self._num_groups = num_groups
        self._updates = 0
        self._settings = SettingsComparison(SETTINGS_UPDATES)

    def __getattr__(self, item):
        return getattr(self._optimizer, item)

    # Trainer.save_states pickles the optimizer: a comparison in flight holds
    # an array read through its memory, which a copy would not share. The
    # process set goes as its ranks (None: the global set) and the size that
    # rescale_grad was divided by: a file saved on 2 ranks and loaded on 3
    # kept the old job's set (rank 2 outside it, stepping alone) and 1/2.
    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_settings", None)
        ps = state.pop("_process_set")
        state["_set_ranks"] = None if ps.process_set_id == 0 else list(ps.ranks)
        state["_set_size"] = ps.size()
        return state

    def __setstate__(self, state):
        ranks, saved = state.pop("_set_ranks", None), state.pop("_set_size", None)
        super().__setstate__(state)
        self._settings = SettingsComparison(SETTINGS_UPDATES)
        self._process_set = global_process_set if ranks is None else _registered(ranks)
        size = self._process_set.size()
        if saved and size and saved != size:   # as if made in this job
            self._optimizer.rescale_grad *= saved / size

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def _do_allreduce(self, index, grad) -> None:
        if self._process_set.size() == 1:
            return
        pre = 1.0 / self._gradient_predivide_factor
        ps = self._process_set
        if isinstance(index, (tuple, list)):
            if self._num_groups > 0:
                for i, (grads, idx) in enumerate(zip(_split(list(grad), self._num_groups),
                                                     _split(list(index), self._num_groups))):
                    grouped_allreduce_(grads, name="%s:%s" % (idx[0], idx[-1]), priority=-i,
                                       prescale_factor=pre, process_set=ps, op=Sum)
            else:
                for i in range(len(index)):
                    allreduce_(grad[i], name=str(index[i]), priority=-i, prescale_factor=pre,
                               process_set=ps, op=Sum)
        else:
            allreduce_(grad, name=str(index), prescale_factor=pre, process_set=ps, op=Sum)

    def _compare_settings(self) -> None:
        # Horovod lets each rank apply its own optimizer; ranks whose settings
        # differ would drift apart silently. Compared without a wait, at most
        # once per SETTINGS_UPDATES updates (as Module's, docs/store.md).
        if self._process_set.size() == 1:
            return
        self._updates += 1
        opt = self._optimizer
        self._settings.tick(
            self._updates, _stream_of(self._process_set, "DistributedOptimizer"),
            b"DistributedOptimizer update %d" % self._updates,
            lambda: describe(opt, opt.rescale_grad, "rescale_grad"))

    def _before_update(self) -> None:
        self._compare_settings()
        _share_noise(self._optimizer, self._process_set)

    def update(self, index, weight, grad, state):
        if self._process_set.included():
            self._before_update()
            self._do_allreduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        if self._process_set.included():
            self._before_update()
            self._do_allreduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult):
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        self._optimizer.set_wd_mult(args_wd_mult)


class DistributedTrainer(mx.gluon.Trainer):
    """gluon.Trainer whose gradients are summed over the ranks of `process_set`
    by engine-embedded allreduces (one batch of collectives per step) and
    averaged through the trainer's scale (divided by the set's size on every
    rank), as Horovod's DistributedTrainer does. Ranks outside the set step on
    their own gradients.

    Unlike Horovod, ranks that pass different batch sizes to one step stay
    identical: each divides by the mean batch size of the set's ranks
    (docs/store.md, "Batch sizes"), which is its own when all are equal."""

    def __init__(self, params, optimizer, optimizer_params=None,
                 compression=Compression.none, gradient_predivide_factor: float = 1.0,
                 prefix: str | None = None, num_groups: int = 0,
                 process_set=global_process_set) -> None:
        self._compression = compression
        self._process_set = _trainer_set(process_set)
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take DistributedOptimizer as its "
                          "optimizer; it was unwrapped", stacklevel=2)
        items = (list(params.items()) if isinstance(params, (dict, mx.gluon.ParameterDict))
                 else [(p.name, p) for p in params] if isinstance(params, (list, tuple))
                 else None)
        if items is not None and self._process_set.size() > 1 and self._process_set.included():
            # sorted by name, as Horovod does, unless Gluon's name counters
            # differ between the ranks: then by position (param_order)
            stream = _stream_of(self._process_set, "DistributedTrainer")
            params, _ = agreed_order(items, lambda row, desc: rank_table(
                stream, row, "DistributedTrainer: " + desc))
        elif items is not None:
            params = [p for _, p in sorted(items, key=lambda item: item[0])]
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        joining.note_outside(self)   # join() with no argument says it cannot cover it
        self._scale *= gradient_predivide_factor / self._process_set.size()
        self._gradient_predivide_factor = gradient_predivide_factor
        if prefix is not None and not isinstance(prefix, str):
            raise ValueError("prefix must be a string")
        self._prefix = prefix or ""
        self._num_groups = num_groups
        self._batch = None          # step()'s batch size, summed in _allreduce_grads
        self._agreed = None         # their sum, read by _update
        self._batch_sizes = None
        self._steps = 0
        self._ignore_stale = False  # step()'s or update()'s ignore_stale_grad
        self._fresh = FreshCounts()  # with ignore_stale_grad (stale_grads.py)
        self._device_sums: dict = {}  # per parameter: the sum over this rank's devices

    def _sum_batch_sizes(self, batch_size, call: str, stale: bool) -> None:
        # A collective of its own, pushed before the gradients: the free
        # functions' stream runs in push order, so it completes without waiting
        # for backprop (a gradient allreduce would make the wait longer).
        if self._batch_sizes is None:
            self._batch_sizes = BatchSizes()
        stream = _stream_of(self._process_set, "DistributedTrainer")
        self._agreed = self._batch_sizes.push(
            stream, batch_size,
            ("DistributedTrainer.%s %d: sum of batch sizes" % (call, self._steps)).encode(),
            describe(self._optimizer, self._scale),
            step_flags(stale and not self._ignore_stale, written(self)))
        if self._ignore_stale:
            self._fresh.push(self._params, lambda arr: allreduce_in_place(
                stream, arr, "DistributedTrainer: " + COUNTS_DESC))

    def step(self, batch_size, ignore_stale_grad=False):
        self._steps += 1
        self._batch = batch_size
        self._ignore_stale = ignore_stale_grad
        try:
            super().step(batch_size, ignore_stale_grad)
        finally:
            self._batch = self._agreed = None

    def update(self, batch_size, ignore_stale_grad=False):
        ps = self._process_set
        self._ignore_stale = ignore_stale_grad
        if ps.size() > 1 and ps.included():
            self._sum_batch_sizes(batch_size, "update", stale_gradient(self._params))
        try:
            super().update(batch_size, ignore_stale_grad)
        finally:
            self._agreed = None

    def _update(self, ignore_stale_grad=False):
        if self._agreed is not None:
            agreed, self._agreed = self._agreed, None
            self._optimizer.rescale_grad = self._scale / agreed.mean()
            what = "DistributedTrainer step %d" % self._steps
            if agreed.written_ranks:   # before any rank may raise for a stale gradient
                stream = _stream_of(self._process_set, "DistributedTrainer")
                check_trainer_after_writes(
                    self, getattr(self, "_mxmpi_writes", None),
                    lambda row: rank_table(stream, row, "DistributedTrainer: " + WRITES_DESC),
                    what, agreed.written_ranks, NOT_APPLIED,
                    "copy one rank's weights to every rank with mxnet_mpi.horovod."
                    "broadcast_parameters(params, root_rank) called on every rank")
            agreed.refuse_if_stale_elsewhere(self._params, ignore_stale_grad, what)
            if ignore_stale_grad:
                self._fresh.apply(self._params)   # the same parameters on every rank
        if self._process_set.included():
            _share_noise(self._optimizer, self._process_set)
        super()._update(ignore_stale_grad)

    def _allreduce_grads(self):
        ps = self._process_set
        if ps.size() == 1 or not ps.included():
            return
        stale = stale_gradient(self._params)
        if stale:
            zero_stale(self._params)   # a stale gradient adds nothing to the sums
        if self._batch is not None:
            self._sum_batch_sizes(self._batch, "step", stale)
            self._batch = None
        pre = 1.0 / self._gradient_predivide_factor
        entries, spread = [], []
        for i, param in enumerate(self._params):
            if param.grad_req != "null":
                grads = param.list_grad()
                grad = grads[0]
                if len(grads) > 1:
                    # the sum over this rank's devices is what the ranks reduce, then
                    # every device gets it (Horovod reduces the first device's
                    # gradient only: the other devices' weights drifted apart)
                    grad = sum_over_devices(self._device_sums, i, grads)
                    spread.append((grad, grads))
                sent, ctx = self._compression.compress(grad)
                entries.append((i, param, grad, sent, ctx))
        if self._num_groups > 0:
            for g, group in enumerate(_split(entries, self._num_groups)):
                grouped_allreduce_([e[3] for e in group],
                                   name="%s%d:%s%d" % (self._prefix, group[0][0], self._prefix,
                                                       group[-1][0]),
                                   priority=-g, prescale_factor=pre, process_set=ps, op=Sum)
        else:
            for i, _, _, sent, _ in entries:
                allreduce_(sent, name=self._prefix + str(i), priority=-i, prescale_factor=pre,
                           process_set=ps, op=Sum)
        for _, _, grad, sent, ctx in entries:
            if sent is not grad:
                grad[:] = self._compression.decompress(sent, ctx)
        for total, grads in spread:
            fan_out(total, grads)


def _broadcast_after_init(param, root_rank: int, name: str, process_set):
    init_impl = param._init_impl

    def wrapped(self, *args, **kwargs):
        init_impl(*args, **kwargs)
        _broadcast_param(self, root_rank, name, process_set)
    return wrapped


def _broadcast_param(param, root_rank: int, name: str, process_set) -> None:
    """One broadcast of a Gluon parameter, copied to each of its devices (its
    other devices kept their own values, where Horovod assumes one)."""
    arrays = param.list_data()
    broadcast_(arrays[0], root_rank=root_rank, name=name, process_set=process_set)
    fan_out(arrays[0], arrays[1:])


def broadcast_parameters(params, root_rank: int = 0, prefix: str | None = None,
                         process_set=global_process_set) -> None:
    """Copy world rank `root_rank`'s parameters (a dict of NDArrays or a Gluon
    ParameterDict; deferred-init parameters as soon as they are initialised)
    to every rank of `process_set` (an mxnet_mpi extension; Horovod's has none)."""
    process_set = _trainer_set(process_set)
    if size() == 1 or process_set.size() == 1 or not process_set.included():
        return
    if prefix is not None and not isinstance(prefix, str):
        raise ValueError("prefix must be a string")
    prefix = prefix or ""
    if not isinstance(params, (dict, mx.gluon.ParameterDict)):
        raise ValueError("invalid params of type: %s" % type(params))
    # a parameter initialised on some ranks only (rank 0 loaded a checkpoint
    # before its first forward) is initialised everywhere first: the ranks
    # then broadcast the same parameters, now
    stream = _stream_of(process_set, "broadcast_parameters")

    def table(row, desc):
        return rank_table(stream, row, "broadcast_parameters: " + desc)

    # by name, as Horovod does, unless Gluon's name counters differ between
    # the ranks: then by position, under names of positions (param_order)
    items, same = agreed_order([(name, (name, p)) for name, p in params.items()], table)
    if not same:
        items = [("%d" % i, p) for i, (_, p) in enumerate(items)]
    settle_deferred([p for _, p in items if isinstance(p, mx.gluon.Parameter)], table)
    for name, p in items:
        if isinstance(p, mx.gluon.Parameter):
            try:
                p.list_data()
            except mx.gluon.parameter.DeferredInitializationError:
                p._init_impl = types.MethodType(
                    _broadcast_after_init(p, root_rank, prefix + str(name), process_set), p)
                continue
            _broadcast_param(p, root_rank, prefix + str(name), process_set)
        else:
            broadcast_(p, root_rank, name=prefix + str(name), process_set=process_set)

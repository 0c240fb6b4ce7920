"""Mend MXNet 1.9 optimizer updates that give wrong weights.

LAMB with ``multi_precision=True`` on float16 weights, updating one weight
at a time (``MXNET_OPTIMIZER_AGGREGATION_SIZE=1``, which mxnet_mpi sets in a
job of several ranks so each weight is updated as soon as its own gradient is
reduced; and always in the Module API's per-device updates), calls
``mp_lamb_update_phase2``, which writes the float16 weight but never the
float32 master copy: every step starts again from the master copy's first
value, and training goes nowhere, silently. The grouped update
(``multi_mp_lamb_update``) is right. Here the one-at-a-time update runs
LAMB's float32 update on the master copy and writes the float16 weight from
it, which is what the grouped update computes.

SGD's and LARS's grouped updates move the step number (``num_update``, what
a scheduler is asked for the rate) for a whole group before updating it; one
weight at a time, weights that had skipped the last step
(``ignore_stale_grad=True``, a branch not taken) and came first in a step
were updated at the last step's rate. Where mxnet_mpi chose one at a time
for them, the updater moves the number for each of MXNet's own groups (by
dtype, then groups of its default size) before that group's one-at-a-time
updates, as MXNet's grouped update would; the other optimizers count weight
by weight in MXNet too, and are left alone.

LARS with momentum and ``momentum_correction=True`` (its default) scales the
momentum by this step's learning rate over the last step's, where a
scheduler or ``set_learning_rate`` changed it. MXNet 1.9 moves "the last
step's rate" at every update call, so only the weights of a step's first call
got the correction: the first group of 4 (MXNet's default size), one weight
at a time, the first device's copies only (the others' then differ from it).
Here the rates move once per step (of a Trainer, or of a Module on
mxnet_mpi's stores: new_step; else the step number), and every weight of
the step, on every device, gets the correction, whatever the group size.

Nadam multiplies its ``m_schedule`` at each update call: where each device's
copy is updated (a rank's own updates, as on mxnet_mpi's stores), a second
device's copies took the schedule on from the first's, so they drifted apart
from them and from ranks with one device. Here another device's copy of a
parameter in the same step (of a Trainer, or of a Module on mxnet_mpi's
stores: new_step) starts from the schedule the first copy started from; a
program that moves to other devices, or keeps parameters on different ones,
updates as with MXNet alone.

SGLD adds Gaussian noise to every weight it updates, drawn from MXNet's
random generator: where each rank (and each device) updates its own copy,
ranks seeded apart (as for Dropout) or holding different numbers of devices
drew different noise and drifted apart silently. An optimizer that
mxnet_mpi's stores (or mxnet_mpi.horovod) use across several ranks is marked
(share_noise; for SGLD, the ranks first agree on a seed drawn from the first
rank's MXNet generator, so mx.random.seed still chooses the noise), and its
SGLD update then draws the noise from a generator seeded by that seed, the
weight's bytes after the gradient step, the parameter and its update count,
which are the same on every rank and device: the copies stay alike, float32
master copies included, whatever ranks join early.

MXNet's own stores get the mended updates too: they are the optimizer's, not
the store's.

A saved optimizer (``Trainer.save_states``, ``Module.save_optimizer_states``:
a pickle) carries its group size. Where mxnet_mpi chose it (its default in an
MPI job), the pickle holds MXNet's own default instead, marked, and a process
with mxnet_mpi's default in effect takes the marked size back when it loads
it: resumed without mxnet_mpi, the states went on with one-at-a-time updates
and MXNet's unmended LAMB, silently.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import warnings

import mxnet as mx
import numpy as np

from _mxnet_mpi_autoload import AGGREGATION_VAR, SET_HERE

_applied = False


def _mended_lamb(orig):
    @functools.wraps(orig)
    def _update_impl(self, index, weight, grad, state, multi_precision=False):
        # a list of several with one at a time: MXNet's own assertion answers
        one_at_a_time = not isinstance(index, (tuple, list)) or (
            self.aggregate_num <= 1 and len(index) == 1)
        if not (multi_precision and one_at_a_time):
            return orig(self, index, weight, grad, state, multi_precision=multi_precision)
        if isinstance(index, (tuple, list)):
            index, weight, grad, state = index[0], weight[0], grad[0], state[0]
        master, mean_var = state
        orig(self, index, master, grad.astype(master.dtype), mean_var, multi_precision=False)
        weight[:] = master.astype(weight.dtype)
        return None
    return _update_impl


def _param_ident(opt, index):
    """The parameter an update index serves, alike on every device: a
    Trainer's position; a Module's name (its index differs per device)."""
    params = getattr(opt, "param_dict", None) or {}
    return index if index in params else opt.idx2name.get(index, index)


def _unwrapped(opt):
    """The optimizer a wrapper (mxnet_mpi.horovod's, Horovod's
    DistributedOptimizer) holds, else `opt`."""
    inner = vars(opt).get("_optimizer")
    return inner if isinstance(inner, mx.optimizer.Optimizer) else opt


def new_step(optimizer) -> None:
    """A Trainer's or Module's update of all its parameters begins (LARS's
    rates move once per step, and Nadam's copies on several devices tell the
    step's first copy from the others by it); through a wrapper
    (mxnet_mpi.horovod's, Horovod's), its optimizer."""
    optimizer = _unwrapped(optimizer)
    optimizer._mxmpi_step = vars(optimizer).get("_mxmpi_step", 0) + 1


def _step_of(opt, ident, device: int):
    """The step an update of `ident`'s copy on `device` belongs to: new_step's
    mark, and within it, an update of a copy already updated since the mark
    (the updater called by hand after a Trainer's step) starts another; None
    where nothing marks steps."""
    mark = vars(opt).get("_mxmpi_step")
    if mark is None:
        return None
    key = vars(opt).get("_mxmpi_step_key")
    seen = vars(opt).setdefault("_mxmpi_seen", set())
    if key is None or key[0] != mark:
        key = (mark, 0)
        seen.clear()
    if (ident, device) in seen:
        key = (mark, key[1] + 1)
        seen.clear()
    seen.add((ident, device))
    opt._mxmpi_step_key = key
    return key


def _device_of(opt) -> int:
    """The device whose update counts `opt` keeps now (Updater sets it)."""
    return next((d for d, counts in opt._all_index_update_counts.items()
                 if counts is opt._index_update_count), 0)


def _nadam_per_device(orig):
    @functools.wraps(orig)
    def update(self, index, weight, grad, state):
        ident = _param_ident(self, index)
        step = _step_of(self, ident, weight.context.device_id)
        if step is None:   # no Trainer or Module of ours marks its steps: as MXNet alone
            return orig(self, index, weight, grad, state)
        before = vars(self).setdefault("_mxmpi_m_before", {})
        started = before.get(ident)
        if started is None or started[0] != step:
            # this parameter's first copy in this step: as MXNet alone
            before[ident] = (step, self.m_schedule)
            return orig(self, index, weight, grad, state)
        # another device's copy in the same step: from the schedule the first
        # copy started from
        own, self.m_schedule = self.m_schedule, started[1]
        try:
            return orig(self, index, weight, grad, state)
        finally:
            self.m_schedule = own
    return update


def _mxnet_group(opt) -> int | None:
    """MXNet's own group size for `opt` where it is SGD or LARS (whose grouped
    update moves the step number for the whole group first) and mxnet_mpi
    chose one at a time for it; else None."""
    chosen = _chosen_here()
    if not isinstance(opt, (mx.optimizer.SGD, mx.optimizer.LARS)) or chosen is None \
            or opt.aggregate_num != int(chosen):
        return None
    default = _mxnet_default(opt)
    return default if default and default > opt.aggregate_num else None


def _updater_call(orig):
    @functools.wraps(orig)
    def __call__(self, index, grad, weight):
        opt = _unwrapped(self.optimizer)
        listed = isinstance(index, (list, tuple))
        weights = list(weight) if listed else [weight]
        if not weights or not isinstance(weights[0], mx.nd.NDArray):
            return orig(self, index, grad, weight)
        device = weights[0].context.device_id
        group = _mxnet_group(opt)
        if group is None or not listed or len(index) <= 1:
            return orig(self, index, grad, weight)
        by_dtype: dict = {}
        for item in zip(index, grad, weights):
            by_dtype.setdefault(item[2].dtype, []).append(item)
        for items in by_dtype.values():
            for start in range(0, len(items), group):
                chunk = items[start:start + group]
                counts = opt._all_index_update_counts.get(device, {})
                opt.num_update = max([opt.num_update] + [
                    counts.get(i, opt.begin_num_update) + 1 for i, _, _ in chunk])
                orig(self, *(list(x) for x in zip(*chunk)))
        return None
    return __call__


def _lars_rates_per_step(orig):
    @functools.wraps(orig)
    def _get_lrs(self, indices):
        # a step: a Trainer's or Module's (new_step), else the step number
        step = _step_of(self, _param_ident(self, indices[0]), _device_of(self)) \
            if indices else None
        step = self.num_update if step is None else step
        if getattr(self, "_mxmpi_rates_step", None) != step or self.cur_lr is None:
            self._mxmpi_rates_step = step
            return orig(self, indices)   # a new step: its rate, the last one's kept
        rates = self.last_lr, self.cur_lr
        try:
            return orig(self, indices)
        finally:
            self.last_lr, self.cur_lr = rates
    return _get_lrs


def share_noise(optimizer, first: bool, sum_over_ranks) -> None:
    """Mark `optimizer` as updating copies of the weights that several ranks
    keep alike: its noise, where it draws any (SGLD), is the same on each.
    For SGLD, the first time, the ranks agree on a seed that the `first` rank
    draws from MXNet's generator: `sum_over_ranks(arr)` sums an int64 host
    array over the ranks in place (collective, at every rank's first update;
    a rank that joined adds zeros)."""
    if vars(optimizer).get("_mxmpi_shared_noise"):
        return
    if isinstance(optimizer, mx.optimizer.SGLD):
        if type(optimizer).update is not mx.optimizer.SGLD.update:
            warnings.warn("mxnet_mpi: %s overrides SGLD.update: noise it draws itself comes "
                          "from each rank's own random generator, and ranks seeded apart "
                          "(mx.random.seed) or on different numbers of devices drift apart. "
                          "Seed every rank alike, or check with MXNET_MPI_CONSISTENCY_EVERY "
                          "(docs/usage.md)"
                          % type(optimizer).__name__, RuntimeWarning, stacklevel=3)
        elif "_mxmpi_noise_seed" not in vars(optimizer):
            seed = mx.nd.array([_draw_seed() if first else 0], dtype="int64")
            sum_over_ranks(seed)
            optimizer._mxmpi_noise_seed = int(seed.asscalar())
    optimizer._mxmpi_shared_noise = True


def _draw_seed() -> int:
    return int(mx.nd.random.randint(0, 2 ** 31 - 1, shape=(1,), dtype="int64").asscalar())


def _shared_noise(opt, index, weight, lr: float):
    """SGLD's N(0, lr) noise for `weight`, from its bytes after the gradient
    step, its parameter (a Trainer's position; a Module's name, the same for
    each device's index) and its update count."""
    digest = hashlib.blake2b(repr((vars(opt).get("_mxmpi_noise_seed"), _param_ident(opt, index),
                                   opt._index_update_count.get(index))).encode(),
                             digest_size=16)
    digest.update(np.ascontiguousarray(weight.asnumpy()).tobytes())
    rng = np.random.default_rng(np.frombuffer(digest.digest(), dtype=np.uint32))
    noise = rng.standard_normal(weight.shape, dtype=np.float32) * np.float32(math.sqrt(lr))
    return mx.nd.array(noise, ctx=weight.context, dtype=weight.dtype)


def _sgld_shared(orig):
    @functools.wraps(orig)
    def update(self, index, weight, grad, state):
        if not getattr(self, "_mxmpi_shared_noise", False):
            return orig(self, index, weight, grad, state)
        # MXNet 1.9's SGLD update, its noise drawn by _shared_noise
        assert isinstance(weight, mx.nd.NDArray) and isinstance(grad, mx.nd.NDArray)
        self._update_count(index)
        lr = self._get_lr(index)
        wd = self._get_wd(index)
        grad = grad * self.rescale_grad
        if self.clip_gradient is not None:
            grad = mx.nd.clip(grad, -self.clip_gradient, self.clip_gradient)
        weight[:] += - lr / 2 * (grad + wd * weight)
        weight[:] += _shared_noise(self, index, weight, lr)
        return None
    return update


# The group size mxnet_mpi chose, in a saved optimizer's state
MARK = "_mxnet_mpi_aggregate_num"


def _mxnet_default(opt) -> int | None:
    """MXNet 1.9's group size for `opt` without MXNET_OPTIMIZER_AGGREGATION_SIZE
    (None: the variable does not reach it, or a class of the user's sets the
    size itself: an ``__init__`` of its own that assigns ``aggregate_num``)."""
    for base, default in ((mx.optimizer.LAMB, 45), (mx.optimizer.SGD, 4),
                          (mx.optimizer.LARS, 4)):
        if isinstance(opt, base):
            mro = type(opt).__mro__
            own = mro[:mro.index(base)]
            if any("aggregate_num" in getattr(vars(c).get("__init__"), "__code__",
                                              _NO_CODE).co_names for c in own):
                return None
            return default
    return None


_NO_CODE = (lambda: None).__code__


def _chosen_here() -> str | None:
    """The group size mxnet_mpi set in this process's environment, if it did
    and it is still in effect."""
    value = SET_HERE.get(AGGREGATION_VAR)
    return value if value is not None and os.environ.get(AGGREGATION_VAR) == value else None


def _saving(orig):
    @functools.wraps(orig)
    def __getstate__(self):
        state = orig(self)
        if "_mxmpi_shared_noise" in state:   # a mark of the job that saved it
            state = {k: v for k, v in state.items() if k != "_mxmpi_shared_noise"}
        chosen, default = _chosen_here(), _mxnet_default(self)
        if chosen is not None and default is not None and \
                state.get("aggregate_num") == int(chosen):
            state = dict(state, aggregate_num=default, **{MARK: state["aggregate_num"]})
        return state
    return __getstate__


def _loading(orig):
    @functools.wraps(orig)
    def __setstate__(self, state):
        marked = state.pop(MARK, None) if isinstance(state, dict) else None
        orig(self, state)
        if marked is not None and _chosen_here() is not None:
            self.aggregate_num = marked
    return __setstate__


def apply() -> None:
    """Install the mended updates and the saved group size (idempotent)."""
    global _applied
    if _applied:
        return
    lamb = mx.optimizer.LAMB
    lamb._update_impl = _mended_lamb(lamb._update_impl)
    lars = mx.optimizer.LARS
    lars._get_lrs = _lars_rates_per_step(lars._get_lrs)
    sgld = mx.optimizer.SGLD
    sgld.update = _sgld_shared(sgld.update)
    nadam = mx.optimizer.Nadam
    nadam.update = _nadam_per_device(nadam.update)
    updater = mx.optimizer.Updater
    updater.__call__ = _updater_call(updater.__call__)
    base = mx.optimizer.Optimizer
    base.__getstate__ = _saving(base.__getstate__)
    base.__setstate__ = _loading(base.__setstate__)
    _applied = True

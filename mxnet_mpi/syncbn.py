"""Batch normalisation synchronised across ranks.

``mxnet_mpi.SyncBatchNorm`` is a drop-in for ``gluon.nn.BatchNorm`` (and
``gluon.contrib.nn.SyncBatchNorm``, whose statistics only cover the devices
of one process): in training, the batch mean and variance of each channel
come from the batches of **every rank** (per-channel sums allreduced by one
engine-embedded collective per layer in forward), and the
backward pass allreduces the two per-channel sums the input gradient needs.
gamma's and beta's gradients stay per rank: the Trainer's allreduce sums them.
Ranks may have different batch sizes, and a rank may have several devices
(``ctx=[...]``): their sums meet first (``device_meeting``), then one
collective per layer and phase crosses the ranks. Outside training it uses the
running statistics, like BatchNorm.

Each rank sends its count, n·mean and centred sum of squares + n·mean²
(two local passes, as BatchNorm's variance), in float64, so that the global
variance keeps BatchNorm's accuracy when a channel's mean is large against its
spread. Tested against ``gluon.nn.BatchNorm`` on the global batch
(tests/test_syncbn.py): one layer (outputs, gradients, running statistics,
also with inputs of mean 1000 and spread 1), and a residual convnet of five
layers (every gradient, and the weights after 3 steps).

Forward collectives share one communicator; each layer's backward ones have
their own (created at its first training forward; two threads each), so the
order in which the engine runs layers' backward passes cannot pair collectives
of different layers or steps. The block runs imperatively (``hybridize()``
is refused: the collective is not a symbol).
"""

from __future__ import annotations

import itertools
import os

import mxnet as mx
import numpy as np
from mxnet import autograd
from mxnet.gluon import HybridBlock

from . import ops
from .collectives import engine_is_synchronous
from .custom_function import Function
from .device_meeting import DeviceMeeting
from .errors import MPIKVStoreError
from .modes import create_stream
from .world import init as init_world


class _Channel:
    """A communicator and stream for SyncBatchNorm's collectives (collective
    to create: made at a layer's first training forward, in program order)."""

    def __init__(self, name: str) -> None:
        self.comm = init_world()
        self.stream = create_stream("concurrent", self.comm, name)


# Why these channels. A stream runs its collectives in push order. Forward
# collectives are pushed by the Python thread in program order: one stream
# for all layers. Backward collectives are pushed later, from the callbacks
# of the backward pass, in the order the engine makes layers ready, which can
# differ between ranks (a residual block's two branches) and which comes after
# the next step's forward was pushed: each layer gets its own backward stream,
# so neither a forward collective nor another layer's can stand in front of it.
# Never the chained stream: its process-wide chain would put a collective
# pushed during backward behind the Trainer's allreduces that wait for it.
_forward_channel: list = []


def _forward() -> _Channel:
    if not _forward_channel:
        _forward_channel.append(_Channel("SyncBatchNorm forward"))
    return _forward_channel[0]


def _reducer(name: str, channel: _Channel):
    """Sum an array over the ranks in place (one device per rank). Each
    collective's name carries its round (the n-th forward; backward gets its
    forward's), and ranks compare names: two ranks pushing one layer's rounds
    in different orders get an error, never each other's sums."""
    rounds = itertools.count()

    def reduce(arr, _device, round_id=None) -> tuple:
        if round_id is None:
            round_id = next(rounds)
        # float64 on the wire, as a rank with several devices sums its parts
        # (device_meeting): ranks with one and with several devices meet
        wide = arr.astype("float64", copy=False)
        ops.allreduce_(wide, name="%s (round %d)" % (name, round_id), store=channel)
        return (wide if wide is arr else wide.astype(arr.dtype)), round_id
    return reduce


def _meeting(devices, name: str, channel: _Channel):
    """Sum an array over this rank's devices, then over the ranks."""
    def allreduce(total, round_name: str) -> None:
        ops.allreduce_(total, name=round_name, store=channel)
    return DeviceMeeting(devices, name, allreduce).exchange


# Every engine op that uses temporary space takes one of MXNet's temp spaces
# for itself, and all CPU contexts share one pool of MXNET_CPU_TEMP_COPY of
# them (each GPU has its own). Device 0's ops after a SyncBatchNorm wait for
# device 1's part, which Gluon pushes later: once they hold every CPU temp
# space, device 1's ops queue behind them for good.
_CPU_CONTEXTS = (
    "mxnet_mpi.SyncBatchNorm over several CPU contexts of one rank (%s) deadlocks with MXNet's "
    "default of 4 CPU temp spaces, which all CPU contexts share (MXNet's own "
    "gluon.contrib.nn.SyncBatchNorm hangs there too). On CPUs run one rank per device "
    "(mpirun -np N, --devices 1); to use several CPU contexts anyway, set MXNET_CPU_TEMP_COPY "
    "before MXNet starts to more than the ops that use temp space after the first "
    "SyncBatchNorm (128 was enough for a 5-layer convnet on 3 contexts; resnet18 on 2 "
    "contexts needs more than 128 and ran with 512)")


class _SyncBNFunction(Function):
    """y = gamma * (x - mean) / sqrt(var + eps) + beta with mean and var over
    all ranks' batches; backward as the global batch's BatchNorm gives it.
    `sum_forward(arr, device)` / `sum_backward(arr, device, round)` return
    (`arr` summed over every device of every rank, the round): backward's
    round is its forward's, so each device's backward meets the same step's."""

    def __init__(self, axis: int, eps: float, sum_forward, sum_backward) -> None:
        super().__init__()
        self._axis, self._eps = axis, eps
        self._sum_forward, self._sum_backward = sum_forward, sum_backward

    def _shape(self, x) -> tuple:
        return tuple(x.shape[self._axis] if i == self._axis else 1 for i in range(x.ndim))

    def _axes(self, x) -> tuple:
        return tuple(i for i in range(x.ndim) if i != self._axis)

    def forward(self, x, gamma, beta):
        # float16 data is normalised in float32 with float32 parameters, as
        # BatchNorm does (SyncBatchNorm.cast keeps the parameters float32)
        self._dtype, self._param_dtype = x.dtype, gamma.dtype
        if x.dtype == np.float16:
            x = x.astype("float32")
        if gamma.dtype != x.dtype:
            gamma, beta = gamma.astype(x.dtype), beta.astype(x.dtype)
        axes, shape = self._axes(x), self._shape(x)
        c = x.shape[self._axis]
        n = x.size // c
        # Each rank's mean and centred sum of squares (two passes, as BatchNorm
        # does), combined over ranks in float64: sum x = sum n_r m_r and
        # sum x² = sum (M2_r + n_r m_r²), so E[x²] - mean² cancels only in float64.
        # an empty batch on this rank (mx.np allows one) adds nothing: its
        # mean would be NaN, and NaN times a count of 0 is NaN on every rank
        local_mean = x.mean(axis=axes) if n else mx.nd.zeros((c,), dtype=x.dtype, ctx=x.context)
        centred = x - local_mean.reshape(shape)
        m2 = (centred * centred).sum(axis=axes).astype("float64")
        m64 = local_mean.astype("float64")
        count = mx.nd.full((1,), n, dtype="float64", ctx=x.context)
        self._device = x.context
        part = mx.nd.concat(m64 * n, m2 + m64 * m64 * n, count, dim=0)
        stats, self._round = self._sum_forward(part, self._device)
        total64 = stats[2 * c:2 * c + 1]
        mean64 = stats[:c] / total64
        var64 = mx.nd.relu(stats[c:2 * c] / total64 - mean64 * mean64)  # rounding: >= 0
        mean, var = mean64.astype(x.dtype), var64.astype(x.dtype)
        total = total64.astype(x.dtype)
        inv_std = 1.0 / mx.nd.sqrt(var + self._eps)
        xhat = (x - mean.reshape(shape)) * inv_std.reshape(shape)
        y = xhat * gamma.reshape(shape) + beta.reshape(shape)
        # Backward runs later, in a callback whose engine ops are pushed after
        # whatever the program pushed meanwhile (the optimizer's update of
        # gamma): it must read only arrays made here, never gamma itself, or
        # the update would wait for the gradient that waits for the update.
        scale = gamma * inv_std
        self.save_for_backward(xhat, scale, total)
        return (y if y.dtype == self._dtype else y.astype(self._dtype)), mean, var

    def backward(self, dy, _dmean, _dvar):
        xhat, scale, total = self.saved_tensors
        if xhat.size == 0:   # an empty batch: its part of the sums is zero, dx is empty
            c = xhat.shape[self._axis]
            zeros = mx.nd.zeros((2 * c,), dtype=xhat.dtype, ctx=xhat.context)
            self._sum_backward(zeros, self._device, self._round)
            return dy, zeros[c:].astype(self._param_dtype), zeros[:c].astype(self._param_dtype)
        if dy.dtype != xhat.dtype:
            dy = dy.astype(xhat.dtype)
        axes, shape = self._axes(xhat), self._shape(xhat)
        c = xhat.shape[self._axis]
        scale = scale.reshape(shape)
        # dy wraps the backward graph's memory under an engine variable of its
        # own, and the graph node ends when our outputs are written, not when
        # our reads of dy are done: MXNet may hand that memory to another array
        # as soon as this callback returns. So dy is read only here, up front,
        # and those reads are waited for (dy itself is already computed: this
        # runs on a custom-operator thread once the inputs are ready); what
        # comes after the allreduce reads arrays made here. (Reading dy after
        # the allreduce gave wrong gradients in resnet.)
        dbeta = dy.sum(axis=axes)
        dgamma = (dy * xhat).sum(axis=axes)
        dy_scaled = dy * scale
        for arr in (dbeta, dgamma, dy_scaled):
            arr.wait_to_read()
        sums, _ = self._sum_backward(mx.nd.concat(dbeta, dgamma, dim=0), self._device,
                                     self._round)
        mean_dy = (sums[:c] / total).reshape(shape)
        mean_dy_xhat = (sums[c:] / total).reshape(shape)
        dx = dy_scaled - (mean_dy + xhat * mean_dy_xhat) * scale
        if dx.dtype != self._dtype:
            dx = dx.astype(self._dtype)
        if dgamma.dtype != self._param_dtype:
            dgamma, dbeta = dgamma.astype(self._param_dtype), dbeta.astype(self._param_dtype)
        return dx, dgamma, dbeta


class SyncBatchNorm(HybridBlock):
    """BatchNorm whose batch statistics cover every rank (see module docs).
    Arguments as ``gluon.nn.BatchNorm`` (``axis``, ``momentum``, ``epsilon``,
    ``center``, ``scale``, initialisers, ``in_channels``)."""

    _count = 0

    def __init__(self, axis: int = 1, momentum: float = 0.9, epsilon: float = 1e-5,
                 center: bool = True, scale: bool = True, use_global_stats: bool = False,
                 beta_initializer="zeros", gamma_initializer="ones",
                 running_mean_initializer="zeros", running_variance_initializer="ones",
                 in_channels: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        self._axis, self._momentum, self._eps = axis, momentum, epsilon
        self._use_global_stats = use_global_stats
        self._fix_gamma = not scale   # as BatchNorm: gamma taken as 1, whatever it holds
        self._sums = None   # (forward, backward) summing functions, made at first use
        SyncBatchNorm._count += 1
        self._label = "SyncBatchNorm %d" % SyncBatchNorm._count
        with self.name_scope():
            self.gamma = self.params.get("gamma", grad_req="write" if scale else "null",
                                         shape=(in_channels,), init=gamma_initializer,
                                         allow_deferred_init=True, differentiable=scale)
            self.beta = self.params.get("beta", grad_req="write" if center else "null",
                                        shape=(in_channels,), init=beta_initializer,
                                        allow_deferred_init=True, differentiable=center)
            self.running_mean = self.params.get("running_mean", grad_req="null",
                                                shape=(in_channels,),
                                                init=running_mean_initializer,
                                                allow_deferred_init=True, differentiable=False)
            self.running_var = self.params.get("running_var", grad_req="null",
                                               shape=(in_channels,),
                                               init=running_variance_initializer,
                                               allow_deferred_init=True, differentiable=False)

    def cast(self, dtype) -> None:
        """As BatchNorm: float16 leaves the parameters and statistics float32."""
        if np.dtype(dtype).name == "float16":
            dtype = "float32"
        super().cast(dtype)

    def hybridize(self, active: bool = True, **kwargs) -> None:
        if active:
            raise MPIKVStoreError("mxnet_mpi.SyncBatchNorm cannot be hybridized: its "
                                  "cross-rank collective is not a symbol; hybridize the blocks "
                                  "around it instead")
        super().hybridize(active, **kwargs)

    def infer_shape(self, x, *args) -> None:
        c = x.shape[self._axis]
        for p in (self.gamma, self.beta, self.running_mean, self.running_var):
            p.shape = (c,)

    def hybrid_forward(self, F, x, gamma, beta, running_mean, running_var):
        if F is not mx.nd:
            raise MPIKVStoreError("mxnet_mpi.SyncBatchNorm runs imperatively only")
        if not isinstance(x, mx.np.ndarray):
            return self._forward(F, x, gamma, beta, running_mean, running_var)
        # after npx.set_np(): the same computation on legacy views of the same
        # memory (and autograd entries), the result as an mx.np array again
        legacy = [a.as_nd_ndarray() for a in (x, gamma, beta, running_mean, running_var)]
        return self._forward(F, *legacy).as_np_ndarray()

    def _forward(self, F, x, gamma, beta, running_mean, running_var):
        if not autograd.is_training() or self._use_global_stats:
            return F.BatchNorm(x, gamma, beta, running_mean, running_var, eps=self._eps,
                               momentum=self._momentum, axis=self._axis,
                               use_global_stats=True, fix_gamma=self._fix_gamma)
        if self._sums is None:   # first training forward: the same order on every rank
            self._sums = self._make_sums(self.gamma.list_ctx())
        if self._fix_gamma:
            gamma = F.ones_like(gamma)
        fn = _SyncBNFunction(self._axis % x.ndim, self._eps, *self._sums)
        y, mean, var = fn(x, gamma, beta)
        if autograd.is_recording():   # BatchNorm updates them in its backward, so never
            with autograd.pause():    # outside autograd.record()
                m = self._momentum
                if mean.dtype != running_mean.dtype:
                    mean, var = mean.astype(running_mean.dtype), var.astype(running_mean.dtype)
                running_mean[:] = running_mean * m + mean * (1 - m)
                running_var[:] = running_var * m + var * (1 - m)
        return y

    def _make_sums(self, devices: list) -> tuple:
        # Creating the channels is a collective of MPI's that no stall check
        # watches: a rank that never trains this layer (inference on one rank
        # only) left the others blocked there without a word. A collective on
        # the free functions' store first: a rank missing from it is named
        # (its program ended, or it waits elsewhere) and the job ends.
        ready = mx.nd.zeros((1,))
        ops.allreduce_(ready, name="%s: first training forward (every rank trains it, in "
                       "autograd.record())" % self._label)
        ready.wait_to_read()
        forward = _forward()
        backward = _Channel(self._label + " backward")
        names = ("%s forward statistics" % self._label, "%s backward sums" % self._label)
        if len(devices) == 1:
            return _reducer(names[0], forward), _reducer(names[1], backward)
        if engine_is_synchronous():
            # a device's result waits for devices the one thread has not reached
            raise MPIKVStoreError("mxnet_mpi.SyncBatchNorm on several devices per rank needs "
                                  "MXNet's threaded engine, not MXNET_ENGINE_TYPE=NaiveEngine")
        cpus = [str(d) for d in devices if d.device_type == "cpu"]
        if len(cpus) > 1 and not os.environ.get("MXNET_CPU_TEMP_COPY"):
            raise MPIKVStoreError(_CPU_CONTEXTS % ", ".join(cpus))
        return _meeting(devices, names[0], forward), _meeting(devices, names[1], backward)

    def __repr__(self) -> str:
        return "SyncBatchNorm(axis=%d, eps=%g, momentum=%g, ranks: all)" % (
            self._axis, self._eps, self._momentum)

"""The batch-size rule: ranks that pass different batch sizes to one step still
apply the same update.

Gluon divides the summed gradient by the ``batch_size`` given to
``trainer.step``; with a different batch size per rank (a short last batch,
uneven shards) every rank would rescale by its own and the weights drift
apart. Our stores apply one rule on every rank instead::

    rescale_grad = trainer scale / mean_b,   mean_b = (sum of b_r) / (ranks that took part)

When every rank passes the same ``b``, ``mean_b`` is exactly ``b`` (an integer
sum divided by the number of ranks), so the numbers are bit for bit those of
one rank dividing by its own ``b``. The batch sizes travel as part
``[b, 1, s, w, d_0, ..., d_31]`` of a collective the step makes anyway (or a
collective of their own, docs/store.md); a rank that has joined adds zeros.
``s`` is 1 on a rank with a gradient that backward has not updated since the
last step: summed, it tells every rank whether any rank's was stale. ``w`` is
1 on a rank that wrote weights or optimizer states outside training since the
last step (weight_writes.py): summed, it tells every rank to compare them.

``d_i`` are the bits of a 32-bit digest of the rank's optimizer settings
(followed by 16 bits of a digest of them without the values an optimizer
advances as it updates, which tells that cause apart in the error)
(optimizer_settings.py). Summed over the m ranks that took part, each is 0 or
m when every rank holds the same digest, and only then: any other sum means
the optimizers differ, and every rank sees the same sums, so every rank
raises at the same step (exact in float32 up to 2**24 ranks).
"""

from __future__ import annotations

import ctypes

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, check_call

from . import _native, optimizer_settings, world
from .collectives import Call
from .errors import MPIKVStoreError
from .stale_grads import stale_gradient

#: What the separate collective of the batch sizes is called in messages.
NAME = "the batch sizes"
#: Bits of the optimizer settings' digest that ride with the batch sizes.
DIGEST_BITS = 32
#: Bits of a second digest, of the settings without the values an optimizer
#: advances as it updates (optimizer_settings.without_progress): where it
#: agrees and the first does not, the error names that cause.
SETTINGS_BITS = 16
#: Elements of the array: [batch size, 1, stale, written, digest bits...,
#: second digest's bits...].
SIZE = 4 + DIGEST_BITS + SETTINGS_BITS
#: Flags of a rank's step (fill's `flags`): a stale gradient; weights or
#: optimizer states written outside training since the last step.
STALE, WRITTEN = 1, 2


class BatchSizes:
    """A host array ``[this rank's batch size, 1, stale, written, digest bits]``
    that an allreduce turns into ``[sum of the batch sizes, ranks that took
    part, ranks with a stale gradient, ranks that wrote, sums of the bits]``.
    Built once and reused every step; written and read through its memory (no
    engine op), which is safe because each use waits for the previous sum
    first."""

    def __init__(self, dtype="float64") -> None:
        self.dtype = np.dtype(dtype)
        self.array = mx.nd.zeros((SIZE,), dtype=self.dtype)
        self.array.wait_to_read()
        ptr = ctypes.c_void_p()
        check_call(_LIB.MXNDArrayGetData(self.array.handle, ctypes.byref(ptr)))
        ctype = ctypes.c_float if self.dtype == np.float32 else ctypes.c_double
        self._view = np.ctypeslib.as_array((ctype * SIZE).from_address(ptr.value))
        self._pending = False
        self._settings = ""
        self._what = ""
        self.stale_ranks = 0     # of the last sum read
        self.written_ranks = 0   # of the last sum read

    def fill(self, batch_size, settings: str = "", what: str = "", flags: int = 0) -> None:
        """This rank's batch size, optimizer settings (optimizer_settings.
        describe; "" for none) and `flags` (STALE, WRITTEN: step_flags),
        before the allreduce that sums them is pushed; `what` names the step
        in the error when the settings differ."""
        if self._pending:
            self.array.wait_to_read()   # the previous sum is still in flight
        d = optimizer_settings.digest(settings, DIGEST_BITS)
        e = optimizer_settings.digest(optimizer_settings.without_progress(settings),
                                      SETTINGS_BITS)
        self._view[0] = batch_size
        self._view[1] = 1
        self._view[2] = 1 if flags & STALE else 0
        self._view[3] = 1 if flags & WRITTEN else 0
        self._view[4:4 + DIGEST_BITS] = [(d >> i) & 1 for i in range(DIGEST_BITS)]
        self._view[4 + DIGEST_BITS:] = [(e >> i) & 1 for i in range(SETTINGS_BITS)]
        self._settings, self._what = settings, what
        self._pending = True

    def _read(self) -> tuple:
        """(sum of batch sizes, ranks that took part); waits for the allreduce
        and raises its error, if it failed, or an error when the ranks'
        optimizer settings differ."""
        self.array.wait_to_read()
        self._pending = False
        ranks = float(self._view[1])
        self.stale_ranks = int(self._view[2])
        self.written_ranks = int(self._view[3])
        bits = self._view[4:4 + DIGEST_BITS]
        if np.any((bits != 0) & (bits != ranks)):
            rest = self._view[4 + DIGEST_BITS:]
            only_progress = not np.any((rest != 0) & (rest != ranks))
            raise MPIKVStoreError(
                "mxnet_mpi: %sthe ranks' optimizer settings differ, so their weights would "
                "drift apart (each rank updates its own copy); make them the same on every "
                "rank. This rank (%s) has: %s.%s" % (
                    self._what + ": " if self._what else "", _rank_text(),
                    self._settings or "no optimizer",
                    optimizer_settings.advice(self._settings) if only_progress else ""))
        return float(self._view[0]), ranks

    def refuse_if_stale_elsewhere(self, params, ignore_stale_grad: bool, what: str) -> None:
        """After a read: raise UserWarning where another rank had a stale
        gradient at this step (MXNet's Trainer raises on that rank, naming the
        parameter, and does not apply the step; no rank may, or that rank's
        weights fall behind the others'). `params`: this rank's (Gluon)."""
        if self.stale_ranks and not ignore_stale_grad and not stale_gradient(params):
            raise UserWarning(
                "mxnet_mpi: %s: a gradient on %d other rank(s) has not been updated by "
                "backward since the last step, so no rank applies this step (MXNet raises "
                "there, naming the parameter)" % (what, self.stale_ranks))

    def mean(self) -> float:
        """The mean batch size of the ranks that took part (the rule's divisor)."""
        total, ranks = self._read()
        return total / ranks

    def total(self) -> float:
        """The sum of the batch sizes over the ranks that took part."""
        return self._read()[0]

    def push(self, stream, batch_size, context: bytes | None = None,
             settings: str = "", flags: int = 0) -> BatchSizes:
        """Sum `batch_size` (and compare `settings`, count `flags`: see fill)
        over the ranks of `stream` (a collectives.Stream) by an allreduce of
        its own; `context` names it in messages."""
        self.fill(batch_size, settings, context.decode(errors="replace") if context else "",
                  flags)
        stream.push([self.call()], context)
        return self

    def call(self, priority: int = 1, token: str | None = None) -> Call:
        """The allreduce of these batch sizes alone (flags 0: never averaged or
        compressed); with `token`, this rank's place in it only (why it cannot
        take part)."""
        arrays = [self.array] if token is None else []
        return Call(_native.ALLREDUCE, arrays, arrays, dtype=self.dtype,
                    shapes=[(SIZE,)], desc="allreduce of the batch sizes %s" % self.dtype,
                    label=NAME, name=NAME, priority=priority, token=token)


class SettingsComparison:
    """Compares the ranks' optimizer settings, for updates that sum no batch
    sizes (Module's, DistributedOptimizer's), at most once per `period` of a
    count that is the same on every rank at each call, never waiting: each
    comparison is read at the next one, and raises then on every rank if the
    settings differed. Waiting at once would keep a Python-bound loop from
    running ahead of its collectives."""

    def __init__(self, period: int) -> None:
        self.period = period
        self._window: int | None = None
        self._pending: BatchSizes | None = None
        self._pending_flags = 0   # this rank's flags in the pending comparison

    def restart(self, count: int) -> None:
        """Count afresh from `count` (after a join, where call counts differ)."""
        self._window = count // self.period

    def tick(self, count: int, stream, context: bytes | None, settings, written=None,
             after_writes=None) -> None:
        """At the first call and the first after each `period` of `count`:
        push a comparison of `settings()` (optimizer_settings.describe) over
        `stream` (collective) and read the previous one. With `written` (a
        callable: whether this rank wrote weights or optimizer states outside
        training since its last push), a previous comparison in which any rank
        had calls `after_writes(ranks that had)` (collective) on every rank."""
        window = count // self.period
        if window == self._window:
            return
        self._window = window
        previous, self._pending = self._pending, None
        if previous is not None:
            previous.total()   # raises if the ranks' settings differed
            if previous.written_ranks and after_writes is not None:
                after_writes(previous.written_ranks)
        flags = WRITTEN if written is not None and written() else 0
        self._pending = (previous or BatchSizes()).push(stream, 0, context, settings(), flags)
        self._pending_flags = flags

    def settle(self, stream, context: bytes | None, settings, written=None,
               after_writes=None) -> None:
        """Compare now and wait for it (collective, at a point every rank
        reaches alike, e.g. after a join), raising or calling `after_writes`
        as tick's reads do. The pending comparison is read here too, but
        after a join each rank's pending one may be another collective (a
        rank that joined early ticked fewer times): what it says about
        writes is not acted on alike, so each rank carries its own flag of
        it into the new comparison instead."""
        previous, self._pending = self._pending, None
        flags = 0
        if previous is not None:
            previous.total()   # raises if the ranks' settings differed
            flags = self._pending_flags
        if written is not None and written():
            flags |= WRITTEN
        now = (previous or BatchSizes()).push(stream, 0, context, settings(), flags)
        now.total()
        if now.written_ranks and after_writes is not None:
            after_writes(now.written_ranks)


def step_flags(refused_stale: bool, written: bool) -> int:
    """This rank's flags for a step: STALE where a gradient backward has not
    updated refuses the step (stale_grads.stale_gradient, ignore_stale_grad
    False), WRITTEN where weights or optimizer states were written outside
    training since the last step."""
    return (STALE if refused_stale else 0) | (WRITTEN if written else 0)


def _rank_text() -> str:
    """'rank R of N' in the world, for messages."""
    try:
        return "rank %d of %d" % (world.rank(), world.size())
    except Exception:   # noqa: BLE001 - a message must not fail
        return "this rank"

"""The batch-size rule: ranks that pass different batch sizes to one step still
apply the same update.

Gluon divides the summed gradient by the ``batch_size`` given to
``trainer.step``; with a different batch size per rank (a short last batch,
uneven shards) every rank would rescale by its own and the weights drift
apart. Our stores apply one rule on every rank instead::

    rescale_grad = trainer scale / mean_b,   mean_b = (sum of b_r) / (ranks that took part)

When every rank passes the same ``b``, ``mean_b`` is exactly ``b`` (an integer
sum divided by the number of ranks), so the numbers are bit for bit those of
one rank dividing by its own ``b``. The batch sizes travel as a 2-element
part ``[b, 1]`` of a collective the step makes anyway (or a collective of
their own, docs/store.md); a rank that has joined adds zeros to both.
"""

from __future__ import annotations

import ctypes

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, check_call

from . import _native
from .collectives import Call

#: What the separate collective of the batch sizes is called in messages.
NAME = "the batch sizes"


class BatchSizes:
    """A host array ``[this rank's batch size, 1]`` that an allreduce turns
    into ``[sum of the batch sizes, ranks that took part]``. Built once and
    reused every step; written and read through its memory (no engine op),
    which is safe because each use waits for the previous sum first."""

    def __init__(self, dtype="float64") -> None:
        self.dtype = np.dtype(dtype)
        self.array = mx.nd.zeros((2,), dtype=self.dtype)
        self.array.wait_to_read()
        ptr = ctypes.c_void_p()
        check_call(_LIB.MXNDArrayGetData(self.array.handle, ctypes.byref(ptr)))
        ctype = ctypes.c_float if self.dtype == np.float32 else ctypes.c_double
        self._view = np.ctypeslib.as_array((ctype * 2).from_address(ptr.value))
        self._pending = False

    def fill(self, batch_size) -> None:
        """This rank's batch size, before the allreduce that sums it is pushed."""
        if self._pending:
            self.array.wait_to_read()   # the previous sum is still in flight
        self._view[0] = batch_size
        self._view[1] = 1
        self._pending = True

    def _read(self) -> tuple:
        """(sum of batch sizes, ranks that took part); waits for the allreduce
        and raises its error, if it failed."""
        self.array.wait_to_read()
        self._pending = False
        return float(self._view[0]), float(self._view[1])

    def mean(self) -> float:
        """The mean batch size of the ranks that took part (the rule's divisor)."""
        total, ranks = self._read()
        return total / ranks

    def total(self) -> float:
        """The sum of the batch sizes over the ranks that took part."""
        return self._read()[0]

    def push(self, stream, batch_size, context: bytes | None = None) -> BatchSizes:
        """Sum `batch_size` over the ranks of `stream` (a collectives.Stream) by
        an allreduce of its own; `context` names it in messages."""
        self.fill(batch_size)
        stream.push([self.call()], context)
        return self

    def call(self, priority: int = 1) -> Call:
        """The allreduce of these batch sizes alone (flags 0: never averaged or
        compressed)."""
        return Call(_native.ALLREDUCE, [self.array], [self.array], dtype=self.dtype,
                    shapes=[(2,)], desc="allreduce of the batch sizes %s" % self.dtype,
                    label=NAME, name=NAME, priority=priority)

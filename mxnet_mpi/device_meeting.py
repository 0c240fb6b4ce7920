"""Sums over the devices of one rank, then over the ranks, for arrays that
each device produces in its own time.

Gluon runs a multi-device step one device after the other from one thread:
device 0's layer is pushed before device 1's has started, yet needs a sum that
includes device 1. ``DeviceMeeting.exchange`` returns at once an array whose
value is that sum: its write is an engine op held open
(``_native.hold_write``) until the last device's part has arrived; that call
adds the parts, pushes one allreduce over the ranks and releases the write.
Nothing blocks a thread, so the devices' ops keep flowing in between.

Parts meet in rounds. Without a round id, a device's n-th call is round n, and
a device may not start round n+1 before every device has started round n (a
device that skipped a call would otherwise be paired with the wrong step).
With a round id (the backward pass: the round of the forward it belongs to),
the parts of that id meet, whenever each comes. Rounds reach the stream in the
order they complete, under one lock: in forward, program order, the same on
every rank. Collective names carry the round and ranks compare names, so
backward rounds completing in different orders on two ranks (possible only
when several backward passes run with nothing between them) fail on every rank
instead of mixing rounds.
"""

from __future__ import annotations

import threading
from typing import Callable, Hashable, Sequence

import mxnet as mx

from . import _native
from .errors import MPIKVStoreError


class _Round:
    __slots__ = ("result", "ticket", "parts")

    def __init__(self, result, ticket: int) -> None:
        self.result, self.ticket, self.parts = result, ticket, {}


class DeviceMeeting:
    """Per-device float64 parts of one layer and phase, summed over the given
    devices of this rank and then by `allreduce(total, name)` over the ranks."""

    def __init__(self, devices: Sequence, name: str, allreduce: Callable) -> None:
        self._name, self._allreduce = name, allreduce
        self._lock = threading.Lock()
        self._calls = {str(d): 0 for d in devices}   # training forwards per device
        self._rounds: dict = {}

    def exchange(self, part, device, round_id: Hashable | None = None) -> tuple:
        """(sum of every device's `part` of this round on `part`'s context, the
        round's id). The sum is an array whose value the engine supplies once
        all parts are in. `device` names the sender: an autograd.Function's
        backward gets arrays labelled cpu(0) whichever CPU device it serves."""
        device = str(device)
        if device not in self._calls:
            raise MPIKVStoreError("%s: called on %s, which is not one of this layer's devices %s"
                                  % (self._name, device, list(self._calls)))
        host = part.astype("float64", copy=False).as_in_context(mx.cpu())
        with self._lock:
            if round_id is None:
                round_id = self._next_round(device)
            rnd = self._rounds.get(round_id)
            if rnd is None:
                result = mx.nd.empty(host.shape, ctx=mx.cpu(), dtype="float64")
                desc = "%s (round %s)" % (self._name, round_id)
                rnd = self._rounds[round_id] = _Round(result, _native.hold_write(result, desc))
            problem = self._refusal(rnd, device, host)
            if problem:
                self._abandon(round_id)
                raise MPIKVStoreError("%s (round %s): %s" % (self._name, round_id, problem))
            rnd.parts[device] = host
            if len(rnd.parts) == len(self._calls):
                del self._rounds[round_id]
                total = mx.nd.add_n(*rnd.parts.values())
                self._allreduce(total, "%s (round %s)" % (self._name, round_id))
                _native.release_write(rnd.ticket, total)
        return rnd.result.as_in_context(part.context).astype(part.dtype, copy=False), round_id

    def _next_round(self, device: str) -> int:
        n = self._calls[device]
        behind = [d for d, calls in self._calls.items() if calls < n]
        if behind:
            lagging = min(self._calls[d] for d in behind)
            for late in [r for r in self._rounds if r < n]:
                self._abandon(late)
            # start afresh: every device's next forward is round n
            self._calls = dict.fromkeys(self._calls, n)
            raise MPIKVStoreError(
                "%s: %s starts its training forward number %d while %s ran only %d: every "
                "device of a rank must run each training forward of the layer (a forward on "
                "one device alone, e.g. to infer shapes, must run outside autograd.record() "
                "or on every device)" % (self._name, device, n + 1, ", ".join(behind), lagging))
        self._calls[device] = n + 1
        return n

    def _refusal(self, rnd: _Round, device: str, host) -> str:
        if device in rnd.parts:
            return "%s sent its part twice" % device
        first = next(iter(rnd.parts.values()), None)
        if first is not None and first.shape != host.shape:
            return "%s sent %d values, another device %d" % (device, host.size, first.size)
        return ""

    def _abandon(self, round_id: Hashable) -> None:
        """End an open round with NaN, so that nothing waits for it forever."""
        rnd = self._rounds.pop(round_id)
        _native.release_write(rnd.ticket, mx.nd.full(rnd.result.shape, float("nan"),
                                                     ctx=mx.cpu(), dtype="float64"))

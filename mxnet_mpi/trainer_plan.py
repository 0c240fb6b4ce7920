"""The Trainer's per-step gradient allreduce, built once and pushed with one
native call per step while the gradient arrays stay the same.

Small gradients of one layer (parameters of one block, e.g. a BatchNorm's
gamma and beta, or a small Dense's weight and bias: the same backward op makes
them ready together) travel as one grouped collective: fewer engine ops and
fewer agreements, and nothing waits for another layer. The layout is decided
by names, shapes and push order alone, so it is the same on every rank.

A step that passes its batch size (``Trainer.step``) pushes a second variant
of the plan that also sums the ranks' batch sizes (batch_sizes.py): as one
more part of the first collective of the last layer (ready first) when that
collective can carry it exactly and cheaply, else as a collective of its own
pushed first; either way in the step's one native call. Python waits for the
sum (Trainer._update) before it pushes the optimizer's ops.
"""

from __future__ import annotations

import mxnet as mx
import numpy as np

from . import _native, modes, staging
from ._native import CallDesc
from .batch_sizes import NAME, SIZE, BatchSizes
from .collectives import Call
from .errors import MPIKVStoreError

MAX_GROUP = 64


class TrainerPlan:
    """The cached allreduce of a store's Trainer gradients."""

    def __init__(self, store) -> None:
        self._store = store
        self._fingerprint = None
        self._array = None
        self._calls: list = []
        self._batch_array = None    # the variant that also sums the batch sizes
        self._batch_calls: list = []
        self.batch_sizes: BatchSizes | None = None

    def forget(self) -> None:
        """Settings changed (averaging, compression): build afresh next step."""
        self._fingerprint = None

    def push(self, params, batch_size=None, context: bytes | None = None,
             settings: str = "", flags: int = 0) -> bool:
        """Push the allreduce of `params`' gradients (and with `batch_size`, the
        sum of the ranks' batch sizes into self.batch_sizes, compared with the
        optimizer `settings` and the `flags`); False if they cannot use a plan
        (device arrays, sparse): the caller takes the general path.
        `context` names the call in messages."""
        live = [(i, params[i]) for i in reversed(range(len(params)))
                if params[i].grad_req != "null"]
        grads = [p._grad for _, p in live]
        if not all(g for g in grads):
            return False
        fingerprint = (self._store._keys.owner,) + tuple(id(a) for g in grads for a in g)
        rebuild = fingerprint != self._fingerprint
        if rebuild and any(a.stype != "default" or staging.needs_staging(a)
                           for g in grads for a in g):
            return False
        # Several devices on this rank: their sum is what the ranks reduce, in
        # the same plan as a rank with one device (the same collectives on
        # every rank, whatever its number of devices), copied back after.
        several = any(len(g) > 1 for g in grads)
        try:
            sums = [self._store._local_sum(i, g) for (i, _), g in zip(live, grads)] \
                if several else [g[0] for g in grads]
        except mx.base.MXNetError:
            # a device's gradient of another layout than the others' fails the
            # sum before any collective: the peers' plan would pair with this
            # rank's next step; take this one's places instead, and say which
            reason = self._device_mismatch(live, grads)
            if reason is None or not self._push_tokens(live, batch_size, reason, context):
                raise
            raise MPIKVStoreError(reason) from None
        if rebuild:
            try:
                self._build(live, sums, fingerprint)
            except MPIKVStoreError as exc:
                # this rank's gradient has another layout than the key's: the
                # peers run the plan their layouts make; take the same places
                # (tokens), so that they fail this step with the reason and
                # the next collective is paired (the general path's
                # collectives, one per key, differed from the plan's)
                if not self._push_tokens(live, batch_size, str(exc), context):
                    return False
                raise
        if batch_size is None:
            self._store.stream.push_raw(self._array, len(self._calls), context)
        else:
            self.batch_sizes.fill(batch_size, settings,
                                  context.decode(errors="replace") if context else "", flags)
            self._store.stream.push_raw(self._batch_array, len(self._batch_calls), context)
        if several:
            for total, g in zip(sums, grads):
                if len(g) > 1:
                    self._store._fan_out(total, g)
        return True

    def _build(self, live: list, sums: list, fingerprint: tuple) -> None:
        """The plan for `live` (index, parameter) with gradient (sums) `sums`;
        raises MPIKVStoreError where a gradient's layout is not its key's."""
        store = self._store
        arrays = [(i, g, store._checked(i, [g], None, "allreduce"))
                  for (i, _), g in zip(live, sums)]
        params_by_key = dict(live)
        groups = self._groups(arrays, params_by_key)
        calls = [self._call(group) for group in groups]
        self._calls = calls
        self._array = (CallDesc * len(calls))(*[c.desc for c in calls])
        self._build_batch_variant(groups, [_block(params_by_key[g[0][0]]) for g in groups])
        self._fingerprint = fingerprint

    @staticmethod
    def _groups(arrays: list, params_by_key: dict) -> list:
        """(key, gradient, KeyInfo) triples, grouped as the plan moves them:
        small ones of one block together, up to the fusion limit."""
        options = modes.stream_options()
        small, limit = options["small_bytes"], options["fusion_bytes"]
        groups, group = [], []

        def flush():
            if group:
                groups.append(list(group))
                group.clear()

        for i, g, info in arrays:
            fits = (info.nbytes <= small and group and group[0][2].dtype == info.dtype
                    and _block(params_by_key[group[0][0]]) == _block(params_by_key[i])
                    and sum(x[2].nbytes for x in group) + info.nbytes <= limit
                    and len(group) < MAX_GROUP)
            if not fits:
                flush()
            group.append((i, g, info))
            if info.nbytes > small:
                flush()
        flush()
        return groups

    def _device_mismatch(self, live: list, grads: list) -> str | None:
        """Which parameter has a device gradient of another shape or dtype than
        its key's (or its first device's), as a message; None if none has."""
        keys = self._store._keys
        for (i, _), g in zip(live, grads):
            info = keys.get(i)
            shape, dtype = (info.shape, info.dtype) if info is not None else (
                tuple(g[0].shape), np.dtype(g[0].dtype))
            for a in g:
                if tuple(a.shape) != shape or np.dtype(a.dtype) != dtype:
                    return ("%s: the gradient on %s has shape %s and dtype %s, where the "
                            "parameter's is %s and %s" % (keys.what(i), a.context,
                                                          tuple(a.shape), np.dtype(a.dtype),
                                                          shape, dtype))
        return None

    def _push_tokens(self, live: list, batch_size, reason: str, context) -> bool:
        """Push, as tokens carrying `reason`, the collectives the plan makes from
        the keys' known layouts (the peers' plan); False where a key has none."""
        store = self._store
        infos = [store._keys.get(i) for i, _ in live]
        if any(info is None for info in infos):
            return False
        params_by_key = dict(live)
        groups = self._groups([(i, None, info) for (i, _), info in zip(live, infos)],
                              params_by_key)
        calls = [self._call(group, token=reason) for group in groups]
        if batch_size is not None:
            rider = self._rider(groups, [_block(params_by_key[g[0][0]]) for g in groups])
            if rider is None:   # the float64 collective of their own (_build_batch_variant)
                calls.insert(0, BatchSizes(np.float64).call(token=reason))
            else:
                calls[rider] = self._call(groups[rider], with_batch_sizes=True, token=reason)
        store.stream.push(calls, context)
        return True

    def _rider(self, groups: list, blocks: list) -> int | None:
        """Which collective carries the batch sizes: the first of the last
        layer's block that sums float32/float64 exactly (no averaging, no
        fp16) and is small or grouped already (one more part makes a lone
        large array go through the fusion buffer: a copy each way); else None
        (a float64 collective of their own, pushed first)."""
        small = modes.stream_options()["small_bytes"]
        for k, group in enumerate(groups):
            if blocks[k] != blocks[0]:
                break
            dtype, nbytes = group[0][2].dtype, sum(x[2].nbytes for x in group)
            if dtype in (np.float32, np.float64) and self._store._flags(dtype) == 0 \
                    and (len(group) > 1 or nbytes <= small):
                return k
        return None

    def _build_batch_variant(self, groups: list, blocks: list) -> None:
        """The plan plus the batch sizes, carried as _rider says."""
        rider = self._rider(groups, blocks)
        dtype = groups[rider][0][2].dtype if rider is not None else np.float64
        if self.batch_sizes is None or self.batch_sizes.dtype != dtype:
            self.batch_sizes = BatchSizes(dtype)
        if rider is None:
            calls = [self.batch_sizes.call()] + self._calls
        else:
            calls = list(self._calls)
            calls[rider] = self._call(groups[rider], with_batch_sizes=True)
        self._batch_calls = calls
        self._batch_array = (CallDesc * len(calls))(*[c.desc for c in calls])

    def _call(self, group: list, with_batch_sizes: bool = False,
              token: str | None = None) -> Call:
        """One (grouped) allreduce; with the batch sizes riding as its last part;
        with `token`, this rank's place in it only (why it cannot take part)."""
        store = self._store
        dtype = group[0][2].dtype
        flags = store._flags(dtype)
        keys = tuple(i for i, _, _ in group)
        grads = [g for _, g, _ in group] if token is None else []
        shapes = [info.shape for _, _, info in group]
        name = store._keys.names(keys)
        if len(group) == 1:
            desc, label = group[0][2].desc("allreduce"), "key %r" % (keys[0],)
        else:
            desc = "allreduce keys=%s shapes=%s %s%s" % (keys, tuple(shapes), np.dtype(dtype),
                                                         store._keys.owner)
            label = "keys %s" % (keys,)
        if with_batch_sizes:
            shapes = shapes + [(SIZE,)]
            if token is None:
                grads = grads + [self.batch_sizes.array]
            desc += " and " + NAME
            name = (name + " and " if name else "") + NAME
        return Call(_native.ALLREDUCE, grads, grads, dtype=dtype, shapes=shapes, desc=desc,
                    label=label, priority=-keys[0], flags=flags, name=name, token=token)



def _block(param) -> str:
    """The block a Gluon parameter belongs to ('dense0' of 'net_dense0_weight')."""
    return param.name.rsplit("_", 1)[0]

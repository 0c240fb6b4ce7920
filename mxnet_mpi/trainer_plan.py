"""The Trainer's per-step gradient allreduce, built once and pushed with one
native call per step while the gradient arrays stay the same.

Small gradients of one layer (parameters of one block, e.g. a BatchNorm's
gamma and beta, or a small Dense's weight and bias: the same backward op makes
them ready together) travel as one grouped collective: fewer engine ops and
fewer agreements, and nothing waits for another layer. The layout is decided
by names, shapes and push order alone, so it is the same on every rank.
"""

from __future__ import annotations

import numpy as np

from . import _native, modes, staging
from ._native import CallDesc
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

    def forget(self) -> None:
        """Settings changed (averaging, compression): build afresh next step."""
        self._fingerprint = None

    def push(self, params) -> bool:
        """Push the allreduce of `params`' gradients; False if they cannot use a
        plan (several devices, device arrays, sparse): the caller takes the
        general path."""
        live = [(i, params[i]) for i in reversed(range(len(params)))
                if params[i].grad_req != "null"]
        grads = [p._grad for _, p in live]
        if not all(g is not None and len(g) == 1 for g in grads):
            return False
        fingerprint = tuple(id(g[0]) for g in grads)
        if fingerprint != self._fingerprint and not self._build(live, fingerprint):
            return False
        self._store._stream.push_raw(self._array, len(self._calls))
        return True

    def _build(self, live: list, fingerprint: tuple) -> bool:
        store = self._store
        arrays = []
        for i, p in live:
            g = p._grad[0]
            if g.stype != "default" or staging.needs_staging(g):
                return False
            try:
                info = store._checked(i, [g], None, "allreduce")
            except MPIKVStoreError:
                return False  # the general path raises it, leaving a token
            arrays.append((i, g, info))
        params_by_key = dict(live)
        options = modes.stream_options()
        small, limit = options["small_bytes"], options["fusion_bytes"]
        calls, group = [], []

        def flush():
            if group:
                calls.append(self._call(group))
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
        self._calls = calls
        self._array = (CallDesc * len(calls))(*[c.desc for c in calls])
        self._fingerprint = fingerprint
        return True

    def _call(self, group: list) -> Call:
        store = self._store
        dtype = group[0][2].dtype
        flags = store._flags(dtype)
        if len(group) == 1:
            i, g, info = group[0]
            return Call(_native.ALLREDUCE, [g], [g], dtype=dtype, shapes=[info.shape],
                        desc=info.desc("allreduce"), label="key %r" % (i,), priority=-i,
                        flags=flags)
        keys = tuple(i for i, _, _ in group)
        shapes = [info.shape for _, _, info in group]
        desc = "allreduce keys=%s shapes=%s %s" % (keys, tuple(shapes), np.dtype(dtype))
        return Call(_native.ALLREDUCE, [g for _, g, _ in group], [g for _, g, _ in group],
                    dtype=dtype, shapes=shapes, desc=desc, label="keys %s" % (keys,),
                    priority=-keys[0], flags=flags)



def _block(param) -> str:
    """The block a Gluon parameter belongs to ('dense0' of 'net_dense0_weight')."""
    return param.name.rsplit("_", 1)[0]

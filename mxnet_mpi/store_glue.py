"""What a Gluon Trainer and a Module need from a store beyond KVStoreBase's
calls: initial weights from rank 0 (deferred ones at the first forward), the
gradient reduction of a step in readiness order, the batch-size agreement,
the comparison of the ranks' optimizer settings, and the parameter names and
call context printed in messages.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import numpy as np

from . import _native
from .batch_sizes import BatchSizes
from .collectives import RankTable, rank_table
from .deferred import settle_deferred
from .keys import Key
from .optimizer_fixes import share_noise

#: At most one comparison of the ranks' optimizer settings per this many
#: collectives of the store (settings_check).
SETTINGS_COLLECTIVES = 64


def on_deferred_init(param, fn) -> None:
    """Call fn(arrays) once the deferred-init Gluon `param` gets its arrays
    (during the first forward, before any op reads them)."""
    init_impl = param._init_impl

    def hooked(data, ctx_list):
        init_impl(data, ctx_list)
        del param._init_impl  # back to the class method
        fn(param._check_and_get(param._data, list))

    param._init_impl = hooked


class FrameworkGlue:
    """The Trainer and Module side of MPIKVStore (a part of it: it uses the
    store's calls, plan and stream)."""

    @contextlib.contextmanager
    def serving(self, what: str | None):
        """Collectives pushed inside the block say what they are for (`what`,
        e.g. "Module.update 3: gradient allreduce"): their mismatch, token and
        stall messages print it."""
        before = self._context
        self._context = what.encode() if what else None
        try:
            yield
        finally:
            self._context = before

    @contextlib.contextmanager
    def owned_by(self, owner: str):
        """The keys' collectives pushed inside the block serve `owner` (""
        for the store's first Trainer or Module, else its ordinal:
        joining.attach), which the ranks compare with the rest of each
        collective's description."""
        before = self._keys.owner
        self._keys.owner = owner
        try:
            yield
        finally:
            self._keys.owner = before

    def share_noise(self, optimizer) -> None:
        """optimizer_fixes.share_noise over every worker of the store, where it
        has several."""
        if self.num_workers > 1:
            share_noise(optimizer, self.rank == 0, lambda arr: self.internal_collective(
                _native.ALLREDUCE, arr, "SGLD's noise seed", workers=True))

    def name_keys(self, names: dict) -> None:
        """Key -> parameter name, printed in messages about the key's collectives."""
        for key, name in names.items():
            self._keys.set_name(key, name)

    def batch_agreement(self, batch_size, what: str | None = None,
                        settings: str = "", flags: int = 0) -> BatchSizes:
        """Push the allreduce of this rank's `batch_size` over every worker of
        the store (collective); read the result with .mean() or .total()
        (docs/store.md, "Batch sizes"), which raise if the ranks' optimizer
        `settings` (optimizer_settings.describe) differ; the sum's
        stale_ranks and written_ranks count the ranks that passed
        each of `flags` (batch_sizes.STALE, WRITTEN)."""
        return self._batch_buffer().push(self._workers_stream(), batch_size,
                                         what.encode() if what else self._context, settings,
                                         flags)

    def batch_token(self, reason: str, what: str | None = None) -> None:
        """This rank's place in the batch_agreement its peers push, as a token
        carrying `reason` (it cannot take part: its step failed before)."""
        self._workers_stream().push([self._batch_buffer().call(token=reason)],
                                    what.encode() if what else self._context)

    def _batch_buffer(self) -> BatchSizes:
        """The store's batch sizes' array (made at the first use)."""
        self._usable()
        if self._batch_sizes is None:
            self._batch_sizes = BatchSizes()
        return self._batch_sizes

    def settings_check(self, settings: Callable[[], str], written=None,
                       after_writes=None) -> None:
        """Compare the ranks' optimizer settings, `settings()` (collective; for
        updates that sum no batch sizes: Module's), at the first call and then
        at the first call after each SETTINGS_COLLECTIVES collectives of the
        store, without waiting for the result: each comparison is read at the
        next one, and raises then on every rank if they differed. The count of
        collectives is the same on every rank at a call (and after join()),
        where counts of calls are not: a rank that joined early skipped some.
        Waiting at once would keep a Python-bound loop from running ahead, and
        a comparison at every call costs such a loop a collective per step (a
        small Module MLP, 2 gradients, on 2 ranks, whose loop never read a
        result: 1.8 ms per step; 3.8 ms waiting at once, 2.6 ms reading later;
        with this rule 2.0-2.3 ms against 1.9-2.0 ms without, and reading its
        metric every batch, as Module.fit does, 2.1-2.5 against 2.3-2.9 ms:
        within this machine's noise). `written` and `after_writes`: see
        batch_sizes.SettingsComparison.tick."""
        self._usable()
        stream = self._workers_stream()
        self._settings.tick(stream.info()[0], stream, self._context, settings, written,
                            after_writes)

    def settings_settle(self, settings: Callable[[], str], written=None,
                        after_writes=None) -> None:
        """settings_check's comparison now, waited for (collective, where every
        rank is alike: the end of Module.fit's epoch, after its join)."""
        self._usable()
        self._settings.settle(self._workers_stream(), self._context, settings, written,
                              after_writes)

    def rank_table(self, row: np.ndarray, desc: str) -> RankTable:
        """[workers x len(row)] table of every worker's int64 `row` (collective
        over every worker of the store; `desc` is what they agree on)."""
        self._usable()
        return rank_table(self._workers_stream(), row, desc, self._context)

    def _workers_stream(self):
        """The stream over every worker (num_workers) of the store."""
        return self._stream

    def settle_deferred(self, params: Sequence) -> None:
        """settle_deferred over every worker of the store (collective)."""
        settle_deferred(params, lambda row, desc: self.rank_table(row, "Trainer init: " + desc))

    def sync_initial_params(self, params: Sequence) -> None:
        """Broadcast initial values of Gluon `params` from rank 0 now, and of
        deferred-init ones as soon as their shapes are known (first forward),
        so every rank computes its first gradient on the same weights."""
        self.name_keys({idx: p.name for idx, p in enumerate(params)})
        self.settle_deferred(params)
        keys, values, outs = [], [], []
        for idx, param in enumerate(params):
            if param._deferred_init:
                on_deferred_init(param, lambda arrays, idx=idx: self._broadcast_deferred(
                    idx, arrays))
            else:
                arrays = param._check_and_get(param._data, list)
                keys.append(idx)
                values.append(arrays[0])
                outs.append(arrays)
        if keys:
            with self.serving("Trainer init: broadcast of initial weights"):
                self.broadcast(keys, values, out=outs)

    def _broadcast_deferred(self, key: Key, arrays: list) -> None:
        with self.serving("first forward before Trainer.step %d: broadcast of deferred-init "
                          "weights" % (self._reductions + 1)):
            self.broadcast(key, arrays[0], out=arrays)

    def allreduce_params(self, params: Sequence, update_on_kvstore: bool, batch_size=None,
                         what: str | None = None, settings: str = "",
                         flags: int = 0, skip=frozenset(), owner: str = "") -> BatchSizes | None:
        """Trainer's gradient reduction, issued last parameter first: backprop
        makes gradients ready from the output layer back, so collectives follow
        readiness instead of waiting for the input layer. Built once, then one
        native call per step while the gradient arrays stay the same.

        With `batch_size`, the batch sizes are summed too (on the first
        collective that can carry them, or one of their own pushed first):
        returns them, for the rule's mean, with the ranks' optimizer `settings`
        compared. `what` names the call in messages. `skip`: indices left out
        where the servers update (update_on_kvstore; the hybrid stores).
        `owner`: which of the store's Trainers this is (owned_by)."""
        with self.owned_by(owner):
            return self._allreduce_params(params, update_on_kvstore, batch_size, what,
                                          settings, flags)

    def _allreduce_params(self, params: Sequence, update_on_kvstore: bool, batch_size,
                          what: str | None, settings: str, flags: int) -> BatchSizes | None:
        self._usable()
        self._reductions += 1
        context = what.encode() if what else None
        if self._updater is None and not update_on_kvstore \
                and self._plan.push(params, batch_size, context, settings, flags):
            return self._plan.batch_sizes if batch_size is not None else None
        agreed = (self.batch_agreement(batch_size, what, settings, flags)
                  if batch_size is not None else None)
        groups = []
        for i in reversed(range(len(params))):
            param = params[i]
            if param.grad_req == "null":
                continue
            out = param.list_data() if update_on_kvstore else None
            groups.append((i, param.list_grad(), out))
        with self.serving(what):
            if self._updater is not None:
                for k, grads, out in groups:
                    self.pushpull(k, grads, out=out, priority=-k)
            else:
                self._reduce(groups, lambda k: -k)
        return agreed

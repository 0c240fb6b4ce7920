"""A Module's optimizer states in a form that does not depend on its devices.

MXNet's Module numbers the states of parameter i on device k as
i * devices + k (and so do its optimizer's update counts and index-to-name
map). Ranks may run a Module on different numbers of devices, so copying one
rank's states to another by number (join() at the end of an uneven epoch)
gave a parameter another parameter's state: a crash in the next update, or
a wrong state. ModuleStates is the updater that join() sees: parameter i's
states (those of device 0: every device applies the same reduced gradient
to the same weights), spread over this rank's own devices when set. The
optimizer's update counts (Adam's step number) are kept per device id; they
are spread over this rank's devices the same way (counts_by_index,
set_counts: a Gluon Trainer's join needs that too).
"""

from __future__ import annotations

import copy
import pickle

import mxnet as mx


def counts_by_index(optimizer, index_of=lambda idx: idx) -> dict:
    """The optimizer's update count of each parameter, keyed by
    `index_of(MXNet's index)`. MXNet keeps one count table per device id
    (``_all_index_update_counts``); every device counts alike, so the largest
    over the tables is the count (a table a device never used has none)."""
    out: dict = {}
    for table in optimizer._all_index_update_counts.values():
        for index, count in table.items():
            key = index_of(index)
            out[key] = max(out.get(key, 0), count)
    return out


def set_counts(optimizer, device_ids: list, table_of) -> None:
    """Give each device id of `device_ids` (in order) the count table
    `table_of(k)` for its position k."""
    optimizer._all_index_update_counts = {d: table_of(k) for k, d in enumerate(device_ids)}
    optimizer._index_update_count = optimizer._all_index_update_counts[device_ids[0]]


def spread_counts(optimizer, contexts: list) -> None:
    """Every device of `contexts` counts each parameter's updates as the
    optimizer's tables do (a Trainer's numbering: the same index on every
    device), after states from another rank or a file replaced them."""
    counts = counts_by_index(optimizer)
    set_counts(optimizer, [c.device_id for c in contexts], lambda _k: dict(counts))


def _copied(state):
    if isinstance(state, mx.nd.NDArray):
        return state.copy()
    if isinstance(state, (tuple, list)):
        return type(state)(_copied(s) for s in state)
    return state


class ModuleStates:
    """get_states/set_states of `module`'s updater, by parameter."""

    def __init__(self, module) -> None:
        self._module = module
        self._updater = module._updater
        self._ndev = len(module._context)

    @property
    def optimizer(self):
        return self._updater.optimizer

    @optimizer.setter
    def optimizer(self, opt) -> None:
        self._updater.optimizer = opt
        self._module._optimizer = opt

    def get_states(self, dump_optimizer: bool = False) -> bytes:
        n = self._ndev
        states = {i // n: s for i, s in self._updater.states.items() if i % n == 0}
        if not dump_optimizer:
            return pickle.dumps(states)
        opt = copy.copy(self._updater.optimizer)   # its dicts replaced, not changed
        set_counts(opt, [0], lambda _k: counts_by_index(self._updater.optimizer,
                                                       lambda i: i // n))
        return pickle.dumps((states, opt))

    def set_states(self, blob: bytes) -> None:
        loaded = pickle.loads(blob)
        states, opt = loaded if isinstance(loaded, tuple) else (loaded, None)
        n = self._ndev
        self._updater.states = {i * n + k: s if k == 0 else _copied(s)
                                for i, s in states.items() for k in range(n)}
        self._updater.states_synced = dict.fromkeys(self._updater.states, False)
        if opt is not None:
            counts = counts_by_index(opt)
            set_counts(opt, [c.device_id for c in self._module._context],
                       lambda k: {i * n + k: c for i, c in counts.items()})
            opt.idx2name = dict(self._updater.optimizer.idx2name)   # this rank's numbering
            self.optimizer = opt

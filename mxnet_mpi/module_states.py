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

    def counts(self) -> dict:
        """The optimizer's update counts, by parameter."""
        n = self._ndev
        return counts_by_index(self._updater.optimizer, lambda i: i // n)

    def take_counts(self, counts: dict) -> None:
        """Counts by parameter into the optimizer's tables of this rank's devices."""
        n = self._ndev
        set_counts(self._updater.optimizer, [c.device_id for c in self._module._context],
                   lambda k: {i * n + k: c for i, c in counts.items()})

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


# In a Module states file written on our stores: its states are keyed by
# parameter (device 0's), whatever the devices of the rank that wrote it.
# MXNet's updater ignores a key it never updates, so plain MXNet on one
# device loads such a file as its own.
BY_PARAMETER = "mxnet_mpi: states by parameter"


def file_blob(module) -> bytes:
    """What Module.save_optimizer_states writes: the updater's states by
    parameter, marked so (a file that a rank on any number of devices loads)."""
    states = pickle.loads(ModuleStates(module).get_states())
    states[BY_PARAMETER] = True
    return pickle.dumps(states)


def load_file_blob(module, blob: bytes) -> None:
    """Module.load_optimizer_states' half: a file by parameter (file_blob) is
    spread over this module's devices; one of MXNet's, numbered parameter x
    devices + device, is renumbered when its numbering shows another number of
    devices than this module's (its states went to other parameters: wrong
    updates, or a crash), else loaded as MXNet loads it."""
    loaded = pickle.loads(blob)
    states = loaded[0] if isinstance(loaded, tuple) else loaded
    if isinstance(states, dict) and states.pop(BY_PARAMETER, False):
        ModuleStates(module).set_states(pickle.dumps(loaded))
        return
    here = len(module._context)
    saved = _devices_of(states, [a[0].shape for a in module._exec_group.param_arrays], here)
    if saved == here:
        module._updater.set_states(blob)
        return
    by_param = {i // saved: s for i, s in states.items() if i % saved == 0}
    ModuleStates(module).set_states(pickle.dumps(
        (by_param, loaded[1]) if isinstance(loaded, tuple) else by_param))


def _devices_of(states, shapes: list, here: int) -> int:
    """The number of devices that numbered `states` (keys parameter x devices
    + device, every device of a parameter present, each state shaped as its
    parameter, of `shapes`): `here` where that fits."""
    if not isinstance(states, dict) or not states or \
            not all(isinstance(k, int) and k >= 0 for k in states):
        return here
    keys = set(states)

    def fits(d: int) -> bool:
        return all(k // d < len(shapes) and all(k - k % d + j in keys for j in range(d))
                   and _shape_of(states[k]) in (None, tuple(shapes[k // d])) for k in keys)
    if fits(here):
        return here
    return next((d for d in range(1, max(keys) + 2) if fits(d)), here)


def _shape_of(state):
    """The shape of a state's first array (momentum, Adam's mean), or None."""
    if isinstance(state, mx.nd.NDArray):
        return tuple(state.shape)
    if isinstance(state, (tuple, list)):
        for s in state:
            shape = _shape_of(s)
            if shape is not None:
                return shape
    return None

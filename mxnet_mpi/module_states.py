"""A Module's optimizer states in a form that does not depend on its devices.

MXNet's Module numbers the states of parameter i on device k as
i * devices + k (and so do its optimizer's update counts and index-to-name
map). Ranks may run a Module on different numbers of devices, so copying one
rank's states to another by number (join() at the end of an uneven epoch)
gave a parameter another parameter's state: a crash in the next update, or
a wrong state. ModuleStates is the updater that join() sees: parameter i's
states (those of device 0: every device applies the same reduced gradient
to the same weights), spread over this rank's own devices when set.
"""

from __future__ import annotations

import copy
import pickle

import mxnet as mx


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
        opt._index_update_count = {i // n: c for i, c in opt._index_update_count.items()
                                   if i % n == 0}
        opt._all_index_update_counts = {0: opt._index_update_count}
        return pickle.dumps((states, opt))

    def set_states(self, blob: bytes) -> None:
        loaded = pickle.loads(blob)
        states, opt = loaded if isinstance(loaded, tuple) else (loaded, None)
        n = self._ndev
        self._updater.states = {i * n + k: s if k == 0 else _copied(s)
                                for i, s in states.items() for k in range(n)}
        self._updater.states_synced = dict.fromkeys(self._updater.states, False)
        if opt is not None:
            counts = {i * n + k: c for i, c in opt._index_update_count.items()
                      for k in range(n)}
            opt._index_update_count = counts
            opt._all_index_update_counts = {0: counts}
            opt.idx2name = dict(self._updater.optimizer.idx2name)   # this rank's numbering
            self.optimizer = opt

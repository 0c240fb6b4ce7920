"""Keys as the parameter servers see them (the hybrid stores).

MXNet's ps-lite client takes int keys or str keys, never both in one process
("Mixed key types are not allowed"), and numbers str keys 0, 1, 2, ... in the
order they are first initialised; the servers' optimizer sees those numbers as
its indices. Our stores take both types (a Gluon Trainer uses ints, the Module
API and many scripts use str names), so the hybrid stores hand ps-lite ints
only:

- keys of the type used first keep MXNet's own numbers (an int key is itself,
  a str key its initialisation order), so a job that uses one type gives the
  servers exactly the indices MXNet's ``dist_sync`` would;
- keys of the other type are numbered the same way from ``OTHER_BASE``; an
  optimizer sent to the servers afterwards has its index -> name table
  (``idx2name``, which a Module fills in the order of its str keys, MXNet's
  own numbering) moved with them. A Trainer's ``param_dict`` never reaches
  MXNet's servers (Optimizer does not pickle it), so the servers ignored Gluon's
  ``lr_mult``/``wd_mult`` (as MXNet's own dist stores do): they go along in the
  optimizer's per-index multipliers, at the servers' numbers.

Like MXNet's, str numbers assume that every group initialises its str keys in
the same order (every rank runs the same program).
"""

from __future__ import annotations

import copy

from .errors import MPIKVStoreError

# ps-lite's client places a small key on server (key * 9973) % servers in C int
# arithmetic: keys must stay below INT_MAX / 9973.
KEY_LIMIT = (2 ** 31 - 1) // 9973 + 1
OTHER_BASE = 1 << 17


class ServerKeys:
    """The int each store key has on the parameter servers."""

    def __init__(self, store_type: str) -> None:
        self._type = store_type
        self._first: type | None = None     # int or str: the type used first
        self._str_index: dict = {}          # str key -> its initialisation order

    def _base(self, kind: type) -> int:
        return 0 if self._first in (None, kind) else OTHER_BASE

    def register(self, key) -> None:
        """Note `key` as initialised on the servers (in initialisation order)."""
        if self._first is None:
            self._first = type(key)
        if isinstance(key, str) and key not in self._str_index:
            self._str_index[key] = len(self._str_index)
        self.of(key)   # in range

    def of(self, key) -> int:
        """The servers' int for a registered `key`."""
        if isinstance(key, str):
            index = self._base(str) + self._str_index[key]
        else:
            index = self._base(int) + key
        if not 0 <= index < KEY_LIMIT or (isinstance(key, int) and key >= OTHER_BASE):
            raise MPIKVStoreError(
                "key %r is out of range for the parameter servers of kvstore '%s': int keys "
                "must be in [0, %d) and a job can use at most %d str keys"
                % (key, self._type, OTHER_BASE, KEY_LIMIT - OTHER_BASE))
        return index

    def optimizer(self, optimizer):
        """`optimizer` with its per-index settings at the servers' numbers and a
        Trainer's multipliers by index (the same object when there is neither)."""
        str_base = self._base(str)
        params = getattr(optimizer, "param_dict", None) or {}
        renumber = bool(str_base and optimizer.idx2name)
        if not renumber and not params:
            return optimizer
        moved = copy.copy(optimizer)
        if renumber:
            moved.idx2name = {k + str_base: v for k, v in optimizer.idx2name.items()}
        if params:
            moved.lr_mult, moved.wd_mult = dict(optimizer.lr_mult), dict(optimizer.wd_mult)
            for index, param in params.items():
                moved.lr_mult[self.of(index)] = param.lr_mult
                moved.wd_mult[self.of(index)] = param.wd_mult
        return moved

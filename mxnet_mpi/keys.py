"""How a store reads the (key, value, out) arguments of its calls, and what it
knows about its keys: the layout each was first used with and its
descriptions (computed once), the parameter each serves (learnt from a
Trainer or a Module, for messages), and how a failed call still takes its
place in the sequence (as a token)."""

from __future__ import annotations

from typing import Any

import mxnet as mx
import numpy as np

from .collectives import DTYPE_CODES, Call, token_call
from .errors import MPIKVStoreError

Key = Any  # int or str


def check_key(key) -> None:
    """Raise MPIKVStoreError unless `key` is an int or a str."""
    if not isinstance(key, (int, str)) or isinstance(key, bool):
        raise MPIKVStoreError("kvstore keys must be int or str, got %r of type %s"
                              % (key, type(key).__name__))


def as_list(x) -> list:
    """`x` as a list (a list or tuple as is, anything else as its one item)."""
    return list(x) if isinstance(x, (list, tuple)) else [x]


def key_groups(key, value, out) -> list:
    """Normalise (key, value, out) into [(key, [values], [outs] or None)]."""
    if isinstance(key, (list, tuple)):
        values = as_list(value)
        outs = as_list(out) if out is not None else [None] * len(key)
        if len(values) != len(key) or len(outs) != len(key):
            raise MPIKVStoreError("got %d keys but %d values and %d outs"
                                  % (len(key), len(values), len(outs)))
        return [(k, as_list(v), None if o is None else as_list(o))
                for k, v, o in zip(key, values, outs)]
    return [(key, as_list(value), None if out is None else as_list(out))]


def broadcast_groups(key, value, out) -> list:
    """key_groups() for broadcast: every key needs `out` and exactly one value."""
    groups = key_groups(key, value, out)
    for k, values, outs in groups:
        if outs is None:
            raise MPIKVStoreError("broadcast needs `out` for key %r" % (k,))
        if len(values) != 1:
            raise MPIKVStoreError("broadcast takes one value per key, got %d for key %r"
                                  % (len(values), k))
    return groups


def check_optimizer(optimizer) -> None:
    """Raise MPIKVStoreError unless `optimizer` is an mx.optimizer.Optimizer."""
    if not isinstance(optimizer, mx.optimizer.Optimizer):
        raise MPIKVStoreError("set_optimizer expects an mx.optimizer.Optimizer, got %s"
                              % type(optimizer).__name__)


class KeyInfo:
    """The layout of a key (from its first use) and its descriptions."""

    __slots__ = ("key", "shape", "dtype", "_descs", "_book", "first_user")

    def __init__(self, key: Key, shape: tuple, dtype, book: KeyBook | None = None) -> None:
        self.key = key
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self._descs: dict = {}
        self._book = book
        # (owner, parameter name or None) of the first use: a later use by
        # another parameter is named beside it when the layouts differ
        self.first_user = (book.owner, book._name_of(key)) if book is not None else None

    def desc(self, verb: str) -> str:
        """What ranks agree on for `verb` of this key (key, shape, dtype, and
        the user of the store it serves now: KeyBook.owner)."""
        owner = self._book.owner if self._book is not None else ""
        text = self._descs.get((verb, owner))
        if text is None:
            text = self._descs[verb, owner] = "%s key=%r shape=%s %s%s" % (
                verb, self.key, self.shape, self.dtype, owner)
        return text

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


class KeyBook:
    """Layouts of a store's keys. A key keeps the shape and dtype of its first use.

    Parameter names are printed, never part of what ranks agree on: Gluon's
    global name counters can name the same parameter differently on two ranks."""

    def __init__(self) -> None:
        self._keys: dict = {}
        self._names: dict = {}   # (owner, key) -> parameter name
        # Which of the store's Trainers or Modules the calls now serve ("" for
        # the first; store_glue.owned_by): part of what the ranks agree on, so
        # ranks that step two Trainers sharing one store in different orders
        # (the same keys and shapes) fail instead of summing one's gradients
        # into the other's.
        self.owner = ""
        # how the users of one store object get keys of their own (hybrid
        # stores: none, as ps-lite allows one store per process)
        self.own_keys = "give each its own store (kvstore='mpi' as a string), or use "

    def get(self, key: Key) -> KeyInfo | None:
        return self._keys.get(key)

    def set_name(self, key: Key, name: str) -> None:
        """`key` serves the parameter `name` (a Trainer's or a Module's: the
        store's user that owner names)."""
        self._names[self.owner, key] = name

    def _name_of(self, key: Key) -> str | None:
        return self._names.get((self.owner, key)) if _hashable(key) else None

    def name(self, key: Key) -> str:
        """"parameter 'dense0_weight'" for a key that serves one, else ""."""
        name = self._name_of(key)
        return "" if name is None else "parameter %r" % (name,)

    def names(self, keys) -> str:
        """name() of several keys, as one phrase ("" if none is known)."""
        known = [n for n in map(self._name_of, keys) if n is not None]
        if len(known) <= 1:
            return "parameter %r" % (known[0],) if known else ""
        return "parameters " + ", ".join("%r" % (n,) for n in known)

    def what(self, key: Key) -> str:
        """The key as this rank's own errors name it: "key 1 (parameter
        'dense0_weight')", "key 1", or "parameter 'fc1_weight'" when the key is
        the name (Module)."""
        name = self._name_of(key)
        if name is None:
            return "key %r" % (key,)
        return "parameter %r" % (name,) if name == key else "key %r (parameter %r)" % (key, name)

    def forget(self, key: Key) -> None:
        """`key` takes the layout of its next use (its parameter was cast)."""
        self._keys.pop(key, None)

    def layout(self, key: Key, arr) -> KeyInfo:
        """The key's layout; records `arr`'s at first use, else checks it matches."""
        shape, dtype = tuple(arr.shape), np.dtype(arr.dtype)
        info = self._keys.get(key)
        if info is None:
            info = self._keys[key] = KeyInfo(key, shape, dtype, self)
        elif info.shape != shape or info.dtype != dtype:
            first, why = self._other_user(info)
            raise MPIKVStoreError("%s%s was first used with shape %s and dtype %s%s, now %s "
                                  "and %s%s" % (self.what(key), self.owner if first else "",
                                                info.shape, info.dtype, first, shape, dtype,
                                                why))
        return info

    def _other_user(self, info: KeyInfo) -> tuple[str, str]:
        """Where another parameter, or the store's own calls, first used the
        key: who, and why the key is shared ("", "" if the same user)."""
        if info.first_user is None or info.first_user == (self.owner, self._name_of(info.key)):
            return "", ""
        owner, name = info.first_user
        if name is None:
            return " by the store's own calls (kv.init, push, pushpull)", (
                ": a store's keys keep their first shape and dtype, and a Trainer takes the "
                "keys 0, 1, ... (its parameters' positions): give the store's own calls other "
                "keys (strings, or numbers past the Trainer's parameters)")
        first = " by parameter %r%s" % (name, owner)
        return first, (": a store's keys keep their first shape and dtype, and the Trainers "
                       "and Modules that share one store object use the same keys (a "
                       "parameter's position in each): %sone Trainer over all the "
                       "parameters" % self.own_keys)

    def token(self, op: int, verb: str, key: Key, value, reason: str) -> Call:
        """The token a failed call on `key` leaves in the sequence, described as
        its peers describe the real collective (the key's known layout)."""
        info = self._keys.get(key) if _hashable(key) else None
        if info is not None:
            shape, dtype, desc = info.shape, info.dtype, info.desc(verb)
        elif isinstance(value, mx.nd.NDArray) and np.dtype(value.dtype) in DTYPE_CODES:
            shape, dtype = tuple(value.shape), np.dtype(value.dtype)
            desc = "%s key=%r shape=%s %s%s" % (verb, key, shape, dtype, self.owner)
        else:
            shape, dtype, desc = (), np.dtype(np.float32), "%s key=%r%s" % (verb, key,
                                                                           self.owner)
        return token_call(op, dtype, [shape], desc, "key %r" % (key,), reason, self.name(key))


def _hashable(key) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True

"""The hybrid stores' side of MXNet's parameter server (ps-lite): keys
initialised once on the servers, server calls whose failure reaches every rank
of the group (as the key's next group broadcast), health flights that name a
stalled server, scheduler or group, and closing every store at exit.
"""

from __future__ import annotations

import contextlib
import weakref

import mxnet as mx
import numpy as np

from . import _native
from .collectives import token_call
from .errors import MPIKVStoreError
from .world import on_exit as on_world_exit

open_stores: weakref.WeakSet = weakref.WeakSet()
_close_registered = False


def _close_all() -> None:
    for store in list(open_stores):
        store.close()


def close_at_exit() -> None:
    """Close stores at exit, after this rank announced its end and its
    collectives completed, before MPI is finalised."""
    global _close_registered
    if not _close_registered:
        _close_registered = True
        on_world_exit(_close_all)


@contextlib.contextmanager
def server_flight(arr, desc: str):
    """A health flight (stall warning, then abort) around the parameter-server
    work done in the block: its begin and end markers are engine ops on `arr`."""
    wait = _native.server_wait(arr, desc, True)
    yield
    _native.server_wait(arr, desc, False, wait)


class ServerClient:
    """The parameter-server calls of a HybridKVStore (a part of it: it uses the
    store's ps-lite client `_dist`, its group stream and its key book)."""

    def _require_init(self, key, verb: str) -> None:
        """A key the servers never saw would abort the server process (ps-lite's
        CHECK, not an error sent back): refuse it on every rank, before any
        collective (every rank initialises the same keys, so all refuse)."""
        if key not in self._server_keys:
            raise MPIKVStoreError("%s of key %r on kvstore '%s': the key was never initialised; "
                                  "call init() (or broadcast()) on it first"
                                  % (verb, key, self.type))

    def _server_call(self, key, verb: str, fn) -> None:
        """Run a server call of the owner; a failure is kept for the key's next
        group broadcast, which then fails on every rank of the group with it
        (the peers are waiting in that broadcast, not on the server)."""
        try:
            fn()
        except (mx.base.MXNetError, MPIKVStoreError) as exc:
            first = str(exc).strip().splitlines()
            self._ps_errors.setdefault(key, "parameter server %s of key %r failed on group %d's "
                                       "owner (world rank %d): %s"
                                       % (verb, key, self._group_id, self._world.rank,
                                          first[0] if first else type(exc).__name__))

    def _broadcast_or_fail(self, key, arr, priority: int, internal: str | None = None) -> None:
        """The owner's group broadcast of `key`, or, after a server failure on
        the owner, a token in its place: every rank of the group raises the
        same MPIKVStoreError."""
        reason = self._ps_errors.pop(key, None) if self._owns(key) else None
        if reason is None:
            if internal is None:
                self._group_broadcast(key, arr, priority)
            else:
                self.internal_collective(_native.BROADCAST, arr, internal, root=self.owner(key))
                self.stats["group_broadcast"] += 1
            return
        if internal is None:
            token = self._keys.token(_native.BROADCAST, "group broadcast", key, arr, reason)
        else:
            token = token_call(_native.BROADCAST, np.dtype(arr.dtype), [tuple(arr.shape)],
                               "%s shape=%s %s" % (internal, tuple(arr.shape),
                                                   np.dtype(arr.dtype)), internal, reason)
        self._usable()
        self._stream.push([token], self._context)
        raise MPIKVStoreError(reason)

    def _server_init(self, keys: list, values: list) -> None:
        """Initialise keys on the servers once: a second init of a key (another
        Trainer on this store) would reach a dist_sync server as a push (added
        to the weight) and kill a dist_async server without an updater. Every
        group runs the same program, so all groups skip the same keys."""
        fresh = [(k, v) for k, v in zip(keys, values) if k not in self._server_keys]
        for k, _ in fresh:
            self._ps_keys.register(k)
        self._server_keys.update(k for k, _ in fresh)
        if fresh and self._dist is not None:
            # One call: ps-lite's init ends with a barrier among its workers.
            self._dist.init([self._ps_keys.of(k) for k, _ in fresh], [v for _, v in fresh])

"""MPI KVStores registered with MXNet: ``mpi`` and ``mpi_<mode>``.

``pushpull`` **sums** over ranks (and over the devices of one rank), exactly
as MXNet's ``dist_sync`` sums the pushes of its workers. So a Gluon script
that calls ``trainer.step(per_rank_batch_size)`` follows the same trajectory
with ``kvstore='mpi'`` as with ``kvstore='dist_sync'``.
"""

from __future__ import annotations

import logging
import pickle
from typing import Any, Sequence

import mxnet as mx
import numpy as np
from mxnet.kvstore import KVStoreBase

from . import modes
from .collectives import allreduce_, broadcast_, check_array, check_same_layout
from .errors import MPIKVStoreError
from .world import Communicator
from .world import init as init_world

log = logging.getLogger("mxnet_mpi")
_announced = False

SPARSE_HINT = ("; use MXNet's kvstore='dist_sync' (parameter server) for row_sparse "
               "gradients or weights")

Key = Any  # int or str


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _group(key, value, out) -> list:
    """Normalise (key, value, out) into [(key, [values], [outs] or None)]."""
    if isinstance(key, (list, tuple)):
        values = _as_list(value)
        outs = _as_list(out) if out is not None else [None] * len(key)
        if len(values) != len(key) or len(outs) != len(key):
            raise MPIKVStoreError("got %d keys but %d values and %d outs"
                                  % (len(key), len(values), len(outs)))
        return [(k, _as_list(v), None if o is None else _as_list(o))
                for k, v, o in zip(key, values, outs)]
    return [(key, _as_list(value), None if out is None else _as_list(out))]


def _legacy_view(arr):
    """A legacy NDArray view sharing `arr`'s memory, 1-d if `arr` is 0-d: our
    copies and sums use legacy operators, which reject mx.np arrays and 0-d
    shapes (legacy reshape is a view; mx.np's reshape would copy)."""
    legacy = arr.as_nd_ndarray() if isinstance(arr, mx.np.ndarray) else arr
    return legacy.reshape((legacy.size,)) if legacy.ndim == 0 else legacy


def _check_key(key) -> None:
    if not isinstance(key, (int, str)) or isinstance(key, bool):
        raise MPIKVStoreError("kvstore keys must be int or str, got %r of type %s"
                              % (key, type(key).__name__))


def _broadcast_groups(key, value, out) -> list:
    """_group() for broadcast: every key needs `out` and exactly one value."""
    groups = _group(key, value, out)
    for k, values, outs in groups:
        if outs is None:
            raise MPIKVStoreError("broadcast needs `out` for key %r" % (k,))
        if len(values) != 1:
            raise MPIKVStoreError("broadcast takes one value per key, got %d for key %r"
                                  % (len(values), k))
    return groups


def _check_optimizer(optimizer) -> None:
    if not isinstance(optimizer, mx.optimizer.Optimizer):
        raise MPIKVStoreError("set_optimizer expects an mx.optimizer.Optimizer, got %s"
                              % type(optimizer).__name__)


def on_deferred_init(param, fn) -> None:
    """Call fn(arrays) once the deferred-init Gluon `param` gets its arrays
    (during the first forward, before any op reads them)."""
    init_impl = param._init_impl

    def hooked(data, ctx_list):
        init_impl(data, ctx_list)
        del param._init_impl  # back to the class method
        fn(param._check_and_get(param._data, list))

    param._init_impl = hooked


class MPIKVStore(KVStoreBase):
    """Data-parallel KVStore over MPI whose collectives are nodes of MXNet's engine.

    Created by ``mx.kv.create('mpi')`` (default mode, or $MXNET_MPI_MODE) or
    ``mx.kv.create('mpi_<mode>')`` after ``import mxnet_mpi``; also usable as
    ``gluon.Trainer(..., kvstore='mpi')`` under ``mpirun``.
    """

    fixed_mode: str | None = None  # set by the mpi_<mode> subclasses

    def __init__(self, mode: str | None = None, comm: Communicator | None = None) -> None:
        """`comm`: the ranks to reduce over (default: the whole MPI world);
        the store duplicates it, so no other traffic can match its own."""
        world = init_world()
        self._mode = modes.resolve(mode if mode is not None else self.fixed_mode)
        self._comm = (comm if comm is not None else world).dup()
        self._executor = modes.create_executor(self._mode, self._comm)
        self._key_comms: dict[Key, object] = {}   # concurrent: a communicator per key
        self._key_chains: dict[Key, mx.nd.NDArray] = {}  # concurrent: push order per key
        self._meta: dict[Key, tuple] = {}      # key -> (shape, dtype) seen first
        self._stored: dict[Key, mx.nd.NDArray] = {}  # values kept for pull()
        self._merge: dict[Key, mx.nd.NDArray] = {}   # per-key device-sum buffers
        self._updater = None
        self._optimizer = None
        global _announced
        if world.rank == 0 and not _announced:
            _announced = True
            log.info("mxnet_mpi: kvstore %s in %s mode over %d rank(s)",
                     self.type, self._mode, self._comm.size)

    # ------------------------------------------------------------ properties
    @property
    def type(self) -> str:
        return "mpi_" + self._mode

    @property
    def mode(self) -> str:
        """The embedding mode in use: 'chained', 'funneled' or 'concurrent'."""
        return self._mode

    @property
    def rank(self) -> int:
        return self._comm.rank

    @property
    def num_workers(self) -> int:
        return self._comm.size

    @staticmethod
    def is_capable(capability: str) -> bool:
        """No optimizer on the store by default: Trainer then updates locally
        after allreduce (the fast path). ``set_optimizer`` still works."""
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return False
        raise MPIKVStoreError("unknown capability %r" % (capability,))

    # ------------------------------------------------------------ helpers
    @staticmethod
    def _name(verb: str, key: Key, arr) -> str:
        """Describes a collective; ranks must agree on it (signature checks)."""
        return "%s key=%r shape=%s %s" % (verb, key, tuple(arr.shape), np.dtype(arr.dtype))

    def _check_first_use(self, key: Key, arr) -> None:
        """Concurrent mode: before a key gets its communicator (a collective
        over the store's communicator), check that every rank is at the same
        key with the same shape and dtype, or say who differs."""
        width = 160
        rows = np.zeros((self._comm.size, width), dtype=np.uint8)
        desc = self._name("allreduce/broadcast", key, arr).encode()[:width - 1]
        rows[self._comm.rank, :len(desc)] = np.frombuffer(desc, dtype=np.uint8)
        table = mx.nd.array(rows, dtype="uint8")
        # rows are disjoint: the sum is an allgather
        allreduce_(table, table, self._comm, name=self._name("first-use check of", key, arr))
        got = [bytes(row).rstrip(b"\0").decode() for row in table.asnumpy()]
        if len(set(got)) > 1:
            raise MPIKVStoreError(
                "ranks disagree on a collective (different key, shape or dtype, or keys first "
                "used in a different order): "
                + "; ".join("rank %d runs '%s'" % (r, g) for r, g in enumerate(got)))

    def _remember(self, key: Key, value) -> None:
        """Record a key's layout on first use; later uses must match it."""
        _check_key(key)
        meta = (tuple(value.shape), str(value.dtype))
        seen = self._meta.setdefault(key, meta)
        if seen != meta:
            raise MPIKVStoreError("key %r was first used with shape %s and dtype %s, now %s "
                                  "and %s" % (key, seen[0], seen[1], meta[0], meta[1]))

    def _check_values(self, key: Key, values: list, outs: list | None) -> None:
        if not values:
            raise MPIKVStoreError("no value given for key %r" % (key,))
        for i, v in enumerate(values):
            check_array(v, "value %d of key %r" % (i, key), SPARSE_HINT)
            check_same_layout(values[0], v, "value %d of key %r" % (i, key))
        for i, o in enumerate(outs or []):
            check_array(o, "out %d of key %r" % (i, key), SPARSE_HINT)
            check_same_layout(values[0], o, "out %d of key %r" % (i, key))
        self._remember(key, values[0])

    def _local_sum(self, key: Key, values: list):
        """One array holding the sum over this rank's devices (engine ops)."""
        if len(values) == 1 or values[0].size == 0:
            return values[0]
        first = values[0]
        buf = self._merge.get(key)
        if buf is None or buf.context != first.context:
            buf = self._merge[key] = mx.nd.empty(first.shape, ctx=first.context,
                                                 dtype=first.dtype)
        legacy = [_legacy_view(v).as_in_context(first.context) for v in values]
        mx.nd.add_n(*legacy, out=_legacy_view(buf))
        return buf

    @staticmethod
    def _fan_out(src, outs: list) -> None:
        if src.size == 0:  # nothing to copy; legacy MXNet rejects empty copies
            return
        for o in outs:
            if o is not src:
                _legacy_view(src).copyto(_legacy_view(o))

    def _route(self, key: Key, arr) -> dict:
        """Communicator, chain variable and executor for a collective on `key`."""
        if self._mode == "chained":
            return {"comm": self._comm, "chain": modes.chain_var(), "executor": self._executor}
        if self._mode == "funneled":
            return {"comm": self._comm, "chain": None, "executor": self._executor}
        comm = self._key_comms.get(key)
        if comm is None:
            # Collective over the store's communicator, at the key's first use,
            # which comes in the same program order on every rank.
            self._check_first_use(key, arr)
            comm = self._key_comms[key] = self._comm.dup()
            self._key_chains[key] = mx.nd.zeros((1,), ctx=mx.cpu())
        return {"comm": comm, "chain": self._key_chains[key], "executor": self._executor}

    def _allreduce(self, key: Key, src, dst, priority: int) -> None:
        route = self._route(key, src)
        allreduce_(src, dst, route.pop("comm"), priority=priority,
                   name=self._name("allreduce", key, src), **route)

    def _broadcast(self, key: Key, src, dst, priority: int) -> None:
        route = self._route(key, src)
        broadcast_(src, dst, route.pop("comm"), root=0, priority=priority,
                   name=self._name("broadcast", key, src), **route)

    # ------------------------------------------------------------ KVStoreBase API
    def broadcast(self, key, value, out, priority: int = 0) -> None:
        """Copy rank 0's `value` into `out` (an array or list) on every rank."""
        for k, values, outs in _broadcast_groups(key, value, out):
            self._check_values(k, values, outs)
            self._broadcast(k, values[0], outs[0], priority)
            self._fan_out(outs[0], outs[1:])

    def pushpull(self, key, value, out=None, priority: int = 0) -> None:
        """Sum `value` (an array, or one array per device) over devices and ranks;
        write the sum to `out` (array or list), or back into `value` if out is None.
        With an optimizer set, it is push() then pull(): `out` gets the weight."""
        if self._updater is not None:
            self.push(key, value, priority)
            self.pull(key, value if out is None else out, priority)
            return
        for k, values, outs in _group(key, value, out):
            self._check_values(k, values, outs)
            src = self._local_sum(k, values)
            targets = values if outs is None else outs
            dst = src if outs is None else outs[0]
            self._allreduce(k, src, dst, priority)
            self._fan_out(dst, targets)

    def init(self, key, value) -> None:
        """Initialise `key` with rank 0's `value` (written back into `value` too)."""
        for k, values, _ in _group(key, value, None):
            self._check_values(k, values, None)
            stored = mx.nd.empty(values[0].shape, ctx=values[0].context, dtype=values[0].dtype)
            self._broadcast(k, values[0], stored, 0)
            self._fan_out(stored, values)
            self._stored[k] = stored

    def push(self, key, value, priority: int = 0) -> None:
        """Sum `value` over devices and ranks into the stored value of `key`
        (or, with an optimizer set, apply the update to the stored weight)."""
        for k, values, _ in _group(key, value, None):
            self._check_values(k, values, None)
            src = self._local_sum(k, values)
            if self._updater is None:
                dst = self._stored.get(k)
                if dst is None:
                    dst = self._stored[k] = mx.nd.empty(src.shape, ctx=src.context,
                                                        dtype=src.dtype)
                self._allreduce(k, src, dst, priority)
            else:
                if k not in self._stored:
                    raise MPIKVStoreError("push with an optimizer needs init(%r) first" % (k,))
                grad = mx.nd.empty(src.shape, ctx=src.context, dtype=src.dtype)
                self._allreduce(k, src, grad, priority)
                self._updater(k, grad, self._stored[k])

    def pull(self, key, out=None, priority: int = 0, ignore_sparse: bool = True) -> None:
        """Copy the stored value of `key` (from init or push) into `out`."""
        if out is None:
            raise MPIKVStoreError("pull needs `out`")
        for k, outs, _ in _group(key, out, None):
            _check_key(k)
            if k not in self._stored:
                raise MPIKVStoreError("pull of key %r, which was never initialised: call "
                                      "init(key, value) or push(key, value) first" % (k,))
            for i, o in enumerate(outs):
                check_array(o, "out %d of key %r" % (i, k), SPARSE_HINT)
                check_same_layout(self._stored[k], o, "out %d of key %r" % (i, k))
            self._fan_out(self._stored[k], outs)

    def row_sparse_pull(self, key, out=None, priority: int = 0, row_ids=None) -> None:
        raise MPIKVStoreError("row_sparse_pull is not supported by kvstore '%s'%s"
                              % (self.type, SPARSE_HINT))

    def set_gradient_compression(self, compression_params) -> None:
        raise MPIKVStoreError("gradient compression is not supported by kvstore '%s'"
                              % self.type)

    def set_optimizer(self, optimizer) -> None:
        """Apply `optimizer` locally on every rank to values pushed with push();
        every rank holds identical weights, so no server is needed."""
        _check_optimizer(optimizer)
        self._optimizer = optimizer
        self._updater = mx.optimizer.get_updater(optimizer)

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Write the optimizer states (rank 0 is enough: all ranks hold the same)."""
        if self._updater is None:
            raise MPIKVStoreError("no optimizer set on kvstore '%s': call set_optimizer "
                                  "first" % self.type)
        with open(fname, "wb") as f:
            f.write(self._updater.get_states(dump_optimizer))

    def load_optimizer_states(self, fname: str) -> None:
        """Read optimizer states written by save_optimizer_states."""
        if self._updater is None:
            raise MPIKVStoreError("no optimizer set on kvstore '%s': call set_optimizer "
                                  "first" % self.type)
        with open(fname, "rb") as f:
            self._updater.set_states(f.read())
        self._optimizer = self._updater.optimizer

    # ------------------------------------------------------------ Gluon glue
    def sync_initial_params(self, params: Sequence) -> None:
        """Broadcast initial values of Gluon `params` from rank 0 now, and of
        deferred-init ones as soon as their shapes are known (first forward),
        so every rank computes its first gradient on the same weights."""
        for idx, param in enumerate(params):
            if param._deferred_init:
                on_deferred_init(param, lambda arrays, idx=idx: self.broadcast(
                    idx, arrays[0], out=arrays))
            else:
                arrays = param._check_and_get(param._data, list)
                self.broadcast(idx, arrays[0], out=arrays)

    def allreduce_params(self, params: Sequence, update_on_kvstore: bool) -> None:
        """Trainer's gradient reduction, issued last parameter first: backprop
        makes gradients ready from the output layer back, so the chain of
        collectives follows readiness instead of waiting for the input layer."""
        for i in reversed(range(len(params))):
            param = params[i]
            if param.grad_req == "null":
                continue
            out = param.list_data() if update_on_kvstore else None
            self.pushpull(i, param.list_grad(), out=out, priority=-i)

    def __getstate__(self):
        raise pickle.PicklingError("an MPI kvstore cannot be pickled")

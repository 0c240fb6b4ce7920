"""MPI KVStores registered with MXNet: ``mpi`` and ``mpi_<mode>``.

``pushpull`` **sums** over ranks (and over the devices of one rank), exactly
as MXNet's ``dist_sync`` sums the pushes of its workers. So a Gluon script
that calls ``trainer.step(per_rank_batch_size)`` follows the same trajectory
with ``kvstore='mpi'`` as with ``kvstore='dist_sync'``. Scripts converted from
Horovod, whose allreduce averages, set ``kv.average = True`` (or
``MXNET_MPI_AVERAGE=1``).
"""

from __future__ import annotations

import ctypes
import logging
import pickle

import mxnet as mx
from mxnet.kvstore import KVStoreBase

from . import _native, modes, settings, staging, weight_writes
from .batch_sizes import BatchSizes, SettingsComparison
from .collectives import (
    Stream,
    check_array,
    check_same_layout,
    on_host,
)
from .consistency import check_after_writes
from .errors import MPIKVStoreError
from .joining import join_store, register
from .keys import KeyBook, broadcast_groups, check_key, check_optimizer, key_groups
from .optimizer_settings import describe
from .store_calls import SPARSE_HINT, StoreCalls
from .store_glue import SETTINGS_COLLECTIVES, FrameworkGlue
from .trainer_plan import TrainerPlan
from .world import Communicator, require_usable
from .world import init as init_world

log = logging.getLogger("mxnet_mpi")
_announced = False

COMPRESSIONS = ("none", "fp16")


class MPIKVStore(StoreCalls, FrameworkGlue, KVStoreBase):
    """Data-parallel KVStore over MPI whose collectives are nodes of MXNet's engine.

    Created by ``mx.kv.create('mpi')`` (default mode, or $MXNET_MPI_MODE) or
    ``mx.kv.create('mpi_<mode>')`` after ``import mxnet_mpi``; also usable as
    ``gluon.Trainer(..., kvstore='mpi')`` under ``mpirun``. ``close()`` (or a
    ``with`` block, or dropping the last reference) frees its threads and
    communicators.
    """

    fixed_mode: str | None = None  # set by the mpi_<mode> subclasses

    def __init__(self, mode: str | None = None, comm: Communicator | None = None,
                 average: bool | None = None) -> None:
        """`comm`: the ranks to reduce over (default: the whole MPI world); the
        store works on a private duplicate. `average`: divide sums by the number
        of ranks (default $MXNET_MPI_AVERAGE, else sum)."""
        self._closed = True  # until the native stream exists
        world = init_world()
        self._mode = modes.resolve(mode if mode is not None else self.fixed_mode)
        self._comm = comm if comm is not None else world
        self._stream = modes.create_stream(self._mode, self._comm, "mpi_" + self._mode)
        self._closed = False
        self._keys = KeyBook()
        self._stored: dict = {}   # values kept for pull()
        self._merge: dict = {}    # per-key device-sum buffers
        self._updater = None
        self._states_loaded = False   # an odd number of load_optimizer_states
        self._apart = False           # weights or states found apart across the ranks
        self._optimizer = None
        self._compression = "none"
        self._average = bool(settings.get("MXNET_MPI_AVERAGE") if average is None
                             else average)
        self._plan = TrainerPlan(self)
        # pushpull of one key with the same arrays again: key -> (value, out,
        # priority, pointer to its prebuilt call, the call)
        self._fast: dict = {}
        self._staging = staging.StagingBuffers()
        self._last_calls: list = []
        # What the pushes are for, printed in their messages (see serving())
        self._context: bytes | None = None
        self._batch_sizes: BatchSizes | None = None   # general path (batch_agreement)
        self._settings = SettingsComparison(SETTINGS_COLLECTIVES)   # settings_check
        self._reductions = 0   # Trainer gradient reductions so far
        register(self)
        global _announced
        if world.rank == 0 and not _announced:
            _announced = True
            log.info("mxnet_mpi: kvstore %s in %s mode over %d rank(s)",
                     self.type, self._mode, self._comm.size)

    # ------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Free the store's threads and communicators once its collectives are
        done (idempotent; the store is unusable afterwards)."""
        if not self._closed:
            self._closed = True
            self._stream.close()

    def __enter__(self) -> MPIKVStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown, forked child)
            pass

    def _usable(self) -> None:
        if self._closed:
            raise MPIKVStoreError("kvstore '%s' is closed" % self.type)
        require_usable()

    # ------------------------------------------------------------ properties
    @property
    def type(self) -> str:
        return "mpi_" + self._mode

    @property
    def comm(self) -> Communicator:
        """The communicator the store reduces over (its stream has a private
        duplicate of it)."""
        return self._comm

    @property
    def stream(self) -> Stream:
        """The store's native stream (collectives.Stream)."""
        return self._stream

    @property
    def closed(self) -> bool:
        """Whether close() was called."""
        return self._closed

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

    @property
    def synchronous(self) -> bool:
        """Every rank's contribution enters every step (as MXNet's dist_sync)."""
        return True

    @property
    def average(self) -> bool:
        """Whether pushpull/push divide the sum by the number of ranks."""
        return self._average

    @average.setter
    def average(self, value: bool) -> None:
        self._average = bool(value)
        self._forget_calls()

    def recast(self, key) -> None:
        """A Trainer's parameter was cast to another dtype (Parameter.cast, as
        `net.cast('float16')` after the Trainer): its key takes the new layout
        at its next use, where the ranks compare it as always."""
        self._keys.forget(key)
        self._forget_calls()

    def _forget_calls(self) -> None:
        """Settings changed (averaging, compression): build calls afresh."""
        self._plan.forget()
        self._fast.clear()

    @staticmethod
    def is_capable(capability: str) -> bool:
        """No optimizer on the store by default: Trainer then updates locally
        after allreduce (the fast path). ``set_optimizer`` still works."""
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return False
        raise MPIKVStoreError("unknown capability %r" % (capability,))

    # ------------------------------------------------------------ KVStoreBase API
    def broadcast(self, key, value, out, priority: int = 0) -> None:
        """Copy rank 0's `value` into `out` (an array or list) on every rank."""
        groups = broadcast_groups(key, value, out)

        def build(k, values, outs):
            self._checked(k, values, outs, "broadcast")
            return self._item(_native.BROADCAST, "broadcast", k, values[0], outs[0], outs,
                              priority)

        self._run(groups, build, _native.BROADCAST, "broadcast")

    def pushpull(self, key, value, out=None, priority: int = 0) -> None:
        """Sum `value` (an array, or one array per device) over devices and ranks;
        write the sum to `out` (array or list), or back into `value` if out is None.
        With an optimizer set, it is push() then pull(): `out` gets the weight."""
        if self._updater is not None:
            self.push(key, value, priority)
            self.pull(key, value if out is None else out, priority)
            return
        fast = self._fast.get(key) if type(key) in (int, str) else None
        if (fast is not None and fast[0] is value and fast[1] is out and fast[2] == priority
                and fast[5] == self._keys.owner and not self._closed):
            # The same arrays as last time: the native side checks their layout.
            self._stream.push_raw(fast[3], 1, self._context)
            return
        self._reduce(key_groups(key, value, out), lambda k: priority)
        if type(key) in (int, str) and isinstance(value, mx.nd.NDArray) \
                and len(self._last_calls) == 1 and not staging.needs_staging(value) \
                and (out is None or (isinstance(out, mx.nd.NDArray) and on_host(out))):
            call = self._last_calls[0]
            self._fast[key] = (value, out, priority, ctypes.pointer(call.desc), call,
                               self._keys.owner)

    def _reduce(self, groups: list, priority_of) -> None:
        def build(k, values, outs):
            info = self._checked(k, values, outs, "allreduce")
            src = self._local_sum(k, values)
            dst = src if outs is None else outs[0]
            return self._item(_native.ALLREDUCE, "allreduce", k, src, dst,
                              values if outs is None else outs, priority_of(k),
                              self._flags(info.dtype, k))

        self._run(groups, build, _native.ALLREDUCE, "allreduce")

    def init(self, key, value) -> None:
        """Initialise `key` with rank 0's `value` (written back into `value` too)."""
        groups = key_groups(key, value, None)

        def build(k, values, outs):
            self._checked(k, values, None, "broadcast")
            stored = mx.nd.empty(values[0].shape, ctx=values[0].context, dtype=values[0].dtype)
            self._stored[k] = stored
            return self._item(_native.BROADCAST, "broadcast", k, values[0], stored,
                              [stored] + values, 0)

        self._run(groups, build, _native.BROADCAST, "broadcast")

    def push(self, key, value, priority: int = 0) -> None:
        """Sum `value` over devices and ranks into the stored value of `key`
        (or, with an optimizer set, apply the update to the stored weight)."""
        groups = key_groups(key, value, None)
        updates = []

        def build(k, values, outs):
            info = self._checked(k, values, None, "allreduce")
            if self._updater is not None and k not in self._stored:
                raise MPIKVStoreError("push with an optimizer needs init(%r) first" % (k,))
            src = self._local_sum(k, values)
            if self._updater is None:
                dst = self._stored.get(k)
                if dst is None:
                    dst = self._stored[k] = mx.nd.empty(src.shape, ctx=src.context,
                                                        dtype=src.dtype)
            else:
                dst = mx.nd.empty(src.shape, ctx=src.context, dtype=src.dtype)
                updates.append((k, dst))
            tag = _native.FLAG_STATES_LOADED if self._states_loaded else 0
            return self._item(_native.ALLREDUCE, "allreduce", k, src, dst, [dst], priority,
                              self._flags(info.dtype, k) | tag)

        if self._updater is not None:
            if self._apart:   # found apart before: again now, until they are alike
                self._after_writes(self.num_workers)
            # optimizer settings, and states loaded on some ranks only, compared
            # once per SETTINGS_COLLECTIVES collectives, as for a Module
            watch = self._updater._mxmpi_writes
            self.settings_check(lambda: describe(self._optimizer),
                                lambda: watch.written(self._updater, ()), self._after_writes)
            self.share_noise(self._updater.optimizer)   # SGLD: the same noise on every rank
        try:
            self._run(groups, build, _native.ALLREDUCE, "allreduce")
        finally:
            for k, grad in updates:
                self._updater(k, grad, self._stored[k])

    def _after_writes(self, writers: int) -> None:
        """Some rank loaded optimizer states (load_optimizer_states), or the
        ranks were found apart before: compare every rank's states and stored
        weights (collective). Found apart, every later push compares them
        again, at once, and fails until they are alike."""
        keys = sorted(self._stored, key=lambda k: (isinstance(k, str), k))
        weights = [(repr(k), self._stored[k], k) for k in keys]
        whole = self._apart or self._updater._mxmpi_writes.states
        self._apart = False

        def still_apart(*_) -> None:
            self._apart = True
            weight_writes.note(self._updater)
        check_after_writes(
            weights, self._optimizer, self._updater,
            lambda row: self.rank_table(row, "hashes of the stored weights and optimizer states"),
            "kvstore '%s' push" % self.type, writers,
            "this push was not applied", "copy rank 0's values to every rank with "
            "kv.init(key, value) on every rank",
            set(range(len(weights))) if whole else set(), whole, still_apart,
            states_fix=": load the same states on every rank (kv.load_optimizer_states), and "
            "copy rank 0's weights to every rank with kv.init(key, value) on every rank")

    def pull(self, key, out=None, priority: int = 0, ignore_sparse: bool = True) -> None:
        """Copy the stored value of `key` (from init or push) into `out`."""
        if out is None:
            raise MPIKVStoreError("pull needs `out`")
        for k, outs, _ in key_groups(key, out, None):
            check_key(k)
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
        """``{'type': 'fp16'}``: allreduce float32/float64 arrays as float16 on the
        wire (half the bytes), summed in float32; ``{'type': 'none'}`` turns it off."""
        if not isinstance(compression_params, dict) or "type" not in compression_params:
            raise MPIKVStoreError("gradient compression takes a dict like {'type': 'fp16'}, "
                                  "got %r" % (compression_params,))
        kind = str(compression_params["type"]).lower()
        if kind not in COMPRESSIONS:
            raise MPIKVStoreError(
                "gradient compression %r is not supported by kvstore '%s': supported types "
                "are %s ('2bit'/'1bit' are MXNet parameter-server compressions with error "
                "feedback, not implemented here)" % (kind, self.type, ", ".join(COMPRESSIONS)))
        extra = set(compression_params) - {"type"}
        if extra:
            raise MPIKVStoreError("gradient compression %r takes no parameters, got %s"
                                  % (kind, ", ".join(sorted(extra))))
        self._compression = kind
        self._forget_calls()

    def set_optimizer(self, optimizer) -> None:
        """Apply `optimizer` locally on every rank to values pushed with push();
        every rank holds identical weights, so no server is needed. Collective:
        every rank sets one, and they must have the same settings
        (optimizer_settings; MPIKVStoreError on every rank otherwise)."""
        check_optimizer(optimizer)
        self.batch_agreement(0, "set_optimizer", describe(optimizer)).total()
        self._optimizer = optimizer
        self._updater = mx.optimizer.get_updater(optimizer)
        self._updater._mxmpi_writes = weight_writes.Watch()
        self._states_loaded = False   # a fresh updater: loaded states are gone everywhere
        self._apart = False

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Write the optimizer states (rank 0 is enough: all ranks hold the same;
        load them on every rank)."""
        if self._updater is None:
            raise MPIKVStoreError("no optimizer set on kvstore '%s': call set_optimizer "
                                  "first" % self.type)
        with open(fname, "wb") as f:
            f.write(self._updater.get_states(dump_optimizer))

    def load_optimizer_states(self, fname: str) -> None:
        """Read optimizer states written by save_optimizer_states (on every
        rank: loaded on some ranks only, the states differ, which a later push
        names on every rank)."""
        if self._updater is None:
            raise MPIKVStoreError("no optimizer set on kvstore '%s': call set_optimizer "
                                  "first" % self.type)
        with open(fname, "rb") as f:
            self._updater.set_states(f.read())
        self._optimizer = self._updater.optimizer
        # every rank must load them: a load on some ranks only is named at a
        # later push (settings_check), as Module.load_optimizer_states is
        weight_writes.note(self._updater)
        # and every push carries the parity of this rank's loads (a tag the
        # ranks compare): loads on some ranks only fail each push at once
        self._states_loaded = not self._states_loaded

    # ------------------------------------------------------------ uneven data
    #: Whether join() can even out this store's ranks (the hybrid stores cannot:
    #: their servers wait for a push from every group each step).
    supports_join = True

    def join(self, params=None, updater=None, *, issued: int | None = None) -> int:
        """This rank has run out of data: take part in the collectives the other
        ranks still run (contributing zeros to sums, receiving broadcasts) until
        every rank has called join(); then all return. Returns the rank that ran
        the most collectives (its state is the latest). With `params` (Gluon
        parameters, or a dict name -> NDArray) and/or `updater` (an optimizer
        updater, or a gluon Trainer), their values and optimizer states are
        copied from that rank, so every rank continues identically; so are
        this store's own values and states where it has an optimizer
        (set_optimizer, push, pull). `issued`: joining.wait_joined's result,
        where the caller has waited for every rank already."""
        self._usable()
        own = None
        if self._updater is not None:   # set_optimizer: its weights and states, too
            own = ({"s:" + k if isinstance(k, str) else "i:%020d" % k: v
                    for k, v in self._stored.items()}, self._updater)
        root = join_store(self, params, updater, own, issued)
        if own is not None:
            self._optimizer = self._updater.optimizer   # the root's, as loaded
        # the ranks that joined early made fewer settings_check calls: start
        # the window afresh from the count of collectives, the same everywhere
        self._settings.restart(self._workers_stream().info()[0])
        return root

    def __getstate__(self):
        raise pickle.PicklingError("an MPI kvstore cannot be pickled")

"""Hybrid stores ``dist_sync_mpi`` and ``dist_async_mpi``: MPI groups plus ps-lite.

The MPI world is split into groups of ``$MXNET_MPI_GROUP_SIZE`` consecutive
ranks (default: the ranks of one host, ``local_size()``). Per key and step:

1. the group sums its gradients with an engine-embedded MPI allreduce;
2. the key's *owner* in the group pushes that sum to MXNet's parameter server
   (``dist_sync`` or ``dist_async``), which applies the optimizer given by
   ``set_optimizer``, and pulls the new weight;
3. the owner broadcasts the weight to its group over MPI.

Who talks to the servers (``$MXNET_MPI_HYBRID_ROUTE``):

``leader`` (default)  group rank 0 owns every key; only leaders are ps-lite
                      workers, so ``DMLC_NUM_WORKER`` = number of groups.
``sharded``           group rank ``key % group_size`` owns a key; every rank is
                      a ps-lite worker (``DMLC_NUM_WORKER`` = world size). Only
                      with ``dist_async_mpi``: a ``dist_sync`` server waits for a
                      push from *every* worker on every key, so a key pushed by
                      one rank per group would never complete.

The server sums the pushes of all groups, i.e. the gradients of all ranks,
exactly as ``dist_sync`` sums its workers: with Gluon's
``trainer.step(per_rank_batch)`` (``rescale_grad = 1/per_rank_batch``) the
weights follow those of ``mpi`` over the same ranks and of ``dist_sync`` with
as many workers. With ``dist_async_mpi`` each group's push is applied on its
own, as soon as it arrives; groups do not wait for each other.

Sparse gradients (``row_sparse``, e.g. ``Embedding(sparse_grad=True)``) take
the parameter server's row_sparse push: the group first agrees on the union of
its rows (two small integer allreduces), sums a compact ``rows x dim`` block by
allreduce, and the owner pushes that block as one row_sparse array; dense
weights are pulled and broadcast as usual. ``row_sparse`` weights are pulled
with ``row_sparse_pull``: the owner pulls the union of the rows its group asks
for and broadcasts them. Dense keys never leave MPI inside a group.
"""

from __future__ import annotations

import collections
import contextlib
import os
import weakref
import zlib

import mxnet as mx
import numpy as np
from mxnet.kvstore import KVStoreBase

from . import _native, ops
from .collectives import Call, Stream, token_call
from .errors import MPIKVStoreError
from .keys import check_key as _check_key
from .kvstore import (
    MPIKVStore,
    _as_list,
    _broadcast_groups,
    _check_optimizer,
    _group,
    on_deferred_init,
)
from .routes import ROUTES, expected_ps_workers  # noqa: F401  (part of this module's API)
from .world import Communicator, local_size
from .world import init as init_world
from .world import on_exit as on_world_exit

GROUP_SIZE_ENV = "MXNET_MPI_GROUP_SIZE"
ROUTE_ENV = "MXNET_MPI_HYBRID_ROUTE"
LAUNCH_HINT = ("; start the job with `python -m mxnet_mpi.launch -n N --groups G --servers S "
               "-- python train.py`, which starts ps-lite and sets every DMLC_* variable")

_open_stores: weakref.WeakSet = weakref.WeakSet()
_close_registered = False


def _close_all() -> None:
    for store in list(_open_stores):
        store.close()


def _close_at_exit() -> None:
    """Close stores at exit, after this rank announced its end and its
    collectives completed, before MPI is finalised."""
    global _close_registered
    if not _close_registered:
        _close_registered = True
        on_world_exit(_close_all)


@contextlib.contextmanager
def _server_flight(arr, desc: str):
    """A health flight (stall warning, then abort) around the parameter-server
    work done in the block: its begin and end markers are engine ops on `arr`."""
    wait = _native.server_wait(arr, desc, True)
    yield
    _native.server_wait(arr, desc, False, wait)


def _env_positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise MPIKVStoreError("%s must be an integer, got %r" % (name, raw)) from None
    if value <= 0:
        raise MPIKVStoreError("%s must be > 0, got %d" % (name, value))
    return value


def _world_sum(world: Communicator, values: list) -> np.ndarray:
    """Blocking sum of small int64 `values` over the world (construction-time checks)."""
    arr = mx.nd.array(np.asarray(values, dtype=np.int64), dtype="int64")
    ops.allreduce_(arr, name="mpi_hybrid:check", comm=world)
    return arr.asnumpy()


def resolve_group_size(world: Communicator | None = None) -> int:
    """Ranks per group: $MXNET_MPI_GROUP_SIZE, else the ranks on this host.

    Collective over the world when the default is used (every rank must see
    the same local size). Raises MPIKVStoreError unless it divides the world."""
    world = world if world is not None else init_world()
    raw = os.environ.get(GROUP_SIZE_ENV, "").strip()
    if raw:
        size = _env_positive_int(GROUP_SIZE_ENV, raw)
        source = GROUP_SIZE_ENV
    else:
        size = local_size()
        total, squares = _world_sum(world, [size, size * size])
        if total * total != world.size * squares:  # equal iff all local sizes agree
            raise MPIKVStoreError(
                "hosts run different numbers of ranks, so the default group (one per host) "
                "is ambiguous: set %s" % GROUP_SIZE_ENV)
        source = "the ranks per host (%s unset)" % GROUP_SIZE_ENV
    if world.size % size:
        raise MPIKVStoreError("group size %d (from %s) does not divide the world size %d"
                              % (size, source, world.size))
    return size


def route_from_env() -> str:
    """'leader' or 'sharded' from $MXNET_MPI_HYBRID_ROUTE (default 'leader')."""
    route = os.environ.get(ROUTE_ENV, "leader").strip().lower() or "leader"
    if route not in ROUTES:
        raise MPIKVStoreError("unknown %s %r; choose one of %s"
                              % (ROUTE_ENV, route, ", ".join(ROUTES)))
    return route


class HybridKVStore(MPIKVStore):
    """MPI allreduce inside groups, MXNet's parameter server between groups.

    Created as ``mx.kv.create('dist_sync_mpi')`` / ``'dist_async_mpi'`` or by
    ``gluon.Trainer(..., kvstore='dist_sync_mpi')`` under the launcher
    (``python -m mxnet_mpi.launch``). ``rank``/``num_workers`` are those of
    the MPI world: shard the data over all ranks, as with ``mpi``.
    """

    dist_type = "dist_sync"          # MXNet store between groups (set by subclasses)
    supports_sparse = True           # row_sparse keys go through the server
    supports_join = False            # servers wait for every group's push each step

    def __init__(self, mode: str | None = None, route: str | None = None,
                 ranks_per_group: int | None = None) -> None:
        """`route`: 'leader' or 'sharded' (default $MXNET_MPI_HYBRID_ROUTE);
        `ranks_per_group`: default $MXNET_MPI_GROUP_SIZE, else the ranks per
        host. Collective over the MPI world. One per process: ps-lite runs one
        worker per process (share the store, as with MXNet's dist stores)."""
        world = init_world()
        if _open_stores:
            raise MPIKVStoreError(
                "a hybrid store is already open in this process; ps-lite allows one "
                "worker per process: reuse it, or close() it first")
        self._route_name = route if route is not None else route_from_env()
        if self._route_name not in ROUTES:
            raise MPIKVStoreError("unknown route %r; choose one of %s"
                                  % (self._route_name, ", ".join(ROUTES)))
        if self._route_name == "sharded" and "async" not in self.dist_type:
            raise MPIKVStoreError(
                "route 'sharded' works with dist_async_mpi only: dist_sync servers wait "
                "for a push from every ps-lite worker on every key; use route 'leader'")
        gsize = ranks_per_group if ranks_per_group is not None else resolve_group_size(world)
        if gsize <= 0 or world.size % gsize:
            raise MPIKVStoreError("group size %d does not divide the world size %d"
                                  % (gsize, world.size))
        self._group_size = gsize
        self._num_groups = world.size // gsize
        self._group_id = world.rank // gsize
        self._check_ps_env(world.size)
        group = world.split(self._group_id, world.rank)
        assert group is not None
        super().__init__(mode, comm=group)   # self._comm: a duplicate of the group
        group.free()
        self._world = world                  # initial weights come from world rank 0
        self._world_stream = Stream(_native.EXEC_CHAINED, world, self.type + " (world)")
        self._is_ps_worker = self._route_name == "sharded" or self._comm.rank == 0
        self._dist = None
        self._gbuf: dict = {}                # key -> group-sum buffer (dense keys)
        self._rsp_keys: set = set()          # keys stored row_sparse on the servers
        self._all_rows: dict = {}            # key -> arange(rows), to pull a whole weight
        self._owners: dict = {}
        self._server_keys: set = set()       # keys initialised on the servers by this store
        self._ps_errors: dict = {}           # key -> a failed server push, raised at its pull
        self.routes: dict = {}               # key -> 'dense' or 'row_sparse' (introspection)
        self.stats: collections.Counter = collections.Counter()
        if self._is_ps_worker:
            # Blocks until the scheduler, every server and every ps worker are up.
            self._dist = mx.kv.create(self.dist_type)
        _open_stores.add(self)
        _close_at_exit()

    # ------------------------------------------------------------ set-up
    def _check_ps_env(self, world_size: int) -> None:
        missing = [v for v in ("DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
                               "DMLC_NUM_WORKER") if not os.environ.get(v)]
        if missing:
            raise MPIKVStoreError("kvstore '%s' needs MXNet's parameter server, but %s %s "
                                  "unset%s" % (self.type, ", ".join(missing),
                                               "is" if len(missing) == 1 else "are",
                                               LAUNCH_HINT))
        role = os.environ.get("DMLC_ROLE", "worker")
        if role != "worker":
            raise MPIKVStoreError("kvstore '%s' runs on MPI ranks with DMLC_ROLE=worker, "
                                  "not %r" % (self.type, role))
        want = expected_ps_workers(self._route_name, world_size, self._num_groups)
        got = os.environ["DMLC_NUM_WORKER"]
        if got != str(want):
            raise MPIKVStoreError(
                "DMLC_NUM_WORKER=%s, but route '%s' with %d group(s) of %d rank(s) has %d "
                "ps-lite worker(s)%s" % (got, self._route_name, self._num_groups,
                                         self._group_size, want, LAUNCH_HINT))

    def close(self) -> None:
        """Leave the parameter server (ps-lite's exit barrier among its workers)
        and free the MPI side. Called at the end of the program; idempotent."""
        if self._dist is not None:
            mx.nd.waitall()
            # ps::Finalize (run by the native store's destructor) is a barrier with
            # the scheduler and every group: a stopped scheduler or group is named
            # by the stall warning and aborts the job
            marker = mx.nd.zeros((1,))
            with _server_flight(marker, "parameter-server exit barrier (group %d; waits "
                                "for the scheduler and every group)" % self._group_id):
                mx.nd.waitall()     # the flight has begun before the barrier blocks
                self._dist = None
            mx.nd.waitall()
        _open_stores.discard(self)
        if not self._closed:
            self._world_stream.close()
        super().close()

    # ------------------------------------------------------------ properties
    @property
    def type(self) -> str:
        """'dist_sync_mpi' or 'dist_async_mpi'."""
        return self.dist_type + "_mpi"

    def join(self, params=None, updater=None) -> int:
        """Not available: the parameter server waits for a push from every
        group at each step, so a group cannot stop early. Give every rank the
        same number of batches (MXNet's fit.py does so for 'dist' stores)."""
        raise MPIKVStoreError("join() is not supported by kvstore '%s': its parameter servers "
                              "expect a push from every group at each step; give every rank "
                              "the same number of batches" % self.type)

    @property
    def rank(self) -> int:
        """Rank in the MPI world (shard data by it)."""
        return self._world.rank

    @property
    def num_workers(self) -> int:
        """Size of the MPI world."""
        return self._world.size

    @property
    def group(self) -> int:
        """Index of this rank's group."""
        return self._group_id

    @property
    def num_groups(self) -> int:
        """Number of groups (= ps-lite workers with route 'leader')."""
        return self._num_groups

    @property
    def group_rank(self) -> int:
        """Rank inside the group (0 = the leader)."""
        return self._comm.rank

    @property
    def group_size(self) -> int:
        """Ranks per group."""
        return self._group_size

    @property
    def route(self) -> str:
        """'leader' or 'sharded': who pushes to and pulls from the servers."""
        return self._route_name

    @property
    def is_ps_worker(self) -> bool:
        """Whether this rank talks to the parameter server."""
        return self._is_ps_worker

    @staticmethod
    def is_capable(capability: str) -> bool:
        """The optimizer runs on the servers: Trainer uses update_on_kvstore."""
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return True
        raise MPIKVStoreError("unknown capability %r" % (capability,))

    # ------------------------------------------------------------ routing helpers
    def owner(self, key) -> int:
        """Group rank that pushes/pulls `key` (0 with route 'leader')."""
        own = self._owners.get(key)
        if own is None:
            if self._route_name == "leader":
                own = 0
            elif isinstance(key, int):
                own = key % self._group_size
            else:
                own = zlib.crc32(str(key).encode()) % self._group_size
            self._owners[key] = own
        return own

    def _owns(self, key) -> bool:
        return self._comm.rank == self.owner(key)

    def _group_broadcast(self, key, arr, priority: int) -> None:
        self._collective(_native.BROADCAST, "group broadcast", key, arr, arr, priority,
                         root=self.owner(key))
        self.stats["group_broadcast"] += 1

    def _group_allreduce(self, key, src, dst, priority: int) -> None:
        self._collective(_native.ALLREDUCE, "allreduce", key, src, dst, priority)
        self.stats["group_allreduce"] += 1

    def _world_broadcast(self, key, arr, priority: int = 0) -> None:
        # Over the whole world (initial weights come from world rank 0).
        desc = "world broadcast key=%r shape=%s %s" % (key, tuple(arr.shape), np.dtype(arr.dtype))
        self._world_stream.push([Call(_native.BROADCAST, [arr], [arr], dtype=arr.dtype,
                                      shapes=[arr.shape], desc=desc, label="key %r" % (key,),
                                      priority=priority, name=self._keys.name(key))],
                                self._context)

    # ------------------------------------------------------------ dense path
    def _require_init(self, key, verb: str) -> None:
        """A key the servers never saw would abort the server process (ps-lite's
        CHECK, not an error sent back): refuse it on every rank, before any
        collective (every rank initialises the same keys, so all refuse)."""
        if key not in self._server_keys:
            raise MPIKVStoreError("%s of key %r on kvstore '%s': the key was never initialised; "
                                  "call init() (or broadcast()) on it first"
                                  % (verb, key, self.type))

    def _push_dense(self, key, values: list, priority: int) -> None:
        self._require_init(key, "push")
        self._checked(key, values, None, "allreduce")
        self.routes[key] = "dense"
        src = self._local_sum(key, values)
        buf = self._gbuf.get(key)
        if buf is None or buf.context != src.context:
            buf = self._gbuf[key] = mx.nd.empty(src.shape, ctx=src.context, dtype=src.dtype)
        self._group_allreduce(key, src, buf, priority)
        if self._owns(key):
            self._server_call(key, "push", lambda: self._dist.push(key, buf, priority=priority))
            self.stats["server_push_dense"] += 1

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
                self._internal(_native.BROADCAST, arr, internal, root=self.owner(key))
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

    def _pull_dense(self, key, outs: list, priority: int) -> None:
        for i, o in enumerate(outs):
            if not isinstance(o, mx.nd.NDArray) or o.stype != "default":
                raise MPIKVStoreError("out %d of key %r must be a dense NDArray; use "
                                      "row_sparse_pull for row_sparse weights" % (i, key))
        self._require_init(key, "pull")
        if self._owns(key):
            if key in self._rsp_keys:
                # Stored row_sparse on the servers (sparse gradient, dense weight): all
                # rows, since other groups' rows changed too.
                all_rows = self._all_rows.get(key)
                if all_rows is None:
                    all_rows = self._all_rows[key] = mx.nd.arange(outs[0].shape[0],
                                                                  dtype="int64")
                pulled = mx.nd.sparse.zeros("row_sparse", outs[0].shape, dtype=outs[0].dtype)

                def pull_rows():
                    self._dist.row_sparse_pull(key, out=pulled, row_ids=all_rows,
                                               priority=priority)
                    pulled.copyto(outs[0])
                    outs[0].wait_to_read()   # a server error surfaces here, not later

                self._server_call(key, "row_sparse_pull", pull_rows)
                self.stats["server_row_sparse_pull"] += 1
            elif key not in self._ps_errors:
                def pull():
                    # a stopped server, scheduler or other group stalls here, and
                    # is reported as such
                    with _server_flight(outs[0], "parameter-server pull of key %r (group "
                                        "%d; waits for the servers and every group's push)"
                                        % (key, self._group_id)):
                        self._dist.pull(key, out=outs[0], priority=priority)
                    outs[0].wait_to_read()

                self._server_call(key, "pull", pull)
                self.stats["server_pull"] += 1
        self._broadcast_or_fail(key, outs[0], priority)
        self._fan_out(outs[0], outs[1:])

    # ------------------------------------------------------------ sparse path
    def _gather_ids(self, key, ids: np.ndarray, priority: int) -> np.ndarray:
        """Sorted union over the group of every rank's int64 row ids (blocking)."""
        counts = np.zeros(self._group_size, dtype=np.int64)
        counts[self._comm.rank] = ids.size
        counts_nd = mx.nd.array(counts, dtype="int64")
        self._internal(_native.ALLREDUCE, counts_nd, "row counts of key %r" % (key,))
        counts = counts_nd.asnumpy()
        total = int(counts.sum())
        if total == 0:
            return np.zeros((0,), dtype=np.int64)
        start = int(counts[:self._comm.rank].sum())
        all_ids = np.zeros(total, dtype=np.int64)
        all_ids[start:start + ids.size] = ids
        all_nd = mx.nd.array(all_ids, dtype="int64")
        self._internal(_native.ALLREDUCE, all_nd, "row ids of key %r" % (key,))
        return np.unique(all_nd.asnumpy())

    def _push_row_sparse(self, key, values: list, priority: int) -> None:
        """Sum row_sparse gradients over devices and the group; the owner pushes
        the sum to the server as one row_sparse array."""
        _check_key(key)
        self._require_init(key, "push")
        if self._optimizer is None:
            # ps-lite's servers read pulled rows at their position in a stored array
            # that keeps every row: only an optimizer's (lazy) update keeps it so.
            raise MPIKVStoreError("row_sparse push of key %r needs set_optimizer() first: "
                                  "the servers keep row_sparse keys only as optimizer "
                                  "state (Trainer: update_on_kvstore=True)" % (key,))
        self.routes[key] = "row_sparse"
        shape, dtype = tuple(values[0].shape), np.dtype(values[0].dtype)
        ids, data = _local_rsp_sum(values)
        union = self._gather_ids(key, ids, priority)
        block = np.zeros((union.size,) + shape[1:], dtype=dtype)
        if ids.size:
            block[np.searchsorted(union, ids)] = data
        block_nd = mx.nd.array(block, dtype=dtype)
        if union.size:
            # rows differ from step to step: described by key, not by a fixed layout
            self._internal(_native.ALLREDUCE, block_nd, "row_sparse gradient of key %r" % (key,))
            self.stats["group_allreduce"] += 1
        if self._owns(key):
            rsp = mx.nd.sparse.row_sparse_array(
                (block_nd, mx.nd.array(union, dtype="int64")), shape=shape, dtype=dtype)
            self._server_call(key, "row_sparse push",
                              lambda: self._dist.push(key, rsp, priority=priority))
            self.stats["server_push_row_sparse"] += 1

    def row_sparse_pull(self, key, out=None, priority: int = 0, row_ids=None) -> None:
        """Pull rows `row_ids` of a row_sparse weight into `out` (collective over
        the group: the owner pulls the union of the rows asked for and
        broadcasts them)."""
        if out is None or row_ids is None:
            raise MPIKVStoreError("row_sparse_pull needs `out` and `row_ids`")
        # Gluon calls this inside forward, possibly under autograd.record().
        with mx.autograd.pause():
            self._row_sparse_pull(key, out, row_ids, priority)

    def _row_sparse_pull(self, key, out, row_ids, priority: int) -> None:
        keys = key if isinstance(key, (list, tuple)) else [key]
        outs_all = out if isinstance(key, (list, tuple)) else [out]
        ids_all = row_ids if isinstance(key, (list, tuple)) else [row_ids]
        for k, outs, ids in zip(keys, outs_all, ids_all):
            _check_key(k)
            self._require_init(k, "row_sparse_pull")
            outs, ids_list = _as_list(outs), _as_list(ids)
            if len(ids_list) == 1:
                ids_list = ids_list * len(outs)
            wanted = [np.unique(i.asnumpy().astype(np.int64)) for i in ids_list]
            mine = np.unique(np.concatenate(wanted)) if wanted else np.zeros(0, np.int64)
            union = self._gather_ids(k, mine, priority)
            shape, dtype = tuple(outs[0].shape), np.dtype(outs[0].dtype)
            block_np = np.zeros((0,) + shape[1:], dtype=dtype)
            if union.size:
                # (MXNet 1.x reads a 0 in a shape as "unknown": no empty NDArrays)
                block = mx.nd.zeros((union.size,) + shape[1:], dtype=dtype)
                if self._owns(k):
                    pulled = mx.nd.sparse.zeros("row_sparse", shape, dtype=dtype)

                    def pull_rows(pulled=pulled, k=k, union=union):
                        self._dist.row_sparse_pull(k, out=pulled,
                                                   row_ids=mx.nd.array(union, dtype="int64"),
                                                   priority=priority)
                        pulled.wait_to_read()

                    self._server_call(k, "row_sparse_pull", pull_rows)
                    self.stats["server_row_sparse_pull"] += 1
                    if k not in self._ps_errors:
                        block = _rows_of(pulled, union, shape, dtype)
                self._broadcast_or_fail(k, block, priority,
                                        internal="row_sparse rows of key %r" % (k,))
                block_np = block.asnumpy()
            for o, w in zip(outs, wanted):
                if w.size == 0:
                    # no row asked for: an empty row_sparse array of the right shape
                    mx.nd.sparse.zeros("row_sparse", shape, ctx=o.context,
                                       dtype=dtype).copyto(o)
                    continue
                rows = block_np[np.searchsorted(union, w)]
                mx.nd.sparse.row_sparse_array(
                    (rows, w), shape=shape, dtype=dtype).copyto(o)

    # ------------------------------------------------------------ KVStoreBase API
    def init(self, key, value) -> None:
        """Initialise `key` with world rank 0's value, on the servers too (stored
        row_sparse there if `value` is row_sparse)."""
        keys, vals = [], []
        for k, values, _ in _group(key, value, None):
            keys.append(k)
            vals.append(self._spread_initial(k, values, values[0].stype == "row_sparse"))
        self._server_init(keys, vals)

    def _spread_initial(self, key, values: list, rsp_on_server: bool):
        """World rank 0's value into every array of `values`; returns the value
        to initialise the servers with: with `rsp_on_server` a row_sparse array
        holding every row (ps-lite's servers take a row_sparse initial value as
        all rows in order, and row_sparse pushes need a row_sparse stored value)."""
        _check_key(key)
        if values[0].stype == "row_sparse":
            dense = values[0].tostype("default")
            self._world_broadcast(key, dense)
            full = _full_rsp(dense)
            for v in values:
                full.copyto(v)
        else:
            self._checked(key, values, None, "broadcast")
            self._world_broadcast(key, values[0])
            self._fan_out(values[0], values[1:])
            full = _full_rsp(values[0]) if rsp_on_server else values[0]
        if rsp_on_server:
            self._rsp_keys.add(key)
        return full

    def _server_init(self, keys: list, values: list) -> None:
        """Initialise keys on the servers once: a second init of a key (another
        Trainer on this store) would reach a dist_sync server as a push (added
        to the weight) and kill a dist_async server without an updater. Every
        group runs the same program, so all groups skip the same keys."""
        fresh = [(k, v) for k, v in zip(keys, values) if k not in self._server_keys]
        self._server_keys.update(k for k, _ in fresh)
        if fresh and self._dist is not None:
            # One call: ps-lite's init ends with a barrier among its workers.
            self._dist.init([k for k, _ in fresh], [v for _, v in fresh])

    def broadcast(self, key, value, out, priority: int = 0) -> None:
        """World rank 0's `value` into `out` on every rank; also the servers'
        initial value of `key` (as MXNet's dist stores do)."""
        keys, vals = [], []
        for k, values, outs in _broadcast_groups(key, value, out):
            if outs[0] is not values[0]:
                values[0].copyto(outs[0])
            keys.append(k)
            vals.append(self._spread_initial(k, outs, outs[0].stype == "row_sparse"))
        self._server_init(keys, vals)

    def push(self, key, value, priority: int = 0) -> None:
        """Sum `value` over devices and the group; the owner pushes it to the servers."""
        for k, values, _ in _group(key, value, None):
            if values[0].stype == "row_sparse":
                self._push_row_sparse(k, values, priority)
            else:
                self._push_dense(k, values, priority)

    def pull(self, key, out=None, priority: int = 0, ignore_sparse: bool = True) -> None:
        """The servers' value of `key` into `out` (owner pulls, group broadcast)."""
        if out is None:
            raise MPIKVStoreError("pull needs `out`")
        for k, outs, _ in _group(key, out, None):
            _check_key(k)
            if outs[0].stype == "row_sparse":
                if ignore_sparse:
                    continue
                raise MPIKVStoreError("pull of row_sparse key %r: use row_sparse_pull" % (k,))
            self._pull_dense(k, outs, priority)

    def pushpull(self, key, value, out=None, priority: int = 0) -> None:
        """push() then pull(): with an optimizer on the servers `out` gets the new
        weight; without one (dist_sync only) the sum over all ranks."""
        self.push(key, value, priority)
        self.pull(key, value if out is None else out, priority)

    def set_optimizer(self, optimizer) -> None:
        """Send `optimizer` to the servers (once, from world rank 0); every rank
        waits until it is there, so no push can reach a server before it."""
        _check_optimizer(optimizer)
        self._optimizer = optimizer
        if self._world.rank == 0:
            self._dist.set_optimizer(optimizer)
        _world_sum(self._world, [1])   # barrier

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        raise MPIKVStoreError("optimizer states live on the parameter servers of kvstore "
                              "'%s'; like MXNet's dist stores it cannot save them" % self.type)

    def load_optimizer_states(self, fname: str) -> None:
        raise MPIKVStoreError("optimizer states live on the parameter servers of kvstore "
                              "'%s'; like MXNet's dist stores it cannot load them" % self.type)

    # ------------------------------------------------------------ Gluon glue
    def _workers_stream(self):
        """The world's: batch sizes are summed over every group's ranks."""
        return self._world_stream

    def sync_initial_params(self, params) -> None:
        """World rank 0's initial weights into every rank and the servers; deferred
        ones when their shapes are known (first forward)."""
        self.name_keys({idx: p.name for idx, p in enumerate(params)})
        keys, vals = [], []
        for idx, param in enumerate(params):
            if param._deferred_init:
                on_deferred_init(param, lambda arrays, idx=idx, param=param: self._server_init(
                    [idx], [self._spread_initial(idx, arrays, _is_sparse(param))]))
            else:
                keys.append(idx)
                with self.serving("Trainer init: broadcast of initial weights"):
                    vals.append(self._spread_initial(
                        idx, param._check_and_get(param._data, list), _is_sparse(param)))
        self._server_init(keys, vals)

    def allreduce_params(self, params, update_on_kvstore: bool, batch_size=None,
                         what: str | None = None):
        """Trainer's step, in phases that keep every MPI collective of the step
        ahead of the broadcasts waiting on the servers: dense group allreduces
        (last parameter first, as backprop makes them ready) and their pushes,
        then row_sparse gathers and pushes, then pulls and group broadcasts.
        With `batch_size` (local updates: the servers return sums), the batch
        sizes are summed over the world first; returns them."""
        agreed = self.batch_agreement(batch_size, what) if batch_size is not None else None
        with self.serving(what):
            self._allreduce_phases(params, update_on_kvstore)
        return agreed

    def _allreduce_phases(self, params, update_on_kvstore: bool) -> None:
        live = [(i, p) for i, p in enumerate(params) if p.grad_req != "null"]
        sparse = {i for i, p in live if _is_sparse(p)}
        if sparse and not update_on_kvstore:
            raise MPIKVStoreError("kvstore '%s' updates row_sparse parameters on the servers "
                                  "only: keep update_on_kvstore=True" % self.type)
        for i, p in reversed(live):
            if i not in sparse:
                self._push_dense(i, p.list_grad(), -i)
        for i, p in reversed(live):
            if i in sparse:
                self._push_row_sparse(i, p.list_grad(), -i)
        for i, p in reversed(live):
            if p._stype != "default":
                continue  # row_sparse weights: row_sparse_pull at the next forward
            outs = p.list_data() if update_on_kvstore else p.list_grad()
            self._pull_dense(i, outs, -i)


def _is_sparse(param) -> bool:
    """Whether a Gluon parameter's gradient or weight is row_sparse."""
    return param._grad_stype != "default" or param._stype != "default"


def _full_rsp(dense) -> mx.nd.NDArray:
    """A row_sparse array holding every row of `dense`."""
    rows = mx.nd.arange(dense.shape[0], dtype="int64", ctx=dense.context)
    return mx.nd.sparse.row_sparse_array((dense, rows), shape=dense.shape, ctx=dense.context,
                                         dtype=dense.dtype)


def _local_rsp_sum(values: list) -> tuple:
    """(sorted row ids, rows) of the sum of row_sparse arrays (this rank's devices)."""
    if len(values) == 1:
        v = values[0]
        ids = v.indices.asnumpy().astype(np.int64)
        data = v.data.asnumpy()
        if ids.size and np.all(ids[1:] > ids[:-1]):
            return ids, data
    parts = [(v.indices.asnumpy().astype(np.int64), v.data.asnumpy()) for v in values]
    ids = np.unique(np.concatenate([p[0] for p in parts]))
    data = np.zeros((ids.size,) + parts[0][1].shape[1:], dtype=parts[0][1].dtype)
    for pid, pdata in parts:
        np.add.at(data, np.searchsorted(ids, pid), pdata)
    return ids, data


def _rows_of(rsp, rows: np.ndarray, shape: tuple, dtype) -> mx.nd.NDArray:
    """Dense block of `rows` (sorted) of a row_sparse array (missing rows: zero)."""
    have = rsp.indices.asnumpy().astype(np.int64)
    data = rsp.data.asnumpy()
    block = np.zeros((rows.size,) + shape[1:], dtype=dtype)
    if have.size:
        pos = np.searchsorted(have, rows)
        ok = (pos < have.size) & (have[np.minimum(pos, have.size - 1)] == rows)
        block[ok] = data[pos[ok]]
    return mx.nd.array(block, dtype=dtype)


def _hybrid_class(dist_type: str) -> type:
    name = dist_type + "_mpi"
    return type(name, (HybridKVStore,), {
        "dist_type": dist_type,
        "__doc__": "MPI groups + MXNet's %s parameter server (``mx.kv.create('%s')``)."
                   % (dist_type, name),
        "__module__": __name__,
    })


def register_all() -> dict:
    """Register ``dist_sync_mpi`` and ``dist_async_mpi`` with MXNet."""
    classes = {t + "_mpi": _hybrid_class(t) for t in ("dist_sync", "dist_async")}
    for name, cls in classes.items():
        if KVStoreBase.kv_registry.get(name) is None:
            KVStoreBase.register(cls)
        else:
            classes[name] = KVStoreBase.kv_registry[name]
    return classes


STORES = register_all()

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
import os
import weakref

import mxnet as mx
from mxnet.kvstore import KVStoreBase

from . import _native
from .collectives import Stream
from .errors import MPIKVStoreError
from .hybrid_dense import DensePath
from .hybrid_routing import (
    GROUP_SIZE_ENV,
    LAUNCH_HINT,
    ROUTE_ENV,
    ROUTES,
    GroupRouting,
    expected_ps_workers,
    resolve_group_size,
    route_from_env,
    world_sum,
)
from .hybrid_sparse import SparsePath, is_sparse_param
from .keys import broadcast_groups, check_optimizer, key_groups
from .keys import check_key as _check_key
from .kvstore import MPIKVStore
from .mxnet_patches import create_inner_dist
from .optimizer_settings import describe
from .peer_wait import waiting_for_peers
from .pslite_client import ServerClient, close_at_exit, open_stores, server_flight
from .server_keys import ServerKeys
from .store_glue import on_deferred_init
from .world import init as init_world

# What other modules (the launcher) and users import from here.
__all__ = ["GROUP_SIZE_ENV", "LAUNCH_HINT", "ROUTES", "ROUTE_ENV", "STORES", "HybridKVStore",
           "expected_ps_workers", "register_all", "resolve_group_size", "route_from_env"]


class HybridKVStore(GroupRouting, ServerClient, DensePath, SparsePath, MPIKVStore):
    """MPI allreduce inside groups, MXNet's parameter server between groups.

    Created as ``mx.kv.create('dist_sync_mpi')`` / ``'dist_async_mpi'`` or by
    ``gluon.Trainer(..., kvstore='dist_sync_mpi')`` under the launcher
    (``python -m mxnet_mpi.launch``). ``rank``/``num_workers`` are those of
    the MPI world: shard the data over all ranks, as with ``mpi``.
    """

    dist_type = "dist_sync"          # MXNet store between groups (set by subclasses)
    supports_sparse = True           # row_sparse keys go through the server
    supports_join = False            # servers wait for every group's push each step
    _closed_before = False           # a hybrid store of this process was closed

    def __init__(self, mode: str | None = None, route: str | None = None,
                 ranks_per_group: int | None = None) -> None:
        """`route`: 'leader' or 'sharded' (default $MXNET_MPI_HYBRID_ROUTE);
        `ranks_per_group`: default $MXNET_MPI_GROUP_SIZE, else the ranks per
        host. Collective over the MPI world. One per process: ps-lite runs one
        worker per process (share the store, as with MXNet's dist stores)."""
        world = init_world()
        if open_stores:
            raise MPIKVStoreError(
                "a hybrid store is already open in this process; ps-lite allows one "
                "worker per process: reuse it (several trainers can share it, as with "
                "MXNet's dist stores)")
        if self._closed_before:
            # ps-lite's exit barrier ran at close(): the scheduler and servers end
            # once every worker has left, and a worker cannot join them again
            raise MPIKVStoreError(
                "a hybrid store was closed in this process, which left the parameter "
                "server for good (ps-lite lets a process join it once): keep one hybrid "
                "store open for the whole program")
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
        # the stream reduces over a duplicate of the group; the group itself
        # stays: kv.comm names it (for collectives over the store's group)
        super().__init__(mode, comm=group)
        self._world = world                  # initial weights come from world rank 0
        self._keys.own_keys = "the servers keep a key's first one for the whole job: use "
        self._world_stream = Stream(_native.EXEC_CHAINED, world, self.type + " (world)")
        self._is_ps_worker = self._route_name == "sharded" or self._comm.rank == 0
        self._dist = None
        self._gbuf: dict = {}                # key -> group-sum buffer (dense keys)
        self._rsp_keys: set = set()          # keys stored row_sparse on the servers
        self._all_rows: dict = {}            # key -> arange(rows), to pull a whole weight
        self._owners: dict = {}
        self._server_keys: set = set()       # keys initialised on the servers by this store
        self._ps_keys = ServerKeys(self.type)  # their ints on the servers
        self._ps_errors: dict = {}           # key -> a failed server push, raised at its pull
        self.routes: dict = {}               # key -> 'dense' or 'row_sparse' (introspection)
        self.stats: collections.Counter = collections.Counter()
        if self._is_ps_worker:
            # Blocks until the scheduler, every server and every ps worker are up:
            # a scheduler that is not there (a wrong address or port, fewer
            # servers or workers than it expects) kept it waiting for good, silently
            with waiting_for_peers(
                    "ps-lite's start-up (the scheduler at %s:%s, %s server(s), %s worker(s))"
                    % tuple(os.environ.get(v, "?") for v in (
                        "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
                        "DMLC_NUM_WORKER")),
                    "the scheduler, every server and every ps-lite worker must be up, with "
                    "the same DMLC_* settings (python -m mxnet_mpi.launch sets them)",
                    world.rank):
                self._dist = create_inner_dist(self.dist_type)
        open_stores.add(self)
        close_at_exit()

    def close(self) -> None:
        """Leave the parameter server (ps-lite's exit barrier among its workers)
        and free the MPI side. Called at the end of the program; idempotent."""
        if self._dist is not None:
            mx.nd.waitall()
            # ps::Finalize (run by the native store's destructor) is a barrier with
            # the scheduler and every group: a stopped scheduler or group is named
            # by the stall warning and aborts the job
            marker = mx.nd.zeros((1,))
            with server_flight(marker, "parameter-server exit barrier (group %d; waits "
                                "for the scheduler and every group)" % self._group_id):
                mx.nd.waitall()     # the flight has begun before the barrier blocks
                self._dist = None
            mx.nd.waitall()
        open_stores.discard(self)
        HybridKVStore._closed_before = True
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

    @staticmethod
    def is_capable(capability: str) -> bool:
        """The optimizer runs on the servers: Trainer uses update_on_kvstore."""
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return True
        raise MPIKVStoreError("unknown capability %r" % (capability,))

    # ------------------------------------------------------------ KVStoreBase API
    def init(self, key, value) -> None:
        """Initialise `key` with world rank 0's value, on the servers too (stored
        row_sparse there if `value` is row_sparse)."""
        keys, vals = [], []
        for k, values, _ in key_groups(key, value, None):
            keys.append(k)
            vals.append(self._spread_initial(k, values, values[0].stype == "row_sparse"))
        self._server_init(keys, vals)

    def broadcast(self, key, value, out, priority: int = 0) -> None:
        """World rank 0's `value` into `out` on every rank; also the servers'
        initial value of `key` (as MXNet's dist stores do)."""
        keys, vals = [], []
        for k, values, outs in broadcast_groups(key, value, out):
            if outs[0] is not values[0]:
                values[0].copyto(outs[0])
            keys.append(k)
            vals.append(self._spread_initial(k, outs, outs[0].stype == "row_sparse"))
        self._server_init(keys, vals)

    def push(self, key, value, priority: int = 0) -> None:
        """Sum `value` over devices and the group; the owner pushes it to the servers."""
        for k, values, _ in key_groups(key, value, None):
            if values[0].stype == "row_sparse":
                self._push_row_sparse(k, values, priority)
            else:
                self._push_dense(k, values, priority)

    def pull(self, key, out=None, priority: int = 0, ignore_sparse: bool = True) -> None:
        """The servers' value of `key` into `out` (owner pulls, group broadcast)."""
        if out is None:
            raise MPIKVStoreError("pull needs `out`")
        for k, outs, _ in key_groups(key, out, None):
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
        check_optimizer(optimizer)
        self._optimizer = optimizer
        self._optimizer_sent = describe(optimizer)
        if self._world.rank == 0:
            self._dist.set_optimizer(self._ps_keys.optimizer(optimizer))
        world_sum(self._world, [1])   # barrier

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        raise MPIKVStoreError("optimizer states live on the parameter servers of kvstore "
                              "'%s'; like MXNet's dist stores it cannot save them" % self.type)

    def load_optimizer_states(self, fname: str) -> None:
        raise MPIKVStoreError("optimizer states live on the parameter servers of kvstore "
                              "'%s'; like MXNet's dist stores it cannot load them" % self.type)

    # ------------------------------------------------------------ Gluon glue
    def recast(self, key) -> None:
        """The servers keep the dtype a key was initialised with: a parameter
        cast after the Trainer stays refused at its next use, named."""

    def _workers_stream(self):
        """The world's: batch sizes are summed over every group's ranks."""
        return self._world_stream

    def sync_initial_params(self, params) -> None:
        """World rank 0's initial weights into every rank and the servers; deferred
        ones when their shapes are known (first forward)."""
        self.name_keys({idx: p.name for idx, p in enumerate(params)})
        self.settle_deferred(params)
        # which parameter each key's weight on the servers is: the first
        # Trainer's (the servers keep it, also once that Trainer is gone), or
        # none where the store's own init put a value there first
        held = vars(self).setdefault("_mxmpi_held", {})
        for idx, param in enumerate(params):
            if idx not in held:
                held[idx] = (param.name, weakref.ref(param)) if idx not in self._server_keys \
                    else (None, lambda: None)
        keys, vals = [], []
        for idx, param in enumerate(params):
            if param._deferred_init:
                on_deferred_init(param, lambda arrays, idx=idx, param=param: self._server_init(
                    [idx], [self._spread_initial(idx, arrays, is_sparse_param(param))]))
            else:
                keys.append(idx)
                with self.serving("Trainer init: broadcast of initial weights"):
                    vals.append(self._spread_initial(
                        idx, param._check_and_get(param._data, list), is_sparse_param(param)))
        self._server_init(keys, vals)

    def allreduce_params(self, params, update_on_kvstore: bool, batch_size=None,
                         what: str | None = None, settings: str = "",
                         flags: int = 0, skip=frozenset(), owner: str = ""):
        """Trainer's step, in phases that keep every MPI collective of the step
        ahead of the broadcasts waiting on the servers: dense group allreduces
        (last parameter first, as backprop makes them ready) and their pushes,
        then row_sparse gathers and pushes, then pulls and group broadcasts.
        With `batch_size` (local updates: the servers return sums), the batch
        sizes are summed over the world first (the optimizer `settings`
        compared); returns them. `skip`: indices of parameters to leave out
        (fresh on no rank, ignore_stale_grad=True), the same on every rank.
        `owner`: which of the store's Trainers this is (owned_by)."""
        if not update_on_kvstore and self._optimizer is not None:
            # the servers would return updated weights where the Trainer reads sums
            raise MPIKVStoreError("kvstore '%s' already runs an optimizer on its servers "
                                  "(set_optimizer, or a Trainer with update_on_kvstore=True): "
                                  "a Trainer with update_on_kvstore=False needs a store whose "
                                  "servers only sum" % self.type)
        summed = vars(self).setdefault("_mxmpi_summed", set())
        if update_on_kvstore:
            self._check_servers_hold(params, summed)
        else:
            summed.update(range(len(params)))
        if update_on_kvstore and self._optimizer is not None:
            self._check_optimizer_unchanged()
        agreed = (self.batch_agreement(batch_size, what, settings, flags)
                  if batch_size is not None else None)
        with self.serving(what), self.owned_by(owner):
            self._allreduce_phases(params, update_on_kvstore, skip)
        return agreed

    def _check_servers_hold(self, params, summed: set) -> None:
        """The servers update the weights (update_on_kvstore=True): each key of
        `params` must hold its own parameter's weight there. A key keeps the
        first Trainer's parameter for the whole job (ps-lite: one store per
        process; a later init of a key is skipped), and after a local-update
        Trainer's steps it holds a sum of gradients: another parameter's
        Trainer would update and read that (its own initial weight never
        reaches the servers), silently."""
        held = vars(self).get("_mxmpi_held", {})
        for i, p in enumerate(params):
            name, ref = held.get(i, (p.name, lambda p=p: p))
            if ref() is not p or i in summed:
                raise MPIKVStoreError(
                    "kvstore '%s': key %d holds %s on the servers, which would update it as "
                    "parameter %r's weight (update_on_kvstore=True), though that "
                    "parameter's own initial weight never reaches them: a key keeps its "
                    "first Trainer's parameter for the whole job. Train this Trainer with "
                    "update_on_kvstore=False (the servers then only sum), or over the "
                    "parameters of the store's first Trainer" % (
                        self.type, i, "the sum of the gradients of local-update steps"
                        if ref() is p else "the value the store's own init (kv.init) gave "
                        "it" if name is None else "the weight of an earlier Trainer's "
                        "parameter %r%s" % (name, "" if ref() is not None else " (gone from "
                                            "this process; the servers keep it)"), p.name))

    def _check_optimizer_unchanged(self) -> None:
        """The servers run the optimizer as it was sent: a setting changed on the
        ranks since (Trainer.set_learning_rate) would be ignored without a word,
        as with MXNet's dist stores."""
        now = describe(self._optimizer)
        if now != self._optimizer_sent:
            raise MPIKVStoreError(
                "the optimizer's settings changed after they went to the parameter servers "
                "of kvstore '%s', which update the weights with the settings they were "
                "sent (was: %s; now: %s): change the learning rate with an lr_scheduler "
                "(it goes to the servers with the optimizer), or update on the ranks "
                "(Trainer(..., update_on_kvstore=False) or MXNET_UPDATE_ON_KVSTORE=0)"
                % (self.type, self._optimizer_sent, now))

    def _allreduce_phases(self, params, update_on_kvstore: bool, skip=frozenset()) -> None:
        live = [(i, p) for i, p in enumerate(params) if p.grad_req != "null" and i not in skip]
        sparse = {i for i, p in live if is_sparse_param(p)}
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

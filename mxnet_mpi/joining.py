"""join(): how ranks with uneven amounts of data finish together.

A rank that has run out of data calls join(). It then takes part in every
collective its peers still run (contributing zeros to sums, receiving
broadcasts), until every rank has joined. Ranks that joined early skipped
their optimizer updates for the peers' extra steps, so afterwards the
parameters and optimizer states of the rank that ran the most collectives
(the latest state) are copied to every rank: those of every Trainer created
on the store, and whatever params/updater the caller gives.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import warnings
import weakref

import mxnet as mx
import numpy as np

from . import _native
from .collectives import stream_for
from .deferred import settle_deferred
from .errors import MPIKVStoreError
from .module_states import ModuleStates, counts_by_index, set_counts


def _internal(store, op: int, arr, desc: str, root: int = 0, workers: bool = False) -> None:
    store.internal_collective(op, arr, desc, root, workers)


def issued_per_rank(store, issued: int) -> np.ndarray:
    """What every rank had issued on `store` before joining (`issued` here),
    indexed by rank."""
    table = store.rank_table(np.array([issued], dtype=np.int64),
                             "join: collectives issued per rank")
    counts = np.zeros((store.num_workers,), dtype=np.int64)
    counts[table.ranks] = table.rows[:, 0]
    return counts


def _items(params) -> list:
    """(name, parameter or arrays) of `params`, in the order every rank has."""
    if isinstance(params, mx.gluon.ParameterDict):
        return list(params.items())
    if hasattr(params, "items"):
        return sorted(params.items(), key=lambda kv: kv[0])
    return [(p.name, p) for p in params]


def finish_deferred(store, params) -> None:
    """A rank that ran no forward pass (no batch at all) holds Gluon parameters
    still waiting for deferred initialisation: they take the shapes of a rank
    that has them (store_glue.settle_deferred, collective) and are
    initialised, so that every rank then copies the same parameters."""
    settle_deferred([p for _, p in _items(params) if isinstance(p, mx.gluon.Parameter)],
                    lambda row, desc: store.rank_table(row, "join: " + desc))


def _param_arrays(params) -> list:
    """[(name, [arrays of every device])] of Gluon parameters, or of a dict
    name -> NDArray (or list of the NDArrays of every device), in an order
    that is the same on every rank: a ParameterDict's or a list's own (Gluon
    may name a parameter differently on two ranks), a dict's sorted names."""
    out = []
    for name, p in _items(params):
        if isinstance(p, mx.nd.NDArray):
            out.append((name, [p]))
        elif isinstance(p, (list, tuple)) and p and all(isinstance(a, mx.nd.NDArray) for a in p):
            out.append((name, list(p)))
        elif hasattr(p, "list_data"):
            if p._data is None:
                continue  # deferred, never initialised: nothing to copy
            out.append((name, p.list_data()))
        else:
            raise MPIKVStoreError("join(params=...) takes Gluon parameters or a dict of "
                                  "NDArrays, got %s for %r" % (type(p).__name__, name))
    return out


def broadcast_from(store, root: int, params, why: str = "join", workers: bool = False) -> None:
    """Copy `params` from rank `root` to every rank of `store` (with
    `workers`, of every worker: the whole world for a hybrid store)."""
    named = _param_arrays(params)
    for i, (_, arrays) in enumerate(named):
        first = arrays[0]
        host = first if first.context.device_type == "cpu" else first.as_in_context(mx.cpu())
        # the position, not the name: ranks may name a parameter differently
        _internal(store, _native.BROADCAST, host, "%s: parameter %d of %d" % (why, i, len(named)),
                  root, workers)
        for a in arrays:
            if a is not host:
                host.copyto(a)


def _updaters(updater) -> list:
    if updater is None:
        return []
    if isinstance(updater, mx.gluon.Trainer):
        # a Trainer on our stores updates locally, with updaters it made when it
        # was created (a rank with no batch at all has stepped it never)
        return list(updater._updaters)
    if hasattr(updater, "get_states") and hasattr(updater, "set_states"):
        return [updater]
    raise MPIKVStoreError("join(updater=...) takes an optimizer updater or a gluon.Trainer, got "
                          "%s" % type(updater).__name__)


def _broadcast_bytes(store, root: int, make, why: str, workers: bool = False) -> bytes | None:
    """`make()`, called on rank `root`, to every rank of `store` (with
    `workers`, to every worker: the whole world for a hybrid store); None on
    the root itself."""
    mine = (store._workers_stream().comm.rank if workers else store.rank) == root
    blob = make() if mine else b""
    size = mx.nd.array([len(blob)], dtype="int64")
    _internal(store, _native.BROADCAST, size, why + ": optimizer state size", root, workers)
    buf = mx.nd.array(np.frombuffer(blob, dtype=np.uint8) if mine
                      else np.zeros(int(size.asscalar()), dtype=np.uint8), dtype="uint8")
    _internal(store, _native.BROADCAST, buf, why + ": optimizer states", root, workers)
    return None if mine else buf.asnumpy().tobytes()


def broadcast_states(store, root: int, updater) -> None:
    """Copy an optimizer updater's states and its optimizer (with its counters)
    from rank `root`: join(updater=...)'s, or a store's own (set_optimizer).
    A Trainer's or Module's: broadcast_state_values."""
    ups = _updaters(updater)
    if not ups:
        return
    states = _broadcast_bytes(store, root, lambda: ups[0].get_states(dump_optimizer=True),
                              "join")
    if states is None:
        return
    for up in ups:
        up.set_states(states)


def _counts(updater) -> dict:
    """The optimizer's update count of each parameter (Module: by parameter)."""
    if isinstance(updater, ModuleStates):
        return updater.counts()
    return counts_by_index(updater._optimizer)


def _take_counts(updater, counts: dict) -> None:
    if isinstance(updater, ModuleStates):
        updater.take_counts(counts)
    else:
        set_counts(updater._optimizer, [c.device_id for c in updater._contexts],
                   lambda _k: dict(counts))


# What stays this rank's own in its optimizer when the root's values come in:
# the objects a program may hold, this rank's numbering, and the count tables
# (by this rank's devices: _take_counts)
_OWN = frozenset(("lr_scheduler", "param_dict", "idx2name", "_all_index_update_counts",
                  "_index_update_count"))


def _take_values(opt, root_opt) -> None:
    """The root's optimizer values (settings, num_update, and what an optimizer
    advances as it updates, e.g. Nadam's m_schedule) into this rank's `opt`."""
    opt.__dict__.update({k: v for k, v in vars(root_opt).items() if k not in _OWN})
    mine, theirs = opt.lr_scheduler, root_opt.lr_scheduler
    if mine is not None and type(mine) is type(theirs):
        mine.__dict__.update(vars(theirs))   # its progress, in the program's object


def broadcast_state_values(store, root: int, updater, why: str,
                           workers: bool = False) -> None:
    """Copy the optimizer states of a Trainer or Module (ModuleStates) from
    rank `root`, with its update counts and values, into this rank's own
    optimizer: the objects stay the program's (it may hold the optimizer or
    its lr_scheduler and change them later, on every rank; the ranks compare
    the settings at each step), where broadcast_states puts in the root's copy."""
    ups = _updaters(updater)
    if not ups:
        return
    opt = ups[0].optimizer
    data = _broadcast_bytes(store, root, lambda: pickle.dumps(
        (ups[0].get_states(dump_optimizer=False), _counts(updater), opt)), why, workers)
    if data is None:
        return
    states, counts, root_opt = pickle.loads(data)
    for up in ups:
        up.set_states(states)   # the states alone: the optimizer object stays
    _take_values(opt, root_opt)
    _take_counts(updater, counts)


_free = {"thread": None, "error": None}
_free_lock = threading.Lock()


@contextlib.contextmanager
def _free_functions_joined(store):
    """Around a join of a store over the whole world: join the free functions'
    store (mxnet_mpi.allreduce_ and friends) too, so that a peer still
    training that logs a metric with them is served (zeros from this rank)
    rather than left waiting for the stall abort. Every join round of every
    rank does it, once however many stores that round joins."""
    free = stream_for(None)
    with _free_lock:
        owner = (store.stream.comm.size == free.comm.size > 1
                 and _free["thread"] is None)
        if owner:
            def run() -> None:
                try:
                    free.join()
                except Exception as exc:  # noqa: BLE001  (re-raised by the owner)
                    _free["error"] = exc
            _free["error"] = None
            _free["thread"] = threading.Thread(target=run, daemon=True,
                                               name="mxnet_mpi join (free functions)")
            _free["thread"].start()
    try:
        yield
    finally:
        if owner:
            _free["thread"].join()
            with _free_lock:
                _free["thread"], error = None, _free["error"]
            if error is not None:
                raise error


def join_store(store, params=None, updater=None, own=None, issued=None) -> int:
    """See MPIKVStore.join. `own`: (the store's stored values as a dict, its
    updater) where it updates with an optimizer of its own (set_optimizer).
    `issued`: what wait_joined returned, where the caller waited already."""
    if issued is None:
        issued = wait_joined(store)
    counts = issued_per_rank(store, issued)
    root = int(np.argmax(counts))  # the latest state; the lowest such rank
    if counts.min() != counts.max():  # some rank skipped updates: copy the latest
        for trainer in attached(store):
            if trainer is not updater:
                finish_deferred(store, trainer._params)
                broadcast_from(store, root, trainer._params, "join: Trainer")
                broadcast_state_values(store, root, trainer, "join: Trainer")
        shared = getattr(updater, "_updater", None)
        for module in attached_modules(store):
            # the module the caller's updater serves, or one sharing its
            # updater (a BucketingModule's buckets): brought up to date below
            if getattr(updater, "_module", None) is not module and (
                    shared is None or shared is not getattr(module, "_updater", None)):
                broadcast_from(store, root, module_arrays(module), "join: Module")
                module._params_dirty = True   # get_params reads the arrays again
                if getattr(module, "_updater", None) is not None:
                    broadcast_state_values(store, root, ModuleStates(module), "join: Module")
        if params is not None:
            finish_deferred(store, params)
            broadcast_from(store, root, params)
        if isinstance(updater, (mx.gluon.Trainer, ModuleStates)):
            broadcast_state_values(store, root, updater, "join")
        elif updater is not None:
            broadcast_states(store, root, updater)
        if own is not None:
            broadcast_from(store, root, own[0], "join: stored value")
            broadcast_states(store, root, own[1])
    # each rank counted its own updates towards the periodic consistency
    # check; a rank that joined early counted fewer: start them afresh alike
    for user in attached(store) + attached_modules(store):
        check = getattr(user, "_mxmpi_check", None)
        if check is not None:
            check.count = 0
    mx.nd.waitall()
    return root


def wait_joined(store) -> int:
    """The first half of a join: take part in the others' collectives until
    every rank has joined `store`; returns what this rank had issued on it."""
    issued = store.stream.info()[0]
    if store.stream.comm.rank == 0 and any(
            p._data is None and p._deferred_init for t in attached(store) for p in t._params):
        # the others' first forward broadcasts these from rank 0, which a
        # joined rank cannot source: their error names only the joined root
        warnings.warn("mxnet_mpi: rank 0 joins before its first forward pass, with parameters "
                      "still waiting for deferred initialisation; the other ranks take their "
                      "initial values from rank 0 at their first forward, which then fails. "
                      "Give the layers their input sizes (e.g. Dense(..., in_units=...)) or "
                      "run one forward pass on every rank before training", RuntimeWarning,
                      stacklevel=4)
    with _free_functions_joined(store):
        store.stream.join()
    return issued


_stores: weakref.WeakSet = weakref.WeakSet()
_trainers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # store -> [weakref]
_modules: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()    # store -> [weakref]
_outside: weakref.WeakSet = weakref.WeakSet()   # trainers that reduce outside any store
_attached: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # store -> how many


def attach(store, trainer, module: bool = False) -> str:
    """Remember that `trainer` (with `module`, a Module: init_optimizer)
    updates through `store`: join() on the store brings its parameters and
    optimizer states up to date too (for a Module, a loop of one's own around
    Module.update; Module.fit joins by itself). Returns its owner text for
    store_glue.owned_by: "" for the store's first Trainer or Module, else its
    place in the order they were attached (the same on every rank)."""
    refs = (_modules if module else _trainers).setdefault(store, [])
    if not any(r() is trainer for r in refs):
        refs.append(weakref.ref(trainer))
        _attached[store] = _attached.get(store, 0) + 1
        trainer._mxmpi_owner = "" if _attached[store] == 1 else (
            " for the store's %s %d (of its Trainers and Modules, in the order they were "
            "made)" % ("Module" if module else "Trainer", _attached[store]))
    return getattr(trainer, "_mxmpi_owner", "")


def attached_modules(store) -> list:
    """The live Modules on `store`, in the order they were attached."""
    return [m for m in (r() for r in _modules.get(store, [])) if m is not None]


def module_arrays(module) -> dict:
    """A Module's weights: name -> the arrays of every device."""
    group = module._exec_group
    return {name: list(arrays) for name, arrays in zip(group.param_names, group.param_arrays)}


def attached(store) -> list:
    """The live Trainers created on `store`, in the order they were created
    (the same on every rank)."""
    return [t for t in (r() for r in _trainers.get(store, [])) if t is not None]


def note_outside(trainer) -> None:
    """Remember a trainer that reduces outside any store (mxnet_mpi.horovod's
    DistributedTrainer): join() with no argument cannot cover it and says so."""
    _outside.add(trainer)


def register(store) -> None:
    """Remember an open store, for join() with no argument."""
    _stores.add(store)


def open_stores() -> list:
    """Every store of this process that is still open."""
    return [s for s in list(_stores) if not s.closed]


_HOROVOD_JOIN = ("; mxnet_mpi.horovod.DistributedTrainer reduces outside any store, so "
                 "uneven data with it cannot be joined: give every rank the same number of "
                 "batches, or use gluon.Trainer(..., kvstore='mpi') with the horovod "
                 "functions")


def join(target=None) -> int:
    """This rank has run out of data (uneven shards): call join() and it keeps
    taking part in what the other ranks still run, until all have joined.

    `target`: a ``gluon.Trainer`` on one of our stores (its parameters and
    optimizer states are then copied from the rank that ran the most steps),
    a store, or None for every open store at once. Returns the rank whose
    state is the latest."""
    if isinstance(target, mx.gluon.Trainer):
        # the store exists from the Trainer's creation on (mxnet_patches), though
        # MXNet sets _kvstore only at the first step: a rank may have no batch
        store = target._kvstore or target._kvstore_params.get("kvstore")
        if store is None or not hasattr(store, "join"):
            name = getattr(store, "type", store)
            raise MPIKVStoreError(
                "join(trainer): the trainer's kvstore is %r, not one of mxnet_mpi's stores "
                "(create the Trainer with kvstore='mpi')%s"
                % (name, _HOROVOD_JOIN if hasattr(target, "_process_set") else ""))
        attach(store, target)
        return store.join()
    if target is not None:
        return target.join()
    stores = [s for s in open_stores() if s.supports_join]
    if not stores and len(_outside):
        # nothing to join here, and the peers still stepping such a trainer
        # will wait for this rank (their error then asks for join())
        warnings.warn("mxnet_mpi.join(): no mxnet_mpi store is open on this rank, so there "
                      "is nothing to join" + _HOROVOD_JOIN, RuntimeWarning, stacklevel=2)
    if not stores:
        return 0
    if len(stores) == 1:
        return stores[0].join()
    # Several stores: wait for every rank to join them at once, or a peer
    # still using one would wait on this rank while it waits in another's
    # join. What follows (the copies from the latest rank) runs here, store
    # by store in creation order: from those threads their collectives met
    # the chained stores' one process-wide chain in a different order on
    # each rank.
    stores.sort(key=lambda s: s.stream.id)
    chained = [s.type for s in stores if getattr(s, "mode", None) == "chained"]
    if len(chained) > 1:
        # their collectives and joins share one process-wide chain, whose order
        # the concurrent joins would make differ between ranks: the job hung
        raise MPIKVStoreError(
            "mxnet_mpi.join(): %d stores in mode 'chained' cannot be joined together: their "
            "collectives share one chain in program order. Create them as 'mpi_funneled' or "
            "'mpi_concurrent' (for kvstore='mpi': MXNET_MPI_MODE=funneled), keep one chained "
            "store, or, where every rank has the same number of batches, do not call join()"
            % len(chained))
    issued: dict = {}

    def run(s):
        try:
            issued[id(s)] = wait_joined(s)
        except Exception as exc:  # noqa: BLE001  (re-raised below)
            issued[id(s)] = exc

    threads = [threading.Thread(target=run, args=(s,)) for s in stores]
    # The free functions' store is joined once for all of them, held over every
    # thread: per store, a thread that started late found the first one's join
    # of it over and joined it again, a round more than on other ranks (hang).
    world = stream_for(None).comm.size
    spanning = next((s for s in stores if s.stream.comm.size == world), None)
    with (_free_functions_joined(spanning) if spanning is not None
          else contextlib.nullcontext()):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for r in issued.values():
        if isinstance(r, Exception):
            raise r
    return min(s.join(issued=issued[id(s)]) for s in stores)

"""``mxnet_mpi.horovod``'s job state: ``init``, the queries (``rank()``,
``size()``, ...) and the process sets, each registered set with its MPI
sub-communicator and its own funneled stream."""

from __future__ import annotations

import collections
import numbers
import os

import mxnet as mx

from . import ops
from .collectives import stream_for
from .errors import MPIKVStoreError
from .modes import create_stream
from .world import THREAD_MULTIPLE, thread_level
from .world import finalized as _world_finalized
from .world import init as _init_world
from .world import local_rank as _local_rank
from .world import local_size as _local_size

_NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


class _Set:
    """A registered process set: its ranks and, on a member, the communicator
    and stream its collectives run on (what ``ops``' ``store=`` takes)."""

    def __init__(self, ranks: tuple, comm, stream) -> None:
        self.ranks = ranks
        self.comm = comm
        self.stream = stream


class _State:
    def __init__(self) -> None:
        self.initialized = False
        self.cross = (0, 1)              # (cross_rank, cross_size)
        self.homogeneous = True
        self.sets: dict = {}             # process_set_id -> _Set (0, the world, not in it)
        self.free_ids: collections.deque = collections.deque()
        self.next_id = 1
        self.timeline_path: str | None = None
        self.timeline_hooked = False


_state = _State()


def _require_init() -> None:
    if not _state.initialized:
        if _world_finalized():
            raise ValueError("Horovod was shut down (hvd.shutdown()) in this process, which "
                             "finalised MPI: it cannot start again here")
        raise ValueError(_NOT_INITIALIZED)


# ---------------------------------------------------------------- process sets
class ProcessSet:
    """A set of ranks that run collectives together: pass it to
    ``hvd.init(process_sets=[...])`` or ``hvd.add_process_set`` (on every
    rank), then as ``process_set=`` to collectives, DistributedTrainer and
    DistributedOptimizer. Ranks are world ranks, kept sorted."""

    process_set_id: int | None = None
    ranks: list | None = None
    mpi_comm = None

    def __init__(self, ranks_or_comm) -> None:
        if type(ranks_or_comm).__module__.startswith("mpi4py"):
            raise NotImplementedError(
                "mxnet_mpi.horovod builds process sets from world ranks only: use "
                "hvd.ProcessSet(ranks) with the world ranks of the communicator's members")
        try:
            ranks = list(ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet should be initialized with a list of process ranks, "
                             "got %s" % type(ranks_or_comm).__name__) from None
        if any(isinstance(r, bool) or not isinstance(r, numbers.Integral) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks "
                             "(integers), got %r" % (ranks,))
        self.ranks = sorted(int(r) for r in ranks)

    def _invalidate(self) -> None:
        self.process_set_id = None

    def size(self) -> int | None:
        """Number of ranks in the set (None if it is not registered)."""
        if self.process_set_id is None:
            return None
        return _entry(self.process_set_id)[0]

    def rank(self) -> int | None:
        """This process's rank within the set (None if it is not registered).
        Collectives still take world ranks (e.g. broadcast's root_rank)."""
        if self.process_set_id is None:
            return None
        set_rank = _entry(self.process_set_id)[1]
        if set_rank is None:
            raise ValueError("Process is not part of provided process set.")
        return set_rank

    def included(self) -> bool | None:
        """Whether this process belongs to the set (None without ranks)."""
        if self.ranks is None:
            return None
        return rank() in self.ranks

    def __str__(self) -> str:
        return "ProcessSet(process_set_id=%s, ranks=%s, mpi_comm=%s)" % (
            self.process_set_id, self.ranks, self.mpi_comm)

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def _entry(process_set_id: int) -> tuple:
    """(size, this rank in the set or None) of a registered set."""
    _require_init()
    if process_set_id == 0:
        world = _init_world()
        return world.size, world.rank
    entry = _state.sets.get(process_set_id)
    if entry is None:
        raise ValueError("Process set does not exist or has not been registered.")
    return len(entry.ranks), entry.comm.rank if entry.comm is not None else None


def _agree(what: str, error: BaseException | None = None) -> None:
    """A world collective in which every rank states `what` it does (the ranks
    compare it): ranks that disagree fail on every rank. A rank with a local
    `error` refuses it instead, so its peers fail naming it (no hang)."""
    if error is not None:
        ops.refuse("%s: %s" % (what, error))
        raise error
    flag = mx.nd.zeros((1,), dtype="int32")
    ops.allreduce_(flag, name=what)
    flag.asnumpy()


def _new_ranks(ps: ProcessSet) -> tuple:
    """The ranks of a set about to be registered, checked."""
    world = _init_world()
    ranks = list(ps.ranks)
    if not ranks:
        raise ValueError("a process set needs at least one rank (the global set is "
                         "hvd.global_process_set)")
    dup = [r for r in set(ranks) if ranks.count(r) > 1]
    if dup:
        raise ValueError("Tried to register process set with duplicate rank: %d" % dup[0])
    bad = [r for r in ranks if not 0 <= r < world.size]
    if bad:
        raise ValueError("Tried to register process set with invalid rank: %d (the world has "
                         "%d ranks)" % (bad[0], world.size))
    if ranks == list(range(world.size)) or any(list(e.ranks) == ranks
                                               for e in _state.sets.values()):
        raise ValueError("Attempted to add a duplicate process set: %s" % ps)
    return tuple(ranks)


def _register(ranks: tuple) -> int:
    """Collective over the world: the set's communicator (split) and, on its
    members, its stream (collective over them, right away, so every member
    makes it at the same point of its program)."""
    world = _init_world()
    member = world.rank in ranks
    comm = world.split(0 if member else -1, key=world.rank)
    set_id = _state.free_ids.popleft() if _state.free_ids else _state.next_id
    if set_id == _state.next_id:
        _state.next_id += 1
    stream = create_stream("funneled", comm, "hvd process set %d %s" % (set_id, list(ranks))
                           ) if member else None
    _state.sets[set_id] = _Set(ranks, comm, stream)
    return set_id


def _unregister(set_id: int) -> None:
    entry = _state.sets.pop(set_id)
    if entry.stream is not None:
        entry.stream.close()   # its threads and communicator go once nothing is pending
    if entry.comm is not None:
        entry.comm.free()
    _state.free_ids.append(set_id)


def add_process_set(process_set) -> ProcessSet:
    """Register a process set (a ProcessSet or a list of world ranks) after
    init and return it; collective: every rank calls it with the same ranks.
    (Horovod needs HOROVOD_DYNAMIC_PROCESS_SETS=1 for this; mxnet_mpi does not.)"""
    _require_init()
    ranks, error = None, None
    try:
        ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
        ranks = _new_ranks(ps)
    except (ValueError, TypeError, NotImplementedError) as exc:
        error = exc
    _agree("hvd.add_process_set ranks=%s" % (list(ranks) if ranks else "?"), error)
    ps.process_set_id = _register(ranks)
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (collective: every rank calls it); returns
    whether it was removed. The global set is never removed."""
    _require_init()
    if not isinstance(process_set, ProcessSet):
        raise ValueError("remove_process_set takes an hvd.ProcessSet, got %s"
                         % type(process_set).__name__)
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0:
        return False
    entry = _state.sets.get(set_id)
    known = entry is not None and list(entry.ranks) == list(process_set.ranks or [])
    _agree("hvd.remove_process_set id=%d ranks=%s" % (set_id, process_set.ranks))
    process_set._invalidate()
    if known:
        _unregister(set_id)
    return known


def _where(process_set, what: str) -> _Set | None:
    """Where a collective on `process_set` runs: None for the global set (the
    world's stream), else the registered set this rank belongs to."""
    _require_init()
    if process_set is None or process_set is global_process_set:
        return None
    if not isinstance(process_set, ProcessSet):
        raise MPIKVStoreError("hvd.%s: process_set must be an hvd.ProcessSet, got %s"
                              % (what, type(process_set).__name__))
    if process_set.process_set_id == 0:
        return None
    entry = _state.sets.get(process_set.process_set_id)
    if entry is None or list(entry.ranks) != list(process_set.ranks or []):
        raise MPIKVStoreError(
            "hvd.%s: %s is not a registered process set (register it with "
            "hvd.init(process_sets=[...]) or hvd.add_process_set() on every rank; a removed "
            "set cannot be used)" % (what, process_set))
    if entry.stream is None:
        raise MPIKVStoreError("hvd.%s: rank %d is not a member of the provided process set %s"
                              % (what, rank(), process_set))
    return entry


def _stream_of(process_set, what: str):
    """The stream of `process_set`'s collectives (this rank must be a member)."""
    entry = _where(process_set, what)
    return stream_for(None) if entry is None else entry.stream


def _root_in(entry: _Set | None, root_rank, what: str) -> int:
    """A broadcast's root, a world rank as in Horovod, as a rank of the set."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, numbers.Integral):
        raise MPIKVStoreError("hvd.%s: root_rank must be an integer (a world rank), got %s"
                              % (what, type(root_rank).__name__))
    if entry is None:
        return int(root_rank)
    if root_rank not in entry.ranks:
        raise MPIKVStoreError("hvd.%s: root_rank %d is not a member of the process set (ranks "
                              "%s)" % (what, root_rank, list(entry.ranks)))
    return entry.ranks.index(root_rank)


# ---------------------------------------------------------------- init and queries
def _check_comm(comm, world) -> None:
    if comm is None:
        return
    if type(comm).__module__.startswith("mpi4py"):
        from mpi4py import MPI
        if MPI.Comm.Compare(comm, MPI.COMM_WORLD) in (MPI.IDENT, MPI.CONGRUENT):
            return
        raise NotImplementedError(
            "mxnet_mpi.horovod runs on the whole MPI world: hvd.init(comm=...) with a "
            "communicator of %d of the %d ranks is not supported; launch only those ranks, or "
            "use a process set" % (comm.Get_size(), world.size))
    try:
        ranks = sorted(int(r) for r in comm)
    except (TypeError, ValueError):
        raise ValueError("Invalid type of argument comm. Expected list of rank integers or "
                         "mpi4py.MPI.Comm object.") from None
    if ranks != list(range(world.size)):
        raise NotImplementedError(
            "mxnet_mpi.horovod runs on the whole MPI world: hvd.init(comm=%s) is not the list "
            "of all %d ranks; launch only the ranks you need, or use a process set "
            "(hvd.init(process_sets=[hvd.ProcessSet(ranks)]))" % (list(comm), world.size))


def _topology(world) -> tuple:
    """(cross_rank, cross_size), is_homogeneous: collective over the world."""
    cross = world.split(_local_rank(), key=world.rank)
    cross_rank, cross_size = cross.rank, cross.size
    cross.free()
    sizes = ops.allgather(mx.nd.array([_local_size()], dtype="int64"),
                          name="hvd.init local sizes").asnumpy()
    return (cross_rank, cross_size), bool((sizes == sizes[0]).all())


def init(comm=None, process_sets=None) -> None:
    """Start MPI and Horovod's state; collective (every rank calls it, with the
    same `process_sets`). `comm`: None, or the whole world (a list of all ranks
    or an mpi4py communicator congruent to COMM_WORLD). `process_sets`: a list
    of hvd.ProcessSet to register, or "dynamic" (accepted; add_process_set
    works either way)."""
    if isinstance(process_sets, str) and process_sets.lower() == "dynamic":
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
        process_sets = []
    world = _init_world()
    if _state.initialized and not process_sets:
        _check_comm(comm, world)
        return
    error, want, sets = None, [], []
    try:
        _check_comm(comm, world)
        if process_sets is not None and not isinstance(process_sets, (list, tuple)):
            raise ValueError("process_sets takes a list of hvd.ProcessSet (or \"dynamic\"), "
                             "got %s" % type(process_sets).__name__)
        sets = list(process_sets or [])
        for i, ps in enumerate(sets):
            if not isinstance(ps, ProcessSet):
                raise ValueError("process_sets entry number %d is not an hvd.ProcessSet: %r"
                                 % (i, ps))
            ranks = _new_ranks(ps)
            if ranks in want:
                raise ValueError("Horovod could not be initialized because process_sets entry "
                                 "number %d is a duplicate: %s" % (i, ps))
            want.append(ranks)
    except (ValueError, NotImplementedError) as exc:
        error = exc
    if not _state.initialized:
        _state.cross, _state.homogeneous = _topology(world)
    _agree("hvd.init process_sets=%s" % [list(r) for r in want], error)
    for ps, ranks in zip(sets, want):
        ps.process_set_id = _register(ranks)
    global_process_set.ranks = list(range(world.size))
    _state.initialized = True


def is_initialized() -> bool:
    return _state.initialized


def size() -> int:
    """Number of processes (the world's)."""
    _require_init()
    return _init_world().size


def rank() -> int:
    """This process's rank in the world."""
    _require_init()
    return _init_world().rank


def local_size() -> int:
    """Number of processes on this host."""
    _require_init()
    return _local_size()


def local_rank() -> int:
    """Rank among the processes on this host (pick the GPU with it)."""
    _require_init()
    return _local_rank()


def cross_size() -> int:
    """Number of hosts that have a process of this local rank."""
    _require_init()
    return _state.cross[1]


def cross_rank() -> int:
    """Rank of this host among the hosts that have a process of this local rank."""
    _require_init()
    return _state.cross[0]


def is_homogeneous() -> bool:
    """Whether every host runs the same number of processes."""
    _require_init()
    return _state.homogeneous


def mpi_threads_supported() -> bool:
    """Whether MPI provides MPI_THREAD_MULTIPLE."""
    _require_init()
    return thread_level() >= THREAD_MULTIPLE


def mpi_enabled() -> bool:
    """Whether MPI is in use (once init() ran): it is mxnet_mpi's only transport."""
    return _state.initialized


def mpi_built() -> bool:
    return True


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def nccl_built() -> int:
    """0: no NCCL (Horovod returns NCCL's version code when built with it)."""
    return 0


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    """False: no CUDA-aware build; GPU arrays are staged through host memory."""
    return False


def rocm_built() -> bool:
    return False


def split_list(l, n: int) -> list:  # noqa: E741  (Horovod's parameter names)
    """`l` in `n` chunks of nearly equal length (the first ones longer)."""
    d, r = divmod(len(l), n)
    return [l[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(n)]

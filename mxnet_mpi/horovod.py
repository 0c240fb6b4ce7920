"""``import mxnet_mpi.horovod as hvd``: the public API of ``horovod.mxnet``
0.28.1 on mxnet_mpi's engine-embedded collectives.

A script written for Horovod runs with only its import line changed, under
plain ``mpirun``. Semantics follow Horovod's: ``allreduce`` **averages** by
default (``op=hvd.Sum`` sums; ``hvd.Min``, ``hvd.Max``, ``hvd.Product``);
``DistributedTrainer`` and ``DistributedOptimizer`` sum gradients and divide
by the process set's size through the optimizer's rescaling; ``rank()`` and
the other queries raise ValueError before ``init()``; ``alltoall`` with
``splits`` returns (tensor, received splits).

Collectives on the global process set run on the world, in the free
functions' (chained) stream. Every other process set has an MPI
sub-communicator of its ranks and a funneled stream of its own (made when the
set is registered, collectively over the world), so collectives of different
sets never wait for each other's order. What deliberately differs is listed in
docs/horovod.md: Adasum, ``init(comm=...)`` with less than the whole world,
process sets made from mpi4py communicators, cycle marks in the timeline.
"""

from __future__ import annotations

import collections
import numbers
import os
import pickle
import types
import warnings
from collections import OrderedDict

import mxnet as mx
import numpy as np

from . import joining, ops, timeline
from .batch_sizes import BatchSizes, SettingsComparison, step_flags
from .collectives import allreduce_in_place, check_array, rank_table, stream_for
from .consistency import check_trainer_after_writes
from .deferred import settle_deferred
from .errors import MPIKVStoreError
from .modes import create_stream
from .mxnet_patches import NOT_APPLIED, WRITES_DESC, written
from .optimizer_settings import describe
from .param_order import agreed_order
from .stale_grads import COUNTS_DESC, FreshCounts, stale_gradient, zero_stale
from .store_calls import fan_out, sum_over_devices
from .world import THREAD_MULTIPLE, finalize, on_exit, thread_level
from .world import init as _init_world
from .world import local_rank as _local_rank
from .world import local_size as _local_size

try:  # Horovod pickles with cloudpickle (lambdas, local classes); plain pickle otherwise
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the environment
    _pickler = pickle

# Reduction ops, with Horovod's values (horovod/common/message.h).
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5
#: DistributedOptimizer compares the ranks' optimizer settings at most once
#: per this many updates (each comparison read at the next).
SETTINGS_UPDATES = 64
_OP_NAMES = {Average: "average", Sum: "sum", Min: "min", Max: "max", Product: "product"}
_OPS_BY_NAME = {name: value for value, name in _OP_NAMES.items()}

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


def shutdown() -> None:
    """End this rank's part in the job: writes a running timeline, finalises
    MPI (init() cannot follow)."""
    if _state.timeline_path is not None:
        stop_timeline()
    finalize()
    _state.__init__()
    global_process_set.ranks = []


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


# ---------------------------------------------------------------- timeline
def _write_timeline() -> None:
    me = rank()
    path = _state.timeline_path
    # Horovod's file for rank 0, the others beside it (and every rank's in a directory)
    own = me == 0 and not timeline.names_directory(path)
    timeline.write(path if own else timeline.rank_path(path, me), me)


def _timeline_at_exit() -> None:
    if _state.timeline_path is not None:
        _write_timeline()


def start_timeline(file_path, mark_cycles: bool = False) -> None:
    """Record every collective of this process from now on: rank 0 writes
    `file_path`, rank r > 0 ``<stem>.rank<r>.<suffix>`` beside it (a
    directory: each rank ``trace.rank<r>.json`` in it), at stop_timeline() (or
    at exit). Starting again switches files."""
    _require_init()
    if timeline.requested():
        raise ValueError("the timeline already records for %s=%s (from MPI initialisation to "
                         "exit); unset it to use hvd.start_timeline"
                         % (timeline.ENV_VAR, timeline.requested()))
    if not isinstance(file_path, (str, os.PathLike)):
        raise ValueError("file_path must be a path, got %s" % type(file_path).__name__)
    if mark_cycles:
        warnings.warn("hvd.start_timeline(mark_cycles=True): mxnet_mpi's timeline has no "
                      "cycle marks (it records each collective's wait for inputs, queueing and "
                      "MPI time); mark_cycles is ignored", stacklevel=2)
    if _state.timeline_path is not None:
        stop_timeline()
    _state.timeline_path = os.fspath(file_path)
    timeline.start()
    if not _state.timeline_hooked:
        _state.timeline_hooked = True
        on_exit(_timeline_at_exit)


def stop_timeline() -> None:
    """Stop recording and write the timeline (nothing if none is recording)."""
    _require_init()
    if _state.timeline_path is None:
        return
    try:
        _write_timeline()
    finally:
        _state.timeline_path = None
        timeline.stop()


# ---------------------------------------------------------------- collectives
def _reduce_op(average, op) -> int:
    """Horovod's op/average rule: op wins, average is deprecated, default Average."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of "
                             "them.")
    elif average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in "
                      "v1.0", DeprecationWarning, stacklevel=3)
        op = Average if average else Sum
    else:
        op = Average
    op = _OPS_BY_NAME.get(op, op) if isinstance(op, str) else op
    if op == Adasum:
        raise NotImplementedError("Adasum is not implemented by mxnet_mpi.horovod; use hvd.Sum, "
                                  "hvd.Average, hvd.Min, hvd.Max or hvd.Product")
    if op not in _OP_NAMES:
        raise ValueError("unknown reduction op %r; use hvd.Sum, hvd.Average, hvd.Min, hvd.Max "
                         "or hvd.Product" % (op,))
    return op


def _is_integer(tensor) -> bool:
    return np.dtype(tensor.dtype).kind in "iu"


def _scale(tensor, factor) -> None:
    """tensor *= factor (engine ops), unless factor is 1; an integer tensor as
    Horovod scales it: in double precision, truncated toward zero (MXNet's
    own multiply would first cast 0.5 to 0). Legacy and mx.np arrays alike."""
    factor = float(factor)
    if factor == 1.0 or tensor.size == 0:
        return   # nothing to scale (MXNet's legacy operators refuse empty arrays)
    numpy_mode = isinstance(tensor, mx.np.ndarray)
    if _is_integer(tensor) or tensor.dtype == np.float64:
        # MXNet's scalar operators take the factor in float32 (0.3 / 3 became
        # 0.1, so a sum of 10 averaged with postscale 0.3 gave 1 where Horovod
        # gives 0): multiply by a float64 array instead
        lib = mx.np if numpy_mode else mx.nd
        f = lib.array([factor], dtype="float64", ctx=tensor.context).reshape((1,) * tensor.ndim)
        wide = tensor.astype("float64") if _is_integer(tensor) else tensor
        scaled = wide * f if numpy_mode else mx.nd.broadcast_mul(wide, f)
        _assign(tensor, scaled.astype(tensor.dtype) if _is_integer(tensor) else scaled)
    elif tensor.dtype == np.float16:
        # in float32, rounded to half once, as Horovod does (a factor cast to
        # half first, 0.3 -> 0.29993, biased every scaled gradient)
        _assign(tensor, (tensor.astype("float32") * factor).astype("float16"))
    else:
        tensor *= factor


def _assign(tensor, value) -> None:
    """tensor[...] = value, for 0-d mx.np arrays too (they take only `()`)."""
    if tensor.ndim == 0 and isinstance(tensor, mx.np.ndarray):
        tensor[()] = value
    else:
        tensor[:] = value


def _allreduce_into(tensors: list, op: int, name, priority, prescale_factor, postscale_factor,
                    entry) -> None:
    """One collective over `tensors` (one dtype)."""
    for i, t in enumerate(tensors):
        check_array(t, "tensor %d" % i)
    if op == Average and tensors and _is_integer(tensors[0]):
        # as Horovod: the sum scaled by 1/size (truncated), not an error
        members = len(entry.ranks) if entry is not None else size()
        op, postscale_factor = Sum, float(postscale_factor) / members
    for t in tensors:
        _scale(t, prescale_factor)
    ops.grouped_allreduce_(tensors, name=name, priority=priority, store=entry,
                           op=_OP_NAMES[op])
    for t in tensors:
        _scale(t, postscale_factor)


def _as_list(tensors, what: str) -> list:
    if isinstance(tensors, mx.nd.NDArray) or not isinstance(tensors, (list, tuple)):
        raise MPIKVStoreError("hvd.%s takes a list of NDArrays, got %s"
                              % (what, type(tensors).__name__))
    return list(tensors)


def allreduce(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set, op=None):
    """A new array: the average (default), sum, min, max or product of `tensor`
    over the ranks of `process_set`."""
    entry = _where(process_set, "allreduce")
    with ops.refusing(store=entry):
        op = _reduce_op(average, op)
        check_array(tensor, "tensor")
        out = tensor.copy()
        _allreduce_into([out], op, name, priority, prescale_factor, postscale_factor, entry)
    return out


def allreduce_(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set, op=None):
    """In place: the average (default), sum, min, max or product of `tensor`
    over the ranks of `process_set`; returns `tensor`."""
    entry = _where(process_set, "allreduce_")
    with ops.refusing(store=entry):
        op = _reduce_op(average, op)
        _allreduce_into([tensor], op, name, priority, prescale_factor, postscale_factor, entry)
    return tensor


def grouped_allreduce(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set, op=None):
    """New arrays: a list of tensors allreduced as one collective per dtype."""
    entry = _where(process_set, "grouped_allreduce")
    with ops.refusing(store=entry):
        tensors = _as_list(tensors, "grouped_allreduce")
        for i, t in enumerate(tensors):
            check_array(t, "tensor %d" % i)
        outs = [t.copy() for t in tensors]
    return grouped_allreduce_(outs, average, name, priority, prescale_factor, postscale_factor,
                              process_set, op)


def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set, op=None):
    """In place: a list of tensors allreduced as one collective per dtype."""
    entry = _where(process_set, "grouped_allreduce_")
    with ops.refusing(store=entry):
        op = _reduce_op(average, op)
        tensors = _as_list(tensors, "grouped_allreduce_")
        for i, t in enumerate(tensors):
            check_array(t, "tensor %d" % i)
        by_dtype: dict = OrderedDict()
        for t in tensors:
            by_dtype.setdefault(np.dtype(t.dtype), []).append(t)
        for group in by_dtype.values():
            _allreduce_into(group, op, name, priority, prescale_factor, postscale_factor, entry)
    return tensors


def allgather(tensor, name=None, priority=0, process_set=global_process_set):
    """The ranks' `tensor`s concatenated along the first dimension (which may
    differ between ranks), in rank order within `process_set`."""
    entry = _where(process_set, "allgather")
    return ops.allgather(tensor, name=name, priority=priority, store=entry)


def grouped_allgather(tensors, name=None, priority=0, process_set=global_process_set):
    """allgather of each tensor of a list."""
    entry = _where(process_set, "grouped_allgather")
    with ops.refusing(store=entry):
        tensors = _as_list(tensors, "grouped_allgather")
    return [ops.allgather(t, name="%s.%d" % (name, i) if name else None, priority=priority,
                          store=entry) for i, t in enumerate(tensors)]


def alltoall(tensor, splits=None, name=None, priority=0, process_set=global_process_set):
    """Rows of `tensor` scattered to the ranks of `process_set` by `splits`
    (default: equal parts). Returns the rows received, in rank order, and,
    when `splits` is given, the rows received from each rank (int32 NDArray)."""
    entry = _where(process_set, "alltoall")
    out, received = ops.alltoall(tensor, splits=splits, name=name, priority=priority,
                                 store=entry)
    return out if splits is None else (out, received)


def broadcast(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """A new array holding world rank `root_rank`'s `tensor`."""
    entry = _where(process_set, "broadcast")
    with ops.refusing(store=entry):
        root = _root_in(entry, root_rank, "broadcast")
    return ops.broadcast(tensor, root, name=name, priority=priority, store=entry)


def broadcast_(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """World rank `root_rank`'s `tensor` into `tensor` on every rank; returns it."""
    entry = _where(process_set, "broadcast_")
    with ops.refusing(store=entry):
        root = _root_in(entry, root_rank, "broadcast_")
    return ops.broadcast_(tensor, root, name=name, priority=priority, store=entry)


def reducescatter(tensor, op=Average, name=None, priority=0, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """The average (default) or sum over the ranks of `tensor`, split along the
    first dimension: the rank of set rank r gets part r (the first
    rows % size ranks one row more)."""
    entry = _where(process_set, "reducescatter")
    with ops.refusing(store=entry):
        op = _OPS_BY_NAME.get(op, op) if isinstance(op, str) else op
        if op not in (Average, Sum):
            raise ValueError("hvd.reducescatter supports hvd.Average and hvd.Sum, got %r" % (op,))
        check_array(tensor, "tensor")
        if tensor.shape == ():
            raise ValueError("reducescatter does not support scalar inputs")
        if op == Average and _is_integer(tensor):
            # as Horovod (and allreduce here): the sum scaled by 1/size, truncated
            members = len(entry.ranks) if entry is not None else size()
            op, postscale_factor = Sum, float(postscale_factor) / members
        if float(prescale_factor) != 1.0:
            tensor = tensor.copy()
            _scale(tensor, prescale_factor)
    out = ops.reduce_scatter(tensor, average=op == Average, name=name, priority=priority,
                             store=entry)
    _scale(out, postscale_factor)
    return out


def grouped_reducescatter(tensors, op=Average, name=None, priority=0,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each tensor of a list."""
    entry = _where(process_set, "grouped_reducescatter")
    with ops.refusing(store=entry):
        tensors = _as_list(tensors, "grouped_reducescatter")
    return [reducescatter(t, op, "%s.%d" % (name, i) if name else None, priority, process_set,
                          prescale_factor, postscale_factor) for i, t in enumerate(tensors)]


# ---------------------------------------------------------------- objects
def _pickled(obj, what: str) -> mx.nd.NDArray:
    try:
        data = _pickler.dumps(obj)
    except Exception as exc:  # noqa: BLE001 - any pickling failure, named
        raise MPIKVStoreError("hvd.%s: rank %d cannot pickle the %s object: %s: %s"
                              % (what, rank(), type(obj).__name__, type(exc).__name__, exc)
                              ) from exc
    return mx.nd.array(np.frombuffer(data, dtype=np.uint8), dtype="uint8")


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """World rank `root_rank`'s `obj` (pickled; any value elsewhere, e.g. None)
    on every rank of `process_set`."""
    entry = _where(process_set, "broadcast_object")
    name = name or "broadcast_object"
    with ops.refusing(store=entry):
        root = _root_in(entry, root_rank, "broadcast_object")
        if rank() == root_rank:
            payload = _pickled(obj, "broadcast_object")
            length = mx.nd.array([payload.size], dtype="int64")
        else:
            length = mx.nd.zeros((1,), dtype="int64")
    ops.broadcast_(length, root, name=name + ".sz", store=entry)
    if rank() != root_rank:
        payload = mx.nd.zeros((int(length.asscalar()),), dtype="uint8")
    ops.broadcast_(payload, root, name=name + ".t", store=entry)
    if rank() == root_rank:
        return obj
    return pickle.loads(payload.asnumpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Every rank's `obj` (pickled), as a list in rank order within `process_set`."""
    entry = _where(process_set, "allgather_object")
    name = name or "allgather_object"
    with ops.refusing(store=entry):
        payload = _pickled(obj, "allgather_object")
    sizes = ops.allgather(mx.nd.array([payload.size], dtype="int64"), name=name + ".sz",
                          store=entry).asnumpy()
    data = ops.allgather(payload, name=name + ".t", store=entry).asnumpy().tobytes()
    ends = np.cumsum(sizes)
    return [pickle.loads(data[end - n:end]) for n, end in zip(sizes, ends)]


# ---------------------------------------------------------------- training
class _NoCompression:
    """Gradients travel as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _FP16Compression:
    """Floating-point gradients travel as float16 and come back in their dtype."""

    @staticmethod
    def compress(tensor):
        if np.dtype(tensor.dtype).kind == "f" and np.dtype(tensor.dtype) != np.float16:
            return tensor.astype("float16"), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.astype(ctx) if ctx is not None else tensor


class Compression:
    """Gradient compression for DistributedTrainer (``none`` or ``fp16``)."""

    none = _NoCompression
    fp16 = _FP16Compression


def _split(items: list, groups: int) -> list:
    return [g for g in split_list(items, groups) if g]


def _registered(ranks: list) -> ProcessSet:
    """The registered process set of these world ranks (loading optimizer
    states saved for it); the global set where they are the whole world."""
    if list(ranks) == list(range(size())):
        return global_process_set
    for set_id, entry in _state.sets.items():
        if list(entry.ranks) == list(ranks):
            ps = ProcessSet(ranks)
            ps.process_set_id = set_id
            return ps
    raise ValueError("these optimizer states were saved for a DistributedOptimizer on process "
                     "set %s, which is not registered in this job: register it "
                     "(hvd.add_process_set) before loading them" % (list(ranks),))


def _trainer_set(process_set) -> ProcessSet:
    """A registered process set (this rank a member or not), for the trainers."""
    process_set = global_process_set if process_set is None else process_set
    if not isinstance(process_set, ProcessSet):
        raise ValueError("process_set must be an hvd.ProcessSet, got %s"
                         % type(process_set).__name__)
    if process_set.size() is None:
        raise ValueError("%s is not registered (hvd.init(process_sets=[...]) or "
                         "hvd.add_process_set())" % process_set)
    return process_set


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps an optimizer: on the ranks of `process_set`, each update first sums
    the gradient over the set; rescale_grad is divided by the set's size, so
    the step averages (on every rank, as in Horovod)."""

    def __init__(self, optimizer, gradient_predivide_factor: float = 1.0,
                 num_groups: int = 0, process_set=global_process_set) -> None:
        self._optimizer = optimizer
        self._process_set = _trainer_set(process_set)
        self._optimizer.rescale_grad *= gradient_predivide_factor / self._process_set.size()
        self._gradient_predivide_factor = gradient_predivide_factor
        self._num_groups = num_groups
        self._updates = 0
        self._settings = SettingsComparison(SETTINGS_UPDATES)

    def __getattr__(self, item):
        return getattr(self._optimizer, item)

    # Trainer.save_states pickles the optimizer: a comparison in flight holds
    # an array read through its memory, which a copy would not share. The
    # process set goes as its ranks (None: the global set) and the size that
    # rescale_grad was divided by: a file saved on 2 ranks and loaded on 3
    # kept the old job's set (rank 2 outside it, stepping alone) and 1/2.
    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_settings", None)
        ps = state.pop("_process_set")
        state["_set_ranks"] = None if ps.process_set_id == 0 else list(ps.ranks)
        state["_set_size"] = ps.size()
        return state

    def __setstate__(self, state):
        ranks, saved = state.pop("_set_ranks", None), state.pop("_set_size", None)
        super().__setstate__(state)
        self._settings = SettingsComparison(SETTINGS_UPDATES)
        self._process_set = global_process_set if ranks is None else _registered(ranks)
        size = self._process_set.size()
        if saved and size and saved != size:   # as if made in this job
            self._optimizer.rescale_grad *= saved / size

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def _do_allreduce(self, index, grad) -> None:
        if self._process_set.size() == 1:
            return
        pre = 1.0 / self._gradient_predivide_factor
        ps = self._process_set
        if isinstance(index, (tuple, list)):
            if self._num_groups > 0:
                for i, (grads, idx) in enumerate(zip(_split(list(grad), self._num_groups),
                                                     _split(list(index), self._num_groups))):
                    grouped_allreduce_(grads, name="%s:%s" % (idx[0], idx[-1]), priority=-i,
                                       prescale_factor=pre, process_set=ps, op=Sum)
            else:
                for i in range(len(index)):
                    allreduce_(grad[i], name=str(index[i]), priority=-i, prescale_factor=pre,
                               process_set=ps, op=Sum)
        else:
            allreduce_(grad, name=str(index), prescale_factor=pre, process_set=ps, op=Sum)

    def _compare_settings(self) -> None:
        # Horovod lets each rank apply its own optimizer; ranks whose settings
        # differ would drift apart silently. Compared without a wait, at most
        # once per SETTINGS_UPDATES updates (as Module's, docs/store.md).
        if self._process_set.size() == 1:
            return
        self._updates += 1
        opt = self._optimizer
        self._settings.tick(
            self._updates, _stream_of(self._process_set, "DistributedOptimizer"),
            b"DistributedOptimizer update %d" % self._updates,
            lambda: describe(opt, opt.rescale_grad, "rescale_grad"))

    def update(self, index, weight, grad, state):
        if self._process_set.included():
            self._compare_settings()
            self._do_allreduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        if self._process_set.included():
            self._compare_settings()
            self._do_allreduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult):
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        self._optimizer.set_wd_mult(args_wd_mult)


class DistributedTrainer(mx.gluon.Trainer):
    """gluon.Trainer whose gradients are summed over the ranks of `process_set`
    by engine-embedded allreduces (one batch of collectives per step) and
    averaged through the trainer's scale (divided by the set's size on every
    rank), as Horovod's DistributedTrainer does. Ranks outside the set step on
    their own gradients.

    Unlike Horovod, ranks that pass different batch sizes to one step stay
    identical: each divides by the mean batch size of the set's ranks
    (docs/store.md, "Batch sizes"), which is its own when all are equal."""

    def __init__(self, params, optimizer, optimizer_params=None,
                 compression=Compression.none, gradient_predivide_factor: float = 1.0,
                 prefix: str | None = None, num_groups: int = 0,
                 process_set=global_process_set) -> None:
        self._compression = compression
        self._process_set = _trainer_set(process_set)
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take DistributedOptimizer as its "
                          "optimizer; it was unwrapped", stacklevel=2)
        items = (list(params.items()) if isinstance(params, (dict, mx.gluon.ParameterDict))
                 else [(p.name, p) for p in params] if isinstance(params, (list, tuple))
                 else None)
        if items is not None and self._process_set.size() > 1 and self._process_set.included():
            # sorted by name, as Horovod does, unless Gluon's name counters
            # differ between the ranks: then by position (param_order)
            stream = _stream_of(self._process_set, "DistributedTrainer")
            params, _ = agreed_order(items, lambda row, desc: rank_table(
                stream, row, "DistributedTrainer: " + desc))
        elif items is not None:
            params = [p for _, p in sorted(items, key=lambda item: item[0])]
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        joining.note_outside(self)   # join() with no argument says it cannot cover it
        self._scale *= gradient_predivide_factor / self._process_set.size()
        self._gradient_predivide_factor = gradient_predivide_factor
        if prefix is not None and not isinstance(prefix, str):
            raise ValueError("prefix must be a string")
        self._prefix = prefix or ""
        self._num_groups = num_groups
        self._batch = None          # step()'s batch size, summed in _allreduce_grads
        self._agreed = None         # their sum, read by _update
        self._batch_sizes = None
        self._steps = 0
        self._ignore_stale = False  # step()'s or update()'s ignore_stale_grad
        self._fresh = FreshCounts()  # with ignore_stale_grad (stale_grads.py)
        self._device_sums: dict = {}  # per parameter: the sum over this rank's devices

    def _sum_batch_sizes(self, batch_size, call: str, stale: bool) -> None:
        # A collective of its own, pushed before the gradients: the free
        # functions' stream runs in push order, so it completes without waiting
        # for backprop (a gradient allreduce would make the wait longer).
        if self._batch_sizes is None:
            self._batch_sizes = BatchSizes()
        stream = _stream_of(self._process_set, "DistributedTrainer")
        self._agreed = self._batch_sizes.push(
            stream, batch_size,
            ("DistributedTrainer.%s %d: sum of batch sizes" % (call, self._steps)).encode(),
            describe(self._optimizer, self._scale),
            step_flags(stale and not self._ignore_stale, written(self)))
        if self._ignore_stale:
            self._fresh.push(self._params, lambda arr: allreduce_in_place(
                stream, arr, "DistributedTrainer: " + COUNTS_DESC))

    def step(self, batch_size, ignore_stale_grad=False):
        self._steps += 1
        self._batch = batch_size
        self._ignore_stale = ignore_stale_grad
        try:
            super().step(batch_size, ignore_stale_grad)
        finally:
            self._batch = self._agreed = None

    def update(self, batch_size, ignore_stale_grad=False):
        ps = self._process_set
        self._ignore_stale = ignore_stale_grad
        if ps.size() > 1 and ps.included():
            self._sum_batch_sizes(batch_size, "update", stale_gradient(self._params))
        try:
            super().update(batch_size, ignore_stale_grad)
        finally:
            self._agreed = None

    def _update(self, ignore_stale_grad=False):
        if self._agreed is not None:
            agreed, self._agreed = self._agreed, None
            self._optimizer.rescale_grad = self._scale / agreed.mean()
            what = "DistributedTrainer step %d" % self._steps
            if agreed.written_ranks:   # before any rank may raise for a stale gradient
                stream = _stream_of(self._process_set, "DistributedTrainer")
                check_trainer_after_writes(
                    self, getattr(self, "_mxmpi_writes", None),
                    lambda row: rank_table(stream, row, "DistributedTrainer: " + WRITES_DESC),
                    what, agreed.written_ranks, NOT_APPLIED,
                    "copy one rank's weights to every rank with mxnet_mpi.horovod."
                    "broadcast_parameters(params, root_rank) called on every rank")
            agreed.refuse_if_stale_elsewhere(self._params, ignore_stale_grad, what)
            if ignore_stale_grad:
                self._fresh.apply(self._params)   # the same parameters on every rank
        super()._update(ignore_stale_grad)

    def _allreduce_grads(self):
        ps = self._process_set
        if ps.size() == 1 or not ps.included():
            return
        stale = stale_gradient(self._params)
        if stale:
            zero_stale(self._params)   # a stale gradient adds nothing to the sums
        if self._batch is not None:
            self._sum_batch_sizes(self._batch, "step", stale)
            self._batch = None
        pre = 1.0 / self._gradient_predivide_factor
        entries, spread = [], []
        for i, param in enumerate(self._params):
            if param.grad_req != "null":
                grads = param.list_grad()
                grad = grads[0]
                if len(grads) > 1:
                    # the sum over this rank's devices is what the ranks reduce, then
                    # every device gets it (Horovod reduces the first device's
                    # gradient only: the other devices' weights drifted apart)
                    grad = sum_over_devices(self._device_sums, i, grads)
                    spread.append((grad, grads))
                sent, ctx = self._compression.compress(grad)
                entries.append((i, param, grad, sent, ctx))
        if self._num_groups > 0:
            for g, group in enumerate(_split(entries, self._num_groups)):
                grouped_allreduce_([e[3] for e in group],
                                   name="%s%d:%s%d" % (self._prefix, group[0][0], self._prefix,
                                                       group[-1][0]),
                                   priority=-g, prescale_factor=pre, process_set=ps, op=Sum)
        else:
            for i, _, _, sent, _ in entries:
                allreduce_(sent, name=self._prefix + str(i), priority=-i, prescale_factor=pre,
                           process_set=ps, op=Sum)
        for _, _, grad, sent, ctx in entries:
            if sent is not grad:
                grad[:] = self._compression.decompress(sent, ctx)
        for total, grads in spread:
            fan_out(total, grads)


def _broadcast_after_init(param, root_rank: int, name: str, process_set):
    init_impl = param._init_impl

    def wrapped(self, *args, **kwargs):
        init_impl(*args, **kwargs)
        _broadcast_param(self, root_rank, name, process_set)
    return wrapped


def _broadcast_param(param, root_rank: int, name: str, process_set) -> None:
    """One broadcast of a Gluon parameter, copied to each of its devices (its
    other devices kept their own values, where Horovod assumes one)."""
    arrays = param.list_data()
    broadcast_(arrays[0], root_rank=root_rank, name=name, process_set=process_set)
    fan_out(arrays[0], arrays[1:])


def broadcast_parameters(params, root_rank: int = 0, prefix: str | None = None,
                         process_set=global_process_set) -> None:
    """Copy world rank `root_rank`'s parameters (a dict of NDArrays or a Gluon
    ParameterDict; deferred-init parameters as soon as they are initialised)
    to every rank of `process_set` (an mxnet_mpi extension; Horovod's has none)."""
    process_set = _trainer_set(process_set)
    if size() == 1 or process_set.size() == 1 or not process_set.included():
        return
    if prefix is not None and not isinstance(prefix, str):
        raise ValueError("prefix must be a string")
    prefix = prefix or ""
    if not isinstance(params, (dict, mx.gluon.ParameterDict)):
        raise ValueError("invalid params of type: %s" % type(params))
    # a parameter initialised on some ranks only (rank 0 loaded a checkpoint
    # before its first forward) is initialised everywhere first: the ranks
    # then broadcast the same parameters, now
    stream = _stream_of(process_set, "broadcast_parameters")

    def table(row, desc):
        return rank_table(stream, row, "broadcast_parameters: " + desc)

    # by name, as Horovod does, unless Gluon's name counters differ between
    # the ranks: then by position, under names of positions (param_order)
    items, same = agreed_order([(name, (name, p)) for name, p in params.items()], table)
    if not same:
        items = [("%d" % i, p) for i, (_, p) in enumerate(items)]
    settle_deferred([p for _, p in items if isinstance(p, mx.gluon.Parameter)], table)
    for name, p in items:
        if isinstance(p, mx.gluon.Parameter):
            try:
                p.list_data()
            except mx.gluon.parameter.DeferredInitializationError:
                p._init_impl = types.MethodType(
                    _broadcast_after_init(p, root_rank, prefix + str(name), process_set), p)
                continue
            _broadcast_param(p, root_rank, prefix + str(name), process_set)
        else:
            broadcast_(p, root_rank, name=prefix + str(name), process_set=process_set)

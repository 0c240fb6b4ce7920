"""Engine-embedded collectives: native streams and the free functions.

A *stream* is a native store: a communicator (duplicated, private) whose
collectives take their place in one sequence, the same on every rank. Each
collective is pushed into MXNet's dependency engine and the call returns at
once: inputs are read dependencies, outputs write dependencies. Before data
moves, the ranks agree on it (sequence number, description, sizes), so a
mismatch, a skipped collective or a rank-local failure is the same named
error on every rank, and never shifts the pairing of later collectives.

The free functions (mxnet_mpi.ops: ``allreduce_``, ``broadcast_``,
``allgather``, ``alltoall``, ``reduce_scatter``, ...) run on a chained stream
per communicator (the world's exists from MPI initialisation on).
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from typing import Sequence

import mxnet as mx
import numpy as np
from mxnet.base import NDArrayHandle

from . import _native, settings
from ._native import LIB, CallDesc
from .errors import MPIKVStoreError
from .peer_wait import waiting_for_peers
from .world import Communicator, init, local_size, on_comm_free, require_usable

# numpy dtype -> MXNet dtype code (mshadow TypeFlag)
DTYPE_CODES = {
    np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.float16): 2,
    np.dtype(np.uint8): 3, np.dtype(np.int32): 4, np.dtype(np.int8): 5,
    np.dtype(np.int64): 6,
}
SUPPORTED_DTYPES = tuple(str(d) for d in DTYPE_CODES)
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))

# Contexts whose memory the CPU (and so MPI) can address directly.
HOST_DEVICE_TYPES = ("cpu", "cpu_pinned", "cpu_shared")


def engine_is_synchronous() -> bool:
    return os.environ.get("MXNET_ENGINE_TYPE", "") == "NaiveEngine"


def check_array(arr, what: str, sparse_hint: str = "") -> None:
    """Raise MPIKVStoreError unless `arr` is a dense NDArray of a supported dtype."""
    if not isinstance(arr, mx.nd.NDArray):
        raise MPIKVStoreError("%s must be an mxnet NDArray, got %s" % (what, type(arr).__name__))
    if arr.stype != "default":
        raise MPIKVStoreError(
            "%s has storage type '%s'; MPI stores reduce dense arrays only%s"
            % (what, arr.stype, sparse_hint))
    if np.dtype(arr.dtype) not in DTYPE_CODES:
        raise MPIKVStoreError("%s has dtype %s; supported dtypes are %s"
                              % (what, np.dtype(arr.dtype), ", ".join(SUPPORTED_DTYPES)))


def check_same_layout(ref, arr, what: str) -> None:
    """Raise MPIKVStoreError unless `arr` has the shape and dtype of `ref`."""
    if tuple(arr.shape) != tuple(ref.shape) or np.dtype(arr.dtype) != np.dtype(ref.dtype):
        raise MPIKVStoreError("%s has shape %s and dtype %s, expected shape %s and dtype %s"
                              % (what, tuple(arr.shape), np.dtype(arr.dtype),
                                 tuple(ref.shape), np.dtype(ref.dtype)))


def on_host(arr) -> bool:
    return arr.context.device_type in HOST_DEVICE_TYPES


# ---------------------------------------------------------------- calls
class Call:
    """One collective, described for the native library. Holds what its
    ctypes fields point to, so a Call may be built once and pushed often.

    `desc` is what ranks agree on; `label` names the arrays in this rank's
    errors ("key 3"); `name`, printed beside both and never agreed on (ranks
    may name the same array differently), says what they are ("parameter
    'dense0_weight'")."""

    __slots__ = ("desc", "_keep", "arrays")

    def __init__(self, op: int, ins: Sequence, outs: Sequence, *, dtype, shapes: Sequence,
                 desc: str, label: str, root: int = 0, priority: int = 0, flags: int = 0,
                 token: str | None = None, splits: Sequence[int] | None = None, row: int = 1,
                 aux=None, name: str = "") -> None:
        n = len(shapes)
        handles_in = (NDArrayHandle * max(n, 1))(*[a.handle for a in ins])
        handles_out = (NDArrayHandle * max(n, 1))(*[a.handle for a in outs])
        flat = []
        for shape in shapes:
            flat.append(len(shape))
            flat.extend(int(d) for d in shape)
        shape_arr = (ctypes.c_int64 * max(len(flat), 1))(*flat)
        split_arr = (ctypes.c_int64 * len(splits))(*splits) if splits is not None else None
        texts = [desc.encode(), label.encode(), token.encode() if token else None,
                 name.encode() if name else None]
        self.desc = CallDesc(
            op, DTYPE_CODES.get(np.dtype(dtype), 0), root, priority, flags, n, handles_in,
            handles_out, shape_arr, texts[0], texts[1], texts[2],
            split_arr, len(splits) if splits is not None else 0, int(row),
            aux.handle if aux is not None else None, texts[3])
        self._keep = (handles_in, handles_out, shape_arr, split_arr, texts)
        # The arrays must stay alive until the push (the engine then holds them).
        self.arrays = (tuple(ins), tuple(outs), aux)


def token_call(op: int, dtype, shapes: Sequence, desc: str, label: str, reason: str,
               name: str = "") -> Call:
    """A collective this rank cannot take part in (with why): its peers fail
    the same collective with that reason, and the sequence stays paired."""
    return Call(op, [], [], dtype=dtype, shapes=shapes, desc=desc, label=label, token=reason,
                name=name)


class ThreadWarning:
    """Warns once, when something the ranks pair by order is done from a
    second Python thread (the first one seen is remembered; MXNet's own
    threads, e.g. SyncBatchNorm's backward, do not count): threads can make
    that order differ between ranks (docs/store.md#threads)."""

    def __init__(self, message: str) -> None:
        self._message = message   # %(first)r, %(now)r and the note()'s fields
        self._first: str | None = None
        self._warned = False

    def note(self, **fields) -> None:
        thread = threading.current_thread()
        if isinstance(thread, threading._DummyThread):
            return
        if self._first is None:
            self._first = thread.name
        elif thread.name != self._first and not self._warned:
            self._warned = True
            warnings.warn(self._message % dict(fields, first=self._first, now=thread.name),
                          RuntimeWarning, stacklevel=4)


_creators = ThreadWarning(
    "mxnet_mpi: store %(name)r is created from thread %(now)r, an earlier one from %(first)r: "
    "ranks pair stores by the order they are created, which threads can make differ between "
    "ranks; create every store from one thread (docs/store.md#threads)")


class Stream:
    """A native store: collectives over a private duplicate of a communicator,
    run in push order (see kvstore/store.h for the three kinds)."""

    def __init__(self, kind: int, comm: Communicator, name: str, *,
                 store_id: int | None = None, **options: int) -> None:
        """`options`: settings.store_options() keywords; the rest come from the
        settings table (store 0, `store_id`, was created with them at init)."""
        require_usable()
        self.comm = comm
        self.name = name
        self.sync = engine_is_synchronous()
        self._sync = int(self.sync)
        self._failed = ctypes.c_int(-1)
        self._failed_ref = ctypes.byref(self._failed)
        if store_id is not None:
            self.id = store_id
            self.p2p_bytes = self._native_options()[-1]
            return
        _creators.note(name=name)
        out = ctypes.c_int()
        opts = {**settings.store_options(), **options}
        with waiting_for_peers("creating store %r" % name, "every rank of its communicator "
                               "creates the same stores (mx.kv.create, a Trainer's kvstore), "
                               "in the same order", init().rank):
            rc = LIB.mxmpi_store_create(kind, comm.id, name.encode(), opts["fusion_bytes"],
                                        opts["small_bytes"], opts["chunk_bytes"],
                                        opts.get("p2p_bytes", 0), opts["large_lanes"],
                                        opts["cycle_us"], opts.get("preempt_bytes", 0),
                                        ctypes.byref(out))
        if rc != 0:
            # e.g. ranks that create different stores (every rank gets this)
            raise MPIKVStoreError(_native.last_error())
        self.id = out.value
        self.p2p_bytes = int(opts.get("p2p_bytes", 0))   # what the native store was given
        self._closed = False

    def push(self, calls: Sequence[Call], context: bytes | None = None) -> None:
        """Push `calls` in order; raise MPIKVStoreError for the first that failed
        validation (it and every other still took its place in the sequence).
        `context` says what they are for ("Trainer.step 7: gradient
        allreduce"): their messages print it, ranks do not agree on it."""
        if len(calls) == 1:
            array = ctypes.pointer(calls[0].desc)
        else:
            array = (CallDesc * len(calls))(*[c.desc for c in calls])
        self.push_raw(array, len(calls), context)

    def push_raw(self, array, n: int, context: bytes | None = None) -> None:
        """Push a prebuilt ctypes array (or pointer) of `n` CallDesc."""
        if LIB.mxmpi_store_push(self.id, array, n, self._sync, self._failed_ref,
                                context) != 0:
            require_usable()
            raise MPIKVStoreError(_native.last_error())

    def join(self) -> None:
        """Block until every rank has joined; meanwhile take part in the
        collectives the others still run (contributing zeros to sums)."""
        require_usable()
        _native.check(LIB.mxmpi_store_join(self.id))

    def info(self) -> tuple:
        """(collectives issued, still outstanding, joins completed)."""
        vals = [ctypes.c_int64() for _ in range(3)]
        _native.check(LIB.mxmpi_store_info(self.id, *[ctypes.byref(v) for v in vals]))
        return tuple(v.value for v in vals)

    def _native_options(self) -> list:
        """The native store's settings: settings.STORE_OPTIONS' order, then its
        point-to-point threshold."""
        vals = [ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int(),
                ctypes.c_int(), ctypes.c_int64(), ctypes.c_int64()]
        _native.check(LIB.mxmpi_store_options(self.id, *[ctypes.byref(v) for v in vals]))
        return [v.value for v in vals]

    def options(self) -> dict:
        """The settings the native store runs with (settings.store_options keys)."""
        return dict(zip(settings.STORE_OPTIONS, self._native_options()))

    def close(self) -> None:
        """No more collectives; threads and communicators go once nothing is pending."""
        if not getattr(self, "_closed", True):
            self._closed = True
            LIB.mxmpi_store_close(self.id)


def allreduce_in_place(stream: Stream, arr, desc: str, context: bytes | None = None) -> None:
    """Push the sum of host array `arr` over `stream`'s communicator into it
    (collective); `desc` is what the ranks agree on."""
    stream.push([Call(_native.ALLREDUCE, [arr], [arr], dtype=arr.dtype, shapes=[arr.shape],
                      desc="%s shape=%s %s" % (desc, tuple(arr.shape), np.dtype(arr.dtype)),
                      label=desc)], context)


class RankTable:
    """Every rank's int64 row (rank_table), of the ranks that took part: a rank
    that has joined (out of data) adds zeros to every sum, so it has no row."""

    def __init__(self, rows: np.ndarray, ranks: list) -> None:
        self.rows = rows        # [ranks that took part x columns]
        self.ranks = ranks      # their rank numbers

    def any(self) -> np.ndarray:
        """Per column: whether any rank's value is nonzero."""
        return self.rows.any(axis=0)

    def differing(self) -> list:
        """The columns in which the ranks' values differ."""
        return [j for j in range(self.rows.shape[1])
                if (self.rows[:, j] != self.rows[0, j]).any()]

    def ranks_differing(self, column: int) -> list:
        """The ranks whose value in `column` differs from the first rank's."""
        return [r for r, v in zip(self.ranks, self.rows[:, column]) if v != self.rows[0, column]]


def rank_table(stream: Stream, row: np.ndarray, desc: str,
               context: bytes | None = None) -> RankTable:
    """Every rank's int64 `row` over `stream`'s communicator (collective): one
    allreduce of a table that is zero except for this rank's row and its mark
    of presence, so exact. `desc` is what the ranks agree on."""
    table = np.zeros((stream.comm.size, row.size + 1), dtype=np.int64)
    table[stream.comm.rank, :-1] = row
    table[stream.comm.rank, -1] = 1
    arr = mx.nd.array(table, dtype="int64")
    allreduce_in_place(stream, arr, desc, context)
    table = arr.asnumpy()
    present = [r for r in range(table.shape[0]) if table[r, -1]]
    return RankTable(table[present, :-1], present)


# ---------------------------------------------------------------- free functions
_streams: dict = {}
_streams_lock = threading.Lock()


def spans_hosts(comm: Communicator) -> bool:
    """Whether `comm` has members on more than one host; collective over `comm`
    unless the whole world is on this host. Every member must get the same
    answer (it picks the allreduce's route): a group of one rank on a host
    with three and one alone on another spans hosts for both, which this
    host's share of the world alone cannot tell."""
    if init().size == local_size() or comm.size == 1:
        return False
    return comm.spans_hosts()


def p2p_bytes(comm: Communicator) -> int:
    """The point-to-point threshold of a store over `comm` (settings.p2p_thresholds:
    MXNET_MPI_P2P_BYTES if set, else the stores' own allreduce across hosts and
    MPI's on one host). Collective over `comm`."""
    spans = spans_hosts(comm)   # collective: before anything a rank may see differently
    one_host, across_hosts = settings.p2p_thresholds()
    return across_hosts if spans else one_host


def stream_for(comm: Communicator | None) -> Stream:
    """The chained stream of the free functions over `comm` (default: world).
    Created at the communicator's first use (collective over it). Across
    hosts their allreduces take the point-to-point route, as a store's do."""
    world = init()
    comm = comm or world
    with _streams_lock:
        stream = _streams.get(comm.id)
        if stream is None:
            if comm.id == world.id:   # created as MPI started (mxmpi_init)
                stream = Stream(_native.EXEC_CHAINED, comm, "mxnet_mpi (free functions)",
                                store_id=_native.DEFAULT_STORE)
            else:
                stream = Stream(_native.EXEC_CHAINED, comm, "mxnet_mpi (communicator %d)"
                                % comm.id, p2p_bytes=p2p_bytes(comm))
            _streams[comm.id] = stream
        return stream


def _drop_stream(comm_id: int) -> None:
    """A communicator is being freed: its free functions' stream goes too
    (closed once nothing is pending)."""
    with _streams_lock:
        stream = _streams.pop(comm_id, None)
    if stream is not None:
        stream.close()


on_comm_free(_drop_stream)

"""MPI KVStores registered with MXNet: ``mpi`` and ``mpi_<mode>``.

``pushpull`` **sums** over ranks (and over the devices of one rank), exactly
as MXNet's ``dist_sync`` sums the pushes of its workers. So a Gluon script
that calls ``trainer.step(per_rank_batch_size)`` follows the same trajectory
with ``kvstore='mpi'`` as with ``kvstore='dist_sync'``. Scripts converted from
Horovod, whose allreduce averages, set ``kv.average = True`` (or
``MXNET_MPI_AVERAGE=1``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import pickle
from typing import Sequence

import mxnet as mx
import numpy as np
from mxnet.kvstore import KVStoreBase

from . import _native, modes, settings, staging
from .batch_sizes import BatchSizes
from .collectives import (
    FLOAT_DTYPES,
    Call,
    Stream,
    check_array,
    check_same_layout,
    on_host,
    token_call,
)
from .errors import MPIKVStoreError
from .joining import join_store, register
from .keys import Key, KeyBook, broadcast_groups, check_key, check_optimizer, key_groups
from .trainer_plan import TrainerPlan
from .world import Communicator, require_usable
from .world import init as init_world

log = logging.getLogger("mxnet_mpi")
_announced = False

SPARSE_HINT = ("; use MXNet's kvstore='dist_sync' (parameter server) for row_sparse "
               "gradients or weights")
COMPRESSIONS = ("none", "fp16")


def _legacy_view(arr):
    """A legacy NDArray view sharing `arr`'s memory, 1-d if `arr` is 0-d: our
    copies and sums use legacy operators, which reject mx.np arrays and 0-d
    shapes (legacy reshape is a view; mx.np's reshape would copy)."""
    legacy = arr.as_nd_ndarray() if isinstance(arr, mx.np.ndarray) else arr
    return legacy.reshape((legacy.size,)) if legacy.ndim == 0 else legacy


def on_deferred_init(param, fn) -> None:
    """Call fn(arrays) once the deferred-init Gluon `param` gets its arrays
    (during the first forward, before any op reads them)."""
    init_impl = param._init_impl

    def hooked(data, ctx_list):
        init_impl(data, ctx_list)
        del param._init_impl  # back to the class method
        fn(param._check_and_get(param._data, list))

    param._init_impl = hooked


class _Item:
    """One key of a call: engine ops before the collective(s), the collective(s)
    (several for a staged array split in chunks), engine ops after them
    (fan-out to several outputs, copies back)."""

    __slots__ = ("calls", "post")

    def __init__(self, calls: list, post=None) -> None:
        self.calls = calls
        self.post = post


class MPIKVStore(KVStoreBase):
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

    # ------------------------------------------------------------ building calls
    def _flags(self, dtype) -> int:
        dtype = np.dtype(dtype)
        flags = 0
        if self._average and dtype in FLOAT_DTYPES:
            flags |= _native.FLAG_AVERAGE
        if self._compression == "fp16" and dtype in (np.dtype(np.float32), np.dtype(np.float64)):
            flags |= _native.FLAG_COMPRESS_FP16
        return flags

    def _checked(self, key: Key, values: list, outs: list | None, verb: str):
        """Validate one key's arrays; its layout (recorded at first use)."""
        check_key(key)
        if not values:
            raise MPIKVStoreError("no value given for key %r" % (key,))
        what = self._keys.what(key)
        for i, v in enumerate(values):
            check_array(v, "value %d of %s" % (i, what), SPARSE_HINT)
            check_same_layout(values[0], v, "value %d of %s" % (i, what))
        for i, o in enumerate(outs or []):
            check_array(o, "out %d of %s" % (i, what), SPARSE_HINT)
            check_same_layout(values[0], o, "out %d of %s" % (i, what))
        return self._keys.layout(key, values[0])

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

    def _item(self, op: int, verb: str, key: Key, src, dst, targets: list, priority: int,
              flags: int = 0, root: int = 0) -> _Item:
        """The collective of `op` from `src` into `dst`, then copies into `targets`;
        device arrays go through this key's pinned buffers, in chunks (staging.py)."""
        info = self._keys.get(key)
        name = self._keys.name(key)
        post_copies = [t for t in targets if t is not dst]
        if not staging.needs_staging(src, dst):
            call = Call(op, [src], [dst], dtype=info.dtype, shapes=[info.shape],
                        desc=info.desc(verb), label="key %r" % (key,), root=root,
                        priority=priority, flags=flags, name=name)
            post = (lambda: self._fan_out(dst, post_copies)) if post_copies else None
            return _Item([call], post)
        chunks = self._staging.chunks((key, verb), info.shape, info.dtype)
        staging.copy_out(src, chunks)
        k = len(chunks)
        calls = [Call(op, [c.buf], [c.buf], dtype=info.dtype, shapes=[c.buf.shape],
                      desc=info.desc(verb) + (" chunk %d/%d" % (i + 1, k) if k > 1 else ""),
                      label="key %r" % (key,), root=root, priority=priority, flags=flags,
                      name=name)
                 for i, c in enumerate(chunks)]

        def post():
            staging.copy_back(chunks, dst)
            self._fan_out(dst, post_copies)

        return _Item(calls, post)

    def _tokens(self, op: int, verb: str, key: Key, value, reason: str) -> list:
        """Failure tokens taking the place of the collective(s) `key` would have
        been: one per chunk, described as its peers describe them, when staged."""
        token = self._keys.token(op, verb, key, value, reason)
        if not (isinstance(value, mx.nd.NDArray) and staging.needs_staging(value)):
            return [token]
        try:
            info = self._keys.get(key)
        except TypeError:   # an unhashable key: the reason this call failed
            info = None
        shape, dtype = (info.shape, info.dtype) if info is not None else \
            (value.shape, value.dtype)
        sizes = staging.chunk_sizes(shape, dtype)
        if len(sizes) == 1:
            return [token]
        desc = info.desc(verb) if info is not None else "%s key=%r shape=%s %s" % (
            verb, key, tuple(shape), np.dtype(dtype))
        return [token_call(op, dtype, [(n,)], "%s chunk %d/%d" % (desc, i + 1, len(sizes)),
                           "key %r" % (key,), reason, self._keys.name(key))
                for i, n in enumerate(sizes)]

    def _run(self, groups: list, build, op: int, verb: str) -> None:
        """Build one item per (key, values, outs) group and push them all as one
        batch; a group that fails still takes its place (a token), and the first
        failure is raised once the batch is pushed."""
        self._usable()
        items, error = [], None
        for k, values, outs in groups:
            try:
                items.append(build(k, values, outs))
            except MPIKVStoreError as exc:
                error = error or exc
                items.append(_Item(self._tokens(op, verb, k, values[0] if values else None,
                                                str(exc))))
        self._last_calls = [c for it in items for c in it.calls]
        if items:
            self._stream.push(self._last_calls, self._context)
        for it in items:
            if it.post is not None:
                it.post()
        if error is not None:
            raise error

    def _collective(self, op: int, verb: str, key: Key, src, dst, priority: int = 0,
                    root: int = 0) -> None:
        """One collective on `key` (layout recorded at first use), for the stores
        built on this one; a failure still takes its place (a token)."""
        def build(k, values, outs):
            info = self._keys.layout(k, src)
            return self._item(op, verb, k, src, dst, [dst], priority,
                              self._flags(info.dtype) if op == _native.ALLREDUCE else 0, root)

        self._run([(key, [src], [dst])], build, op, verb)

    def internal_collective(self, op: int, arr, desc: str, root: int = 0) -> None:
        """An in-place collective on a host array outside any key (its layout may
        change between calls), described by `desc` (what ranks agree on)."""
        self._usable()
        self._stream.push([Call(op, [arr], [arr], dtype=arr.dtype, shapes=[arr.shape],
                                desc="%s shape=%s %s" % (desc, tuple(arr.shape),
                                                         np.dtype(arr.dtype)),
                                label=desc, root=root)], self._context)

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
                and not self._closed):
            # The same arrays as last time: the native side checks their layout.
            self._stream.push_raw(fast[3], 1, self._context)
            return
        self._reduce(key_groups(key, value, out), lambda k: priority)
        if type(key) in (int, str) and isinstance(value, mx.nd.NDArray) \
                and len(self._last_calls) == 1 and not staging.needs_staging(value) \
                and (out is None or (isinstance(out, mx.nd.NDArray) and on_host(out))):
            call = self._last_calls[0]
            self._fast[key] = (value, out, priority, ctypes.pointer(call.desc), call)

    def _reduce(self, groups: list, priority_of) -> None:
        def build(k, values, outs):
            info = self._checked(k, values, outs, "allreduce")
            src = self._local_sum(k, values)
            dst = src if outs is None else outs[0]
            return self._item(_native.ALLREDUCE, "allreduce", k, src, dst,
                              values if outs is None else outs, priority_of(k),
                              self._flags(info.dtype))

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
            return self._item(_native.ALLREDUCE, "allreduce", k, src, dst, [dst], priority,
                              self._flags(info.dtype))

        try:
            self._run(groups, build, _native.ALLREDUCE, "allreduce")
        finally:
            for k, grad in updates:
                self._updater(k, grad, self._stored[k])

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
        every rank holds identical weights, so no server is needed."""
        check_optimizer(optimizer)
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

    # ------------------------------------------------------------ uneven data
    #: Whether join() can even out this store's ranks (the hybrid stores cannot:
    #: their servers wait for a push from every group each step).
    supports_join = True

    def join(self, params=None, updater=None) -> int:
        """This rank has run out of data: take part in the collectives the other
        ranks still run (contributing zeros to sums, receiving broadcasts) until
        every rank has called join(); then all return. Returns the rank that ran
        the most collectives (its state is the latest). With `params` (Gluon
        parameters, or a dict name -> NDArray) and/or `updater` (an optimizer
        updater, or a gluon Trainer), their values and optimizer states are
        copied from that rank, so every rank continues identically."""
        self._usable()
        return join_store(self, params, updater)

    # ------------------------------------------------------------ Trainer and Module glue
    @contextlib.contextmanager
    def serving(self, what: str | None):
        """Collectives pushed inside the block say what they are for (`what`,
        e.g. "Module.update 3: gradient allreduce"): their mismatch, token and
        stall messages print it."""
        before = self._context
        self._context = what.encode() if what else None
        try:
            yield
        finally:
            self._context = before

    def name_keys(self, names: dict) -> None:
        """Key -> parameter name, printed in messages about the key's collectives."""
        for key, name in names.items():
            self._keys.set_name(key, name)

    def batch_agreement(self, batch_size, what: str | None = None) -> BatchSizes:
        """Push the allreduce of this rank's `batch_size` over every worker of
        the store (collective); read the result with .mean() or .total()
        (docs/store.md, "Batch sizes")."""
        self._usable()
        if self._batch_sizes is None:
            self._batch_sizes = BatchSizes()
        return self._batch_sizes.push(self._workers_stream(), batch_size,
                                      what.encode() if what else self._context)

    def _workers_stream(self):
        """The stream over every worker (num_workers) of the store."""
        return self._stream

    def sync_initial_params(self, params: Sequence) -> None:
        """Broadcast initial values of Gluon `params` from rank 0 now, and of
        deferred-init ones as soon as their shapes are known (first forward),
        so every rank computes its first gradient on the same weights."""
        self.name_keys({idx: p.name for idx, p in enumerate(params)})
        keys, values, outs = [], [], []
        for idx, param in enumerate(params):
            if param._deferred_init:
                on_deferred_init(param, lambda arrays, idx=idx: self._broadcast_deferred(
                    idx, arrays))
            else:
                arrays = param._check_and_get(param._data, list)
                keys.append(idx)
                values.append(arrays[0])
                outs.append(arrays)
        if keys:
            with self.serving("Trainer init: broadcast of initial weights"):
                self.broadcast(keys, values, out=outs)

    def _broadcast_deferred(self, key: Key, arrays: list) -> None:
        with self.serving("first forward before Trainer.step %d: broadcast of deferred-init "
                          "weights" % (self._reductions + 1)):
            self.broadcast(key, arrays[0], out=arrays)

    def allreduce_params(self, params: Sequence, update_on_kvstore: bool, batch_size=None,
                         what: str | None = None) -> BatchSizes | None:
        """Trainer's gradient reduction, issued last parameter first: backprop
        makes gradients ready from the output layer back, so collectives follow
        readiness instead of waiting for the input layer. Built once, then one
        native call per step while the gradient arrays stay the same.

        With `batch_size`, the batch sizes are summed too (on the first
        collective that can carry them, or one of their own pushed first):
        returns them, for the rule's mean. `what` names the call in messages."""
        self._usable()
        self._reductions += 1
        context = what.encode() if what else None
        if self._updater is None and not update_on_kvstore \
                and self._plan.push(params, batch_size, context):
            return self._plan.batch_sizes if batch_size is not None else None
        agreed = self.batch_agreement(batch_size, what) if batch_size is not None else None
        groups = []
        for i in reversed(range(len(params))):
            param = params[i]
            if param.grad_req == "null":
                continue
            out = param.list_data() if update_on_kvstore else None
            groups.append((i, param.list_grad(), out))
        with self.serving(what):
            if self._updater is not None:
                for k, grads, out in groups:
                    self.pushpull(k, grads, out=out, priority=-k)
            else:
                self._reduce(groups, lambda k: -k)
        return agreed

    def __getstate__(self):
        raise pickle.PicklingError("an MPI kvstore cannot be pickled")

"""How a store turns one call (pushpull, broadcast, init, ...) into collectives
on its native stream: each key's arrays validated and their layout recorded,
a rank's devices summed, device arrays staged through host buffers in chunks,
results fanned out to every output, and a key that fails still taking its
place in the sequence (a token), so that every rank fails the same way.
"""

from __future__ import annotations

import mxnet as mx
import numpy as np

from . import _native, staging
from .collectives import FLOAT_DTYPES, Call, check_array, check_same_layout, token_call
from .errors import MPIKVStoreError
from .keys import Key, check_key

SPARSE_HINT = ("; for row_sparse gradients or weights use a hybrid store "
               "(kvstore='dist_sync_mpi': sparse ones go to its parameter servers) or MXNet's "
               "kvstore='dist_sync'")


def legacy_view(arr):
    """A legacy NDArray view sharing `arr`'s memory, 1-d if `arr` is 0-d: our
    copies and sums use legacy operators, which reject mx.np arrays and 0-d
    shapes (legacy reshape is a view; mx.np's reshape would copy)."""
    legacy = arr.as_nd_ndarray() if isinstance(arr, mx.np.ndarray) else arr
    return legacy.reshape((legacy.size,)) if legacy.ndim == 0 else legacy


def sum_over_devices(buffers: dict, key, values: list):
    """One array holding the sum of `values`, one array per device of this
    rank (engine ops): `values[0]` itself where there is one, else
    `buffers[key]`, a buffer on the first one's device kept for the next call."""
    if len(values) == 1 or values[0].size == 0:
        return values[0]
    first = values[0]
    buf = buffers.get(key)
    if buf is None or buf.context != first.context or buf.shape != first.shape:
        buf = buffers[key] = mx.nd.empty(first.shape, ctx=first.context, dtype=first.dtype)
    legacy = [legacy_view(v).as_in_context(first.context) for v in values]
    mx.nd.add_n(*legacy, out=legacy_view(buf))
    return buf


def fan_out(src, outs: list) -> None:
    """Copy `src` into each of `outs` but itself (engine ops)."""
    if src.size == 0:  # nothing to copy; legacy MXNet rejects empty copies
        return
    for o in outs:
        if o is not src:
            legacy_view(src).copyto(legacy_view(o))


class _Item:
    """One key of a call: engine ops before the collective(s), the collective(s)
    (several for a staged array split in chunks), engine ops after them
    (fan-out to several outputs, copies back)."""

    __slots__ = ("calls", "post")

    def __init__(self, calls: list, post=None) -> None:
        self.calls = calls
        self.post = post


class StoreCalls:
    """Building and pushing a store's collectives (a part of MPIKVStore: it
    uses the store's stream, key book, buffers and settings)."""

    def _flags(self, dtype, key=None) -> int:
        """The request flags of a sum of `dtype`; with the caller's `key`, an
        average of integers (one it cannot divide) is refused, naming it."""
        dtype = np.dtype(dtype)
        flags = 0
        if self._average and dtype in FLOAT_DTYPES:
            flags |= _native.FLAG_AVERAGE
        elif self._average and key is not None:
            raise MPIKVStoreError(
                "%s: this store averages (kv.average / MXNET_MPI_AVERAGE=1), which needs "
                "floating-point arrays, got %s; sum integers with kv.average = False"
                % (self._keys.what(key), dtype))
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
        return sum_over_devices(self._merge, key, values)

    _fan_out = staticmethod(fan_out)

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
        desc = info.desc(verb) if info is not None else "%s key=%r shape=%s %s%s" % (
            verb, key, tuple(shape), np.dtype(dtype), self._keys.owner)
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

    def _barrier(self) -> None:
        """MXNet's barrier among the workers (what SVRGModule calls): returns
        once every worker of the store (a hybrid store: the world) has called
        it. Like MXNet's, it does not wait for the calls queued before it."""
        token = mx.nd.zeros((1,), dtype="int32")
        self.internal_collective(_native.ALLREDUCE, token, "barrier", workers=True)
        token.wait_to_read()

    def internal_collective(self, op: int, arr, desc: str, root: int = 0,
                            workers: bool = False) -> None:
        """An in-place collective on a host array outside any key (its layout may
        change between calls), described by `desc` (what ranks agree on); over
        the store's communicator, or with `workers` over every worker of the
        store (the whole world for a hybrid store)."""
        self._usable()
        stream = self._workers_stream() if workers else self._stream
        stream.push([Call(op, [arr], [arr], dtype=arr.dtype, shapes=[arr.shape],
                          desc="%s shape=%s %s" % (desc, tuple(arr.shape), np.dtype(arr.dtype)),
                          label=desc, root=root)], self._context)

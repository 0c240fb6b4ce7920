"""The hybrid stores' row_sparse path: a group agrees on the union of its
rows (two small integer allreduces), sums a compact rows x dim block by
allreduce, and the key's owner pushes it to the servers as one row_sparse
array; row_sparse_pull pulls the union of the rows the group asks for and
broadcasts them.
"""

from __future__ import annotations

import mxnet as mx
import numpy as np

from . import _native
from .errors import MPIKVStoreError
from .keys import as_list
from .keys import check_key as _check_key


def is_sparse_param(param) -> bool:
    """Whether a Gluon parameter's gradient or weight is row_sparse."""
    return param._grad_stype != "default" or param._stype != "default"


def full_rsp(dense) -> mx.nd.NDArray:
    """A row_sparse array holding every row of `dense`."""
    rows = mx.nd.arange(dense.shape[0], dtype="int64", ctx=dense.context)
    return mx.nd.sparse.row_sparse_array((dense, rows), shape=dense.shape, ctx=dense.context,
                                         dtype=dense.dtype)


def local_rsp_sum(values: list) -> tuple:
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


def rows_of(rsp, rows: np.ndarray, shape: tuple, dtype) -> mx.nd.NDArray:
    """Dense block of `rows` (sorted) of a row_sparse array (missing rows: zero)."""
    have = rsp.indices.asnumpy().astype(np.int64)
    data = rsp.data.asnumpy()
    block = np.zeros((rows.size,) + shape[1:], dtype=dtype)
    if have.size:
        pos = np.searchsorted(have, rows)
        ok = (pos < have.size) & (have[np.minimum(pos, have.size - 1)] == rows)
        block[ok] = data[pos[ok]]
    return mx.nd.array(block, dtype=dtype)


class SparsePath:
    """The row_sparse pushes and pulls of a HybridKVStore (a part of it)."""

    def _gather_ids(self, key, ids: np.ndarray, priority: int) -> np.ndarray:
        """Sorted union over the group of every rank's int64 row ids (blocking)."""
        counts = np.zeros(self._group_size, dtype=np.int64)
        counts[self._comm.rank] = ids.size
        counts_nd = mx.nd.array(counts, dtype="int64")
        self.internal_collective(_native.ALLREDUCE, counts_nd, "row counts of key %r" % (key,))
        counts = counts_nd.asnumpy()
        total = int(counts.sum())
        if total == 0:
            return np.zeros((0,), dtype=np.int64)
        start = int(counts[:self._comm.rank].sum())
        all_ids = np.zeros(total, dtype=np.int64)
        all_ids[start:start + ids.size] = ids
        all_nd = mx.nd.array(all_ids, dtype="int64")
        self.internal_collective(_native.ALLREDUCE, all_nd, "row ids of key %r" % (key,))
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
        ids, data = local_rsp_sum(values)
        union = self._gather_ids(key, ids, priority)
        block = np.zeros((union.size,) + shape[1:], dtype=dtype)
        if ids.size:
            block[np.searchsorted(union, ids)] = data
        block_nd = mx.nd.array(block, dtype=dtype)
        if union.size:
            # rows differ from step to step: described by key, not by a fixed layout
            self.internal_collective(_native.ALLREDUCE, block_nd,
                                     "row_sparse gradient of key %r" % (key,))
            self.stats["group_allreduce"] += 1
        if self._owns(key):
            rsp = mx.nd.sparse.row_sparse_array(
                (block_nd, mx.nd.array(union, dtype="int64")), shape=shape, dtype=dtype)
            self._server_call(key, "row_sparse push",
                              lambda: self._dist.push(self._ps_keys.of(key), rsp,
                                                      priority=priority))
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
            outs, ids_list = as_list(outs), as_list(ids)
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
                        self._dist.row_sparse_pull(self._ps_keys.of(k), out=pulled,
                                                   row_ids=mx.nd.array(union, dtype="int64"),
                                                   priority=priority)
                        pulled.wait_to_read()

                    self._server_call(k, "row_sparse_pull", pull_rows)
                    self.stats["server_row_sparse_pull"] += 1
                    if k not in self._ps_errors:
                        block = rows_of(pulled, union, shape, dtype)
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

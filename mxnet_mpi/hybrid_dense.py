"""The hybrid stores' dense path: a key's gradients summed over a rank's
devices and its group by MPI allreduce, the sum pushed to the servers by the
key's owner, the servers' value pulled by the owner and broadcast to its
group; and the initial values, from world rank 0 to every rank and the
servers.
"""

from __future__ import annotations

import mxnet as mx
import numpy as np

from .errors import MPIKVStoreError
from .hybrid_sparse import full_rsp
from .keys import check_key as _check_key
from .pslite_client import server_flight


class DensePath:
    """Dense pushes, pulls and initial values of a HybridKVStore (a part of it)."""

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
            self._server_call(key, "push", lambda: self._dist.push(self._ps_keys.of(key), buf,
                                                                   priority=priority))
            self.stats["server_push_dense"] += 1

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
                    self._dist.row_sparse_pull(self._ps_keys.of(key), out=pulled,
                                               row_ids=all_rows,
                                               priority=priority)
                    pulled.copyto(outs[0])
                    outs[0].wait_to_read()   # a server error surfaces here, not later

                self._server_call(key, "row_sparse_pull", pull_rows)
                self.stats["server_row_sparse_pull"] += 1
            elif key not in self._ps_errors:
                def pull():
                    # a stopped server, scheduler or other group stalls here, and
                    # is reported as such
                    with server_flight(outs[0], "parameter-server pull of key %r (group "
                                        "%d; waits for the servers and every group's push)"
                                        % (key, self._group_id)):
                        self._dist.pull(self._ps_keys.of(key), out=outs[0],
                                        priority=priority)
                    outs[0].wait_to_read()

                self._server_call(key, "pull", pull)
                self.stats["server_pull"] += 1
        self._broadcast_or_fail(key, outs[0], priority)
        self._fan_out(outs[0], outs[1:])

    def _spread_initial(self, key, values: list, rsp_on_server: bool):
        """World rank 0's value into every array of `values`; returns the value
        to initialise the servers with: with `rsp_on_server` a row_sparse array
        holding every row (ps-lite's servers take a row_sparse initial value as
        all rows in order, and row_sparse pushes need a row_sparse stored value)."""
        _check_key(key)
        if np.dtype(values[0].dtype).kind != "f":
            # MXNet's server aborts on them (kvstore_dist_server.h: "only support
            # floating point types"), ending the job with no word from us
            raise MPIKVStoreError(
                "key %r is %s: the parameter servers of kvstore '%s' (MXNet's own server "
                "code) take floating-point arrays only; reduce integer arrays with kvstore "
                "'mpi' or mxnet_mpi.allreduce_" % (key, np.dtype(values[0].dtype), self.type))
        if values[0].stype == "row_sparse":
            dense = values[0].tostype("default")
            self._world_broadcast(key, dense)
            full = full_rsp(dense)
            for v in values:
                full.copyto(v)
        else:
            self._checked(key, values, None, "broadcast")
            self._world_broadcast(key, values[0])
            self._fan_out(values[0], values[1:])
            full = full_rsp(values[0]) if rsp_on_server else values[0]
        if rsp_on_server:
            self._rsp_keys.add(key)
        return full

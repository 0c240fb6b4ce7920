"""The same calls of the horovod.mxnet 0.28.1 API under mxnet_mpi.horovod or
under the real Horovod, recorded as JSON for the test to compare.

  mpirun -np 3 python hvd_parity.py OUT_DIR [--horovod]

Writes OUT_DIR/rank<r>.json: {what: result}. Results are values, types and
error classes, so equal files mean equal behaviour on these calls.
"""

from __future__ import annotations

import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

if "--horovod" in sys.argv:
    import horovod.mxnet as hvd
else:
    import mxnet_mpi.horovod as hvd

OUT = sys.argv[1]
out: dict = {}


def record(what: str, fn) -> None:
    """fn()'s value (arrays as lists with their dtype), or the error's kind
    (MXNetError: ours are MPIKVStoreError, a subclass)."""
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001
        kind = "MXNetError" if isinstance(exc, mx.base.MXNetError) else type(exc).__name__
        out[what] = {"error": kind, "message": str(exc) if kind == "ValueError" else ""}
        mx.nd.waitall()
        return
    out[what] = plain(value)


def plain(value):
    if isinstance(value, mx.nd.NDArray):
        return {"array": value.asnumpy().tolist(), "dtype": str(value.dtype),
                "ctx": str(value.context) if value.context.device_type != "cpu" else "cpu"}
    if isinstance(value, np.ndarray):
        return {"ndarray": value.tolist()}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [plain(v) for v in value]}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


record("size_before_init", hvd.size)
record("rank_before_init", hvd.rank)
record("global_ranks_before_init", lambda: hvd.global_process_set.ranks)
hvd.init(process_sets="dynamic")
R, N = hvd.rank(), hvd.size()
record("queries", lambda: [hvd.size(), hvd.local_size(), hvd.cross_size(), hvd.cross_rank(),
                           hvd.mpi_threads_supported(), hvd.mpi_enabled(), hvd.mpi_built(),
                           hvd.nccl_built(), hvd.cuda_built()])   # gloo_built: as built
record("ops", lambda: [hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product])
record("global_process_set", lambda: [hvd.global_process_set.process_set_id,
                                      hvd.global_process_set.ranks,
                                      hvd.global_process_set.size(),
                                      hvd.global_process_set.rank(),
                                      hvd.global_process_set.included()])
x = mx.nd.array(np.arange(6, dtype=np.float32) * (R + 1) - 4)
for name in ("Average", "Sum", "Min", "Max", "Product"):
    record("allreduce_" + name, lambda name=name: hvd.allreduce(x, op=getattr(hvd, name)))
record("allreduce_int_sum", lambda: hvd.allreduce(mx.nd.array([R, 2 * R], dtype="int32"),
                                                  op=hvd.Sum))
record("allreduce_scaled", lambda: hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5,
                                                 postscale_factor=4.0))
record("grouped_allreduce", lambda: hvd.grouped_allreduce([x, x * 2], op=hvd.Max))
record("allgather", lambda: hvd.allgather(mx.nd.ones((R + 1, 2)) * R))
record("grouped_allgather", lambda: hvd.grouped_allgather([mx.nd.ones((R + 1,)) * R,
                                                           mx.nd.ones((1, 2)) * R]))
splits = [(d + R) % 3 for d in range(N)]
rows = mx.nd.array(np.array([[R * 10 + d] for d in range(N) for _ in range(splits[d])],
                            dtype=np.float32).reshape(-1, 1))
record("alltoall_splits", lambda: hvd.alltoall(rows, splits=splits))
record("alltoall_splits_nd", lambda: hvd.alltoall(rows, splits=mx.nd.array(splits,
                                                                           dtype="int32")))
record("alltoall_equal", lambda: hvd.alltoall(mx.nd.arange(2 * N) + 100 * R))
record("reducescatter_sum", lambda: hvd.reducescatter(mx.nd.arange(2 * N + 1) + R, op=hvd.Sum))
record("reducescatter_avg", lambda: hvd.reducescatter(
    mx.nd.arange(2 * N + 2).reshape((N + 1, 2)) + R))
record("grouped_reducescatter", lambda: hvd.grouped_reducescatter(
    [mx.nd.arange(N) + R, mx.nd.arange(2 * N) * R], op=hvd.Sum))
record("broadcast", lambda: hvd.broadcast(mx.nd.arange(3) + R, root_rank=N - 1))
record("broadcast_object", lambda: hvd.broadcast_object({"r": R, "a": [1, 2]} if R == 1
                                                        else {"r": None, "a": []}, root_rank=1))
record("allgather_object", lambda: hvd.allgather_object({"r": R, "s": "x" * R}))
ps = hvd.add_process_set([0, 2])
record("process_set", lambda: [ps.process_set_id, ps.ranks, ps.size(), ps.included()])
record("process_set_rank", ps.rank)
if ps.included():
    record("set_allreduce", lambda: hvd.allreduce(x, op=hvd.Sum, process_set=ps))
    record("set_allgather", lambda: hvd.allgather(mx.nd.ones((R + 1,)) * R, process_set=ps))
    record("set_broadcast", lambda: hvd.broadcast(mx.nd.ones((2,)) * R, root_rank=2,
                                                  process_set=ps))
    record("set_alltoall", lambda: hvd.alltoall(mx.nd.arange(3) + 10 * R, splits=[1, 2],
                                                process_set=ps))
    record("set_reducescatter", lambda: hvd.reducescatter(mx.nd.arange(4) + R,
                                                          process_set=ps))
else:
    # Horovod refuses it when the op runs (the output array reports it); we, at the call
    record("outside_set", lambda: hvd.allreduce(x, process_set=ps).asnumpy())
p = gluon.Parameter("w", shape=(2,))
p.initialize(mx.init.Constant(1.0), ctx=mx.cpu())
trainer = hvd.DistributedTrainer([p], "sgd", {"learning_rate": 0.5}, process_set=ps)
with autograd.record():
    loss = (p.data() * mx.nd.array([R + 1.0, 2.0 * R])).sum()
loss.backward()
trainer.step(1)
record("trainer_on_set", p.data)
record("remove", lambda: hvd.remove_process_set(ps))
record("removed_id", lambda: ps.process_set_id)
# (not here: adding a set after a removal, which made the real Horovod report
# "Horovod is shutting down" in 1 of 3 runs on this machine; hvd_api.py checks
# the id reuse)
mx.nd.waitall()
os.makedirs(OUT, exist_ok=True)
with open(os.path.join(OUT, "rank%d.json" % R), "w") as f:
    json.dump(out, f, indent=1, sort_keys=True)
print("rank %d wrote %d results" % (R, len(out)), flush=True)

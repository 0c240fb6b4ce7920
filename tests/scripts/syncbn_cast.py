"""net.cast('float16') with SyncBatchNorm, against gluon.nn.BatchNorm on the
concatenated batch in one process: BatchNorm keeps its parameters and
statistics float32 and normalises float16 data in float32; SyncBatchNorm cast
them to float16, and its inference then failed ("requires uniform type").

  mpirun -np 2 python syncbn_cast.py

Prints "CAST <rank> <gamma dtype> <max rel diff: train y, dx, inference y>".
"""

import mxnet as mx
import numpy as np

import mxnet_mpi

rank, size = mxnet_mpi.rank(), mxnet_mpi.size()
rows = [2 + r for r in range(size)]
start = sum(rows[:rank])
rng = np.random.RandomState(7)
X = (rng.randn(sum(rows), 3, 4) * 2 + 1).astype("float16")
W = rng.randn(sum(rows), 3, 4).astype("float16")


def run(layer, x, w):
    layer.initialize()
    layer.cast("float16")
    xa = mx.nd.array(x, dtype="float16")
    xa.attach_grad()
    with mx.autograd.record():
        y = layer(xa)
        loss = (y * mx.nd.array(w, dtype="float16")).sum()
    loss.backward()
    return layer, y.asnumpy(), xa.grad.asnumpy(), layer(xa).asnumpy()


mine = slice(start, start + rows[rank])
ours, y, dx, infer = run(mxnet_mpi.SyncBatchNorm(in_channels=3), X[mine], W[mine])
_, y_ref, dx_ref, infer_ref = run(mx.gluon.nn.BatchNorm(in_channels=3), X, W)


def rel(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


print("CAST %d %s %.3g %.3g %.3g" % (rank, ours.gamma.data().dtype.__name__,
                                     rel(y, y_ref[mine]), rel(dx, dx_ref[mine]),
                                     rel(infer, infer_ref[mine])), flush=True)

"""Rank 0 with an empty batch (mx.np allows one) through SyncBatchNorm,
against gluon.nn.BatchNorm on the concatenated batch in one process: its
NaN mean made every rank's output and statistics NaN, and its backward
failed on the empty arrays.

  mpirun -np 2 python syncbn_empty.py

Prints "EMPTY <rank> <rows> <dtype> <max diff of y, dx and running_mean>".
"""

import mxnet as mx
import numpy as np
from mxnet import npx

npx.set_np()

import mxnet_mpi  # noqa: E402

rank, size = mxnet_mpi.rank(), mxnet_mpi.size()
rows = [0] + [3] * (size - 1)
start = sum(rows[:rank])
X = np.random.RandomState(0).randn(sum(rows), 2, 3).astype(np.float32) * 2 + 1


def run(layer, x, dtype="float32"):
    layer.initialize()
    layer.cast(dtype)
    xa = mx.np.array(x, dtype=dtype)
    xa.attach_grad()
    with mx.autograd.record():
        y = layer(xa)
        loss = (y * y).sum()
    loss.backward()
    return y.asnumpy(), xa.grad.asnumpy(), layer.running_mean.data().asnumpy()


mine = slice(start, start + rows[rank])
# float16 too (the layer then normalises in float32; the empty rank's dx
# came back float32, and its backward failed)
for dtype in ("float32", "float16"):
    got = run(mxnet_mpi.SyncBatchNorm(in_channels=2), X[mine], dtype)
    ref = run(mx.gluon.nn.BatchNorm(in_channels=2), X, dtype)
    diff = max(float(np.abs(got[0] - ref[0][mine]).max(initial=0)),
               float(np.abs(got[1] - ref[1][mine]).max(initial=0)),
               float(np.abs(got[2] - ref[2]).max()))
    print("EMPTY %d %d %s %.3g" % (rank, rows[rank], dtype, diff), flush=True)

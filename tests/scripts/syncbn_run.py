"""mxnet_mpi.SyncBatchNorm against gluon.nn.BatchNorm on the global batch.

  mpirun -np N python syncbn_run.py OUT_DIR        rank r: batch of 2 + 2 r images
  python syncbn_run.py OUT_DIR --reference N      one process, BatchNorm, global batch
  --offset K: inputs of mean about K (spread about 1 + r)
Saves outputs, input gradients, gamma/beta gradients (summed over ranks, as the
Trainer does) and running statistics.
"""

import argparse
import os

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_mpi

ap = argparse.ArgumentParser()
ap.add_argument("out_dir")
ap.add_argument("--reference", type=int, default=0)
ap.add_argument("--offset", type=float, default=0.0)
args = ap.parse_args()
out_dir, ref = args.out_dir, args.reference
C = 3


def batch(r: int):
    rng = np.random.RandomState(10 + r)
    x = (rng.randn(2 + 2 * r, C, 4, 5) * (1 + r) + r + args.offset).astype(np.float32)
    w = rng.randn(2 + 2 * r, C, 4, 5).astype(np.float32)   # loss = sum(y * w)
    return x, w


if ref:
    parts = [batch(r) for r in range(ref)]
    x = mx.nd.array(np.concatenate([p[0] for p in parts]))
    w = mx.nd.array(np.concatenate([p[1] for p in parts]))
    bn = gluon.nn.BatchNorm(in_channels=C, momentum=0.9, epsilon=1e-5)
else:
    R = mxnet_mpi.rank()
    xa, wa = batch(R)
    x, w = mx.nd.array(xa), mx.nd.array(wa)
    bn = mxnet_mpi.SyncBatchNorm(in_channels=C, momentum=0.9, epsilon=1e-5)
bn.initialize()
bn.gamma.set_data(mx.nd.array([1.5, 0.5, -1.0]))
bn.beta.set_data(mx.nd.array([0.1, -0.2, 0.3]))
x.attach_grad()
with autograd.record():
    y = bn(x)
    loss = (y * w).sum()
loss.backward()
result = {"y": y.asnumpy(), "dx": x.grad.asnumpy(),
          "dgamma": bn.gamma.grad().copy(), "dbeta": bn.beta.grad().copy(),
          "running_mean": bn.running_mean.data().asnumpy(),
          "running_var": bn.running_var.data().asnumpy()}
if not ref:
    for k in ("dgamma", "dbeta"):   # what the Trainer's allreduce makes of them
        mxnet_mpi.ops.allreduce_(result[k])
inference = bn(x).asnumpy()   # not recording: running statistics
result = {k: (v.asnumpy() if isinstance(v, mx.nd.NDArray) else v) for k, v in result.items()}
result["inference"] = inference
os.makedirs(out_dir, exist_ok=True)
np.savez(os.path.join(out_dir, "ref.npz" if ref else "rank%d.npz" % mxnet_mpi.rank()), **result)
print("done", flush=True)

"""mxnet_mpi.SyncBatchNorm against gluon.nn.BatchNorm on the global batch.

  mpirun -np N python syncbn_run.py OUT_DIR        rank r: batch of 2 + 2 r images
  python syncbn_run.py OUT_DIR --reference N      one process, BatchNorm, global batch
  --offset K: inputs of mean about K (spread about 1 + r)
  --variants a,b: also these uses of the layer (VARIANTS), each in a fresh layer
--numpy: all of it after npx.set_np(), on mx.np arrays (gluoncv/d2l style)
Saves, per variant, outputs, input gradients, gamma/beta gradients (summed over
ranks, as the Trainer does) and running statistics.
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
ap.add_argument("--variants", default="plain")
ap.add_argument("--numpy", action="store_true")
args = ap.parse_args()
if args.numpy:
    mx.npx.set_np()
array = mx.np.array if args.numpy else mx.nd.array
out_dir, ref = args.out_dir, args.reference
C = 3


def batch(r: int):
    rng = np.random.RandomState(10 + r)
    x = (rng.randn(2 + 2 * r, C, 4, 5) * (1 + r) + r + args.offset).astype(np.float32)
    w = rng.randn(2 + 2 * r, C, 4, 5).astype(np.float32)   # loss = sum(y * w)
    return x, w


# plain: x needs a gradient. frozen_input: it needs none (the layer on data, or
# after frozen layers). frozen_gamma: gamma's grad_req is 'null'. scale_false:
# scale=False with gamma holding values other than 1 (as BatchNorm, they are
# ignored). accumulate: grad_req='add' everywhere, two backward passes.
VARIANTS = ("plain", "frozen_input", "frozen_gamma", "scale_false", "accumulate")


def run(variant: str) -> dict:
    if ref:
        parts = [batch(r) for r in range(ref)]
        x = array(np.concatenate([p[0] for p in parts]))
        w = array(np.concatenate([p[1] for p in parts]))
        layer = gluon.nn.BatchNorm
    else:
        xa, wa = batch(mxnet_mpi.rank())
        x, w = array(xa), array(wa)
        layer = mxnet_mpi.SyncBatchNorm
    bn = layer(in_channels=C, momentum=0.9, epsilon=1e-5, scale=variant != "scale_false")
    bn.initialize()
    bn.gamma.set_data(array([1.5, 0.5, -1.0]))
    bn.beta.set_data(array([0.1, -0.2, 0.3]))
    if variant == "frozen_gamma":
        bn.gamma.grad_req = "null"
    if variant == "accumulate":
        bn.collect_params().setattr("grad_req", "add")
    if variant != "frozen_input":
        x.attach_grad(grad_req="add" if variant == "accumulate" else "write")
    with autograd.train_mode():   # not recorded: BatchNorm keeps its running statistics
        bn(x)
    for _ in range(2 if variant == "accumulate" else 1):
        with autograd.record():
            y = bn(x)
            loss = (y * w).sum()
        loss.backward()
    assert isinstance(y, mx.np.ndarray) == args.numpy, type(y)
    result = {"y": y.asnumpy(), "running_mean": bn.running_mean.data().asnumpy(),
              "running_var": bn.running_var.data().asnumpy()}
    if variant != "frozen_input":
        result["dx"] = x.grad.asnumpy()
    for name, p in (("dgamma", bn.gamma), ("dbeta", bn.beta)):
        if p.grad_req != "null":
            grad = p.grad().copy()
            if not ref:   # what the Trainer's allreduce makes of it
                mxnet_mpi.ops.allreduce_(grad)
            result[name] = grad.asnumpy()
    result["inference"] = bn(x).asnumpy()   # not recording: running statistics
    return result


os.makedirs(out_dir, exist_ok=True)
try:
    for variant in args.variants.split(","):
        name = ("ref_%s.npz" if ref else "rank%d_%%s.npz" % mxnet_mpi.rank()) % variant
        np.savez(os.path.join(out_dir, name), **run(variant))
finally:
    mx.npx.reset_np()   # a pooled process runs other scripts next
print("done", flush=True)

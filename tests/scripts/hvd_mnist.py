"""Horovod's MXNet Gluon MNIST example (horovod/examples/mxnet), with synthetic
data and a few steps, and only the import line changed:

    import mxnet_mpi.horovod as hvd          # was: import horovod.mxnet as hvd

  mpirun -np N python hvd_mnist.py OUT_DIR [--fp16] [--optimizer]
  python hvd_mnist.py OUT_DIR --reference N     (one process on the global batch)
  mpirun -np N python hvd_mnist.py OUT_DIR --horovod   (the real horovod.mxnet)
Saves OUT_DIR/rank<r>.npz (or ref.npz) with the final weights; --reference also
OUT_DIR/init.npz, the initial ones.
"""

import argparse
import os

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

ap = argparse.ArgumentParser()
ap.add_argument("outdir")
ap.add_argument("--reference", type=int, default=0)
ap.add_argument("--fp16", action="store_true", help="Compression.fp16")
ap.add_argument("--optimizer", action="store_true", help="DistributedOptimizer + an updater")
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--horovod", action="store_true", help="the real horovod.mxnet, unchanged")
args = ap.parse_args()

if args.reference:
    rank, size = 0, args.reference
else:
    if args.horovod:
        import horovod.mxnet as hvd
    else:
        import mxnet_mpi.horovod as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
batch_size, lr = 8, 0.01


def conv_nets():
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Conv2D(channels=4, kernel_size=5, activation="relu"))
        net.add(gluon.nn.MaxPool2D(pool_size=2, strides=2))
        net.add(gluon.nn.Conv2D(channels=6, kernel_size=3, activation="relu"))
        net.add(gluon.nn.MaxPool2D(pool_size=2, strides=2))
        net.add(gluon.nn.Flatten())
        net.add(gluon.nn.Dense(32, activation="relu"))
        net.add(gluon.nn.Dense(10))
    return net


def batch(step: int, r: int):
    rng = np.random.RandomState(1000 * step + r)
    return (mx.nd.array(rng.rand(batch_size, 1, 28, 28).astype(np.float32)),
            mx.nd.array(rng.randint(0, 10, batch_size).astype(np.float32)))


mx.random.seed(42 + rank)    # ranks start from different weights: broadcast must fix it
model = conv_nets()
model.initialize(mx.init.Xavier(magnitude=2.24), ctx=mx.cpu())
params = model.collect_params()
opt_params = {"learning_rate": lr * size, "momentum": 0.9}
if args.reference:
    mx.random.seed(42)   # rank 0's initial weights
    model = conv_nets()
    model.initialize(mx.init.Xavier(magnitude=2.24), ctx=mx.cpu())
    params = model.collect_params()
    trainer = gluon.Trainer(params, "sgd", opt_params, kvstore=None)
    model(batch(0, 0)[0])   # shapes known: the initial weights, to see that training moved them
    os.makedirs(args.outdir, exist_ok=True)
    np.savez(os.path.join(args.outdir, "init.npz"),
             **{k.split("_", 1)[1]: v.data().asnumpy() for k, v in params.items()})
else:
    hvd.broadcast_parameters(params, root_rank=0)     # deferred: broadcast at first forward
    if args.optimizer:
        # as Horovod's Module examples use it: the optimizer's rescale_grad is
        # 1/batch, the wrapper sums gradients over ranks and divides by size()
        opt = hvd.DistributedOptimizer(mx.optimizer.create(
            "sgd", rescale_grad=1.0 / batch_size, **opt_params))
        updater = mx.optimizer.get_updater(opt)
        trainer = None
    else:
        compression = hvd.Compression.fp16 if args.fp16 else hvd.Compression.none
        trainer = hvd.DistributedTrainer(params, "sgd", opt_params, compression=compression)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
for step in range(args.steps):
    if args.reference:
        parts = [batch(step, r) for r in range(size)]
        data = mx.nd.concat(*[p[0] for p in parts], dim=0)
        label = mx.nd.concat(*[p[1] for p in parts], dim=0)
        n = batch_size * size
    else:
        data, label = batch(step, rank)
        n = batch_size
    with autograd.record():
        loss = loss_fn(model(data), label)
    loss.backward()
    if trainer is not None:
        trainer.step(n)
    else:
        for i, p in enumerate(params.values()):
            updater(i, p.grad(), p.data())
os.makedirs(args.outdir, exist_ok=True)
np.savez(os.path.join(args.outdir, "ref.npz" if args.reference else "rank%d.npz" % rank),
         **{k.split("_", 1)[1]: v.data().asnumpy() for k, v in params.items()})
print("rank %d done" % rank, flush=True)

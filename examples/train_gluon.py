"""Data-parallel Gluon training with kvstore='mpi' on generated data.

    mpirun -np 2 python examples/train_gluon.py --steps 20

Every rank draws its own shard of a generated classification problem and
initialises its weights from a different seed; the store broadcasts rank 0's
weights and sums gradients, so all ranks hold the same weights after every
step. The script checks that at the end and exits non-zero if not.
"""

from __future__ import annotations

import argparse
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_mpi


def make_data(n: int, dim: int, classes: int, seed: int = 0):
    """A fixed, learnable problem: labels from a random linear teacher."""
    rng = np.random.RandomState(seed)
    x = rng.randn(n, dim).astype(np.float32)
    teacher = rng.randn(dim, classes).astype(np.float32)
    y = (x @ teacher).argmax(axis=1).astype(np.float32)
    return x, y


def build_net(classes: int) -> gluon.HybridBlock:
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(64, activation="relu"),  # deferred init: in_units unknown
            gluon.nn.Dense(64, activation="relu"),
            gluon.nn.Dense(classes))
    return net


def weights_checksum(net) -> np.ndarray:
    return np.array([p.data().asnumpy().astype(np.float64).sum()
                     for p in net.collect_params().values()])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvstore", default="mpi", help="mpi, mpi_chained, ... or an MXNet store")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--hybridize", action="store_true")
    args = ap.parse_args()

    rank, size = mxnet_mpi.rank(), mxnet_mpi.size()
    x, y = make_data(4096, 32, 10)
    mx.random.seed(1000 + rank)  # different on purpose: rank 0's weights must win
    net = build_net(10)
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    if args.hybridize:
        net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": args.lr, "momentum": 0.9},
                            kvstore=args.kvstore)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    b = args.batch_size
    if rank == 0:
        print("kvstore=%s ranks=%d per-rank batch=%d" % (args.kvstore, size, b), flush=True)
    t0 = time.time()
    for step in range(args.steps):
        lo = ((step * size + rank) * b) % (len(x) - b)
        data, label = mx.nd.array(x[lo:lo + b]), mx.nd.array(y[lo:lo + b])
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(b)
        mean_loss = loss.mean().asscalar()
        if rank == 0:
            print("step %3d  loss %.4f" % (step, mean_loss), flush=True)
    mx.nd.waitall()
    elapsed = time.time() - t0

    # Sync check: every rank compares its weights' checksums with rank 0's.
    mine = mx.nd.array(weights_checksum(net), dtype="float64")
    ref = mx.nd.zeros_like(mine)
    kv = mx.kv.create("mpi")
    kv.broadcast("checksum", mine, out=ref)
    in_sync = bool(np.array_equal(mine.asnumpy(), ref.asnumpy()))
    flag = mx.nd.array([0 if in_sync else 1], dtype="int32")
    kv.pushpull("out_of_sync", flag)
    ranks_out = int(flag.asscalar())
    if rank == 0:
        print("%d steps in %.2fs; ranks out of sync: %d of %d -> %s"
              % (args.steps, elapsed, ranks_out, size, "IN SYNC" if ranks_out == 0 else "DIVERGED"),
              flush=True)
    if ranks_out:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

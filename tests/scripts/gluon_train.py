"""Train a small Gluon net and save the weights after every step, per rank.

Modes:
  --kvstore mpi|mpi_<mode>   under mpirun; kvstore passed to Trainer as a string
  --kvstore dist_sync        as a ps-lite worker (DMLC_* env set by the test)
  --reference N              one process, no kvstore, on the N rank shards
                             concatenated (the expected result)
Each step every rank (of N) uses its own slice of a global batch; the optimizer
is SGD with momentum and weight decay (--lamb-fp16: float16 weights and LAMB
with multi_precision); trainer.step(per-rank batch).
"""

import argparse
import json
import os
import socket
import threading

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_mpi

ap = argparse.ArgumentParser()
ap.add_argument("--kvstore", default="mpi")
ap.add_argument("--reference", type=int, default=0)
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--outdir", required=True)
ap.add_argument("--same-seed", action="store_true", help="all ranks init identically")
ap.add_argument("--hybridize", action="store_true")
ap.add_argument("--lamb-fp16", action="store_true")
args = ap.parse_args()

if args.reference:
    rank, size, kvstore = 0, args.reference, None
elif args.kvstore.startswith("dist"):
    kvstore = mx.kv.create(args.kvstore)
    rank, size = kvstore.rank, kvstore.num_workers
else:
    rank, size, kvstore = mxnet_mpi.rank(), mxnet_mpi.size(), args.kvstore

rng = np.random.RandomState(42)
X = rng.randn(args.steps, size, args.batch, 5).astype(np.float32)
Y = rng.randint(0, 3, size=(args.steps, size, args.batch)).astype(np.float32)



class Elementwise(gluon.HybridBlock):
    """A dense layer from elementwise ops: MXNet trains float16 ones on CPU
    (its FullyConnected cannot)."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(5, units))
            self.bias = self.params.get("bias", shape=(units,))

    def hybrid_forward(self, F, x, weight, bias):
        h = F.sum(F.broadcast_mul(F.expand_dims(x, 2), F.expand_dims(weight, 0)), axis=1)
        return F.broadcast_add(F.tanh(h), bias)


mx.random.seed(1000 if (args.same_seed or args.reference) else 1000 + rank)
net = gluon.nn.HybridSequential()
if args.lamb_fp16:
    net.add(Elementwise(3))
else:
    net.add(gluon.nn.Dense(16, activation="tanh"),          # deferred init
            gluon.nn.Dense(8, in_units=16, activation="tanh"),  # initialised at once
            gluon.nn.Dense(3))
net.initialize(mx.init.Uniform(0.5))
if args.hybridize:
    net.hybridize()
dtype = "float16" if args.lamb_fp16 else "float32"
if args.lamb_fp16:
    net.cast(dtype)
    optimizer = "lamb", {"learning_rate": 0.05, "wd": 1e-3, "multi_precision": True}
else:
    optimizer = "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}
trainer = gluon.Trainer(net.collect_params(), *optimizer, kvstore=kvstore)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

saved = {}
for step in range(args.steps):
    if args.reference:
        x = X[step].reshape(-1, 5)
        y = Y[step].reshape(-1)
    else:
        x, y = X[step, rank], Y[step, rank]
    with autograd.record():
        loss = loss_fn(net(mx.nd.array(x, dtype=dtype)), mx.nd.array(y, dtype=dtype))
    loss.backward()
    trainer.step(args.batch)
    for i, p in enumerate(net.collect_params().values()):
        saved["s%d_p%d" % (step, i)] = p.data().asnumpy().astype("float32")

os.makedirs(args.outdir, exist_ok=True)
np.savez(os.path.join(args.outdir, "rank%d.npz" % rank), **saved)
print("rank %d of %d done" % (rank, size), flush=True)


def comm_thread_nice() -> list:
    """The nice values of the store's communicating threads (Linux /proc)."""
    nice = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/comm" % task) as f:
                if f.read().strip() in ("mxmpi-funneled", "mxmpi-lane"):
                    nice.append(os.getpriority(os.PRIO_PROCESS, int(task)))
        except OSError:   # the thread ended meanwhile
            pass
    return nice


def may_raise_priority() -> bool:
    """Whether this process may give a thread a negative nice value."""
    got = []

    def probe() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -1)
            got.append(True)
        except OSError:
            got.append(False)
    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return got[0]


if not (args.reference or args.kvstore.startswith("dist")):   # where MPI placed this rank
    print("PLACED " + json.dumps([rank, size, mxnet_mpi.local_rank(), mxnet_mpi.local_size(),
                                  socket.gethostname(), comm_thread_nice(),
                                  may_raise_priority(),
                                  getattr(getattr(trainer._kvstore, "stream", None),
                                          "p2p_bytes", None)]),
          flush=True)

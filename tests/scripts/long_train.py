"""Train a tiny Gluon net for many steps, slowly, so that a test can break
something mid-training (kill a host, pull a cable).

  python long_train.py --kvstore mpi|dist_sync_mpi --steps N --sleep S
Prints 'READY <rank>' after the first step, 'STEP <i>' (rank 0) after each
step and 'DONE <rank>' at the end.
"""

import argparse
import time

import mxnet as mx
from mxnet import autograd, gluon

import mxnet_mpi

ap = argparse.ArgumentParser()
ap.add_argument("--kvstore", default="mpi")
ap.add_argument("--steps", type=int, default=1000)
ap.add_argument("--sleep", type=float, default=0.05)
args = ap.parse_args()

rank = mxnet_mpi.rank()
net = gluon.nn.Dense(4, in_units=8)
net.initialize(mx.init.Constant(0.01))
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01},
                        kvstore=args.kvstore)
x, y = mx.nd.ones((2, 8)) * (rank + 1), mx.nd.ones((2, 4))
for step in range(args.steps):
    with autograd.record():
        loss = ((net(x) - y) ** 2).sum()
    loss.backward()
    trainer.step(2)
    net.weight.data().wait_to_read()
    if step == 0:
        print("READY %d" % rank, flush=True)
    if rank == 0:
        print("STEP %d" % step, flush=True)
    time.sleep(args.sleep)
print("DONE %d" % rank, flush=True)

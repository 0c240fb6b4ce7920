"""Checkpoint and resume: train N steps, or train K steps, save (rank 0),
then in a new job load on all ranks and train N-K more. Saves final weights.

  resume.py full   OUTDIR N
  resume.py first  OUTDIR K      (writes OUTDIR/ckpt.params, ckpt.states)
  resume.py second OUTDIR N-K
"""

import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_mpi

phase, outdir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
rank, size = mxnet_mpi.rank(), mxnet_mpi.size()
offset = int(os.environ.get("STEP_OFFSET", "0"))
mx.random.seed(10 + rank)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(2))
net.initialize(mx.init.Uniform(0.3))
net(mx.nd.zeros((1, 4)))  # finish deferred init so parameters can be loaded
trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01}, kvstore="mpi")
ckpt = os.path.join(outdir, "ckpt")
if phase == "second":
    net.load_parameters(ckpt + ".params")
    trainer.load_states(ckpt + ".states")
rng = np.random.RandomState(3)
X = rng.randn(64, size, 4, 4).astype(np.float32)
loss_fn = gluon.loss.L2Loss()
for step in range(offset, offset + steps):
    x = mx.nd.array(X[step, rank])
    with autograd.record():
        loss = loss_fn(net(x), x[:, :2])
    loss.backward()
    trainer.step(4)
mx.nd.waitall()
if phase == "first" and rank == 0:
    net.save_parameters(ckpt + ".params")
    trainer.save_states(ckpt + ".states")
weights = {k: v.data().asnumpy() for k, v in net.collect_params().items()}
np.savez(os.path.join(outdir, "%s_rank%d.npz" % (phase, rank)), **weights)

"""join() with uneven data keeps the program's optimizer and lr_scheduler on
every rank: it copies the latest rank's optimizer states and counts into them
(a copy of that rank's optimizer took their place on the others, so the
program's later scheduler change reached one rank only: a settings error).

  mpirun -np 2 python join_held_optimizer.py OPTIMIZER
OPTIMIZER sgd (momentum) or nadam (its m_schedule advances with each update,
on the optimizer object: the latest rank's must come with the states).
Prints "RANK <r> kept <bool> alike <bool> num_update <n>".
"""

import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_mpi

R = mxnet_mpi.rank()
net = gluon.nn.Dense(2, in_units=3)
net.initialize(mx.init.Xavier())
sched = mx.lr_scheduler.FactorScheduler(step=1000, base_lr=0.1)
params = {"lr_scheduler": sched, **({"momentum": 0.9} if sys.argv[1] == "sgd" else {})}
tr = gluon.Trainer(net.collect_params(), sys.argv[1], params, kvstore="mpi")
held = tr._optimizer
x = mx.nd.array(np.full((2, 3), R + 1.0))


def step() -> None:
    with autograd.record():
        loss = net(x).sum()
    loss.backward()
    tr.step(2)


for _ in range(3 if R == 0 else 1):   # rank 1 runs out of data first
    step()
mxnet_mpi.join(tr)
kept = tr._optimizer is held and tr._updaters[0].optimizer is held and held.lr_scheduler is sched
sched.base_lr = 0.05   # the program's plateau rule, on every rank
for _ in range(2):
    step()
mx.nd.waitall()
w = net.weight.data().asnumpy().ravel()
every = mx.nd.zeros((mxnet_mpi.size(), w.size))
every[R] = mx.nd.array(w)
tr._kvstore.pushpull("w", every)
rows = every.asnumpy()
print("RANK %d kept %s alike %s num_update %d"
      % (R, kept, bool((rows == rows[0]).all()), held.num_update), flush=True)

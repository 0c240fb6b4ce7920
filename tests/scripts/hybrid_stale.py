"""A hybrid store whose servers update (update_on_kvstore=True, its default),
2 groups of 1 rank, SGD with momentum and weight decay: heads that only some
ranks' batches use, with ignore_stale_grad=True, for 3 steps. Prints
`STALE_UOK rank <r> maxdiff <d>`: the largest difference of this rank's
weights from one process that sums both ranks' losses and steps with
ignore_stale_grad=True (a stale gradient adds nothing, and a parameter no
batch used is not updated: no momentum, no weight decay)."""

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_mpi

rank, size = mxnet_mpi.rank(), mxnet_mpi.size()
OPT = {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.1}


def model(value: float):
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(2, in_units=3))                 # no batch uses it
    for _ in range(3):                                     # head r: rank r's batches
        net.add(gluon.nn.Dense(1, in_units=3, use_bias=False))
    net.initialize(mx.init.Constant(value))
    return net


def data(r: int, step: int):
    return mx.nd.array(np.random.RandomState(100 * step + r).randn(4, 3))


def head(step: int, r: int) -> int:
    return 1 + (r + step) % 2      # the third head: no batch, ever


net = model(0.1 * (rank + 1))      # rank 0's weights go to every rank
trainer = gluon.Trainer(net.collect_params(), "sgd", OPT, kvstore="dist_sync_mpi")
ref = model(0.1)
ref_trainer = gluon.Trainer(ref.collect_params(), "sgd", OPT, kvstore=None)
for step in range(3):
    with autograd.record():
        loss = net[head(step, rank)](data(rank, step)).sum()
    loss.backward()
    trainer.step(4, ignore_stale_grad=True)
    with autograd.record():
        total = sum(ref[head(step, r)](data(r, step)).sum() for r in range(size))
    total.backward()
    ref_trainer.step(4, ignore_stale_grad=True)
diff = max(float(np.abs(a.data().asnumpy() - b.data().asnumpy()).max())
           for a, b in zip(net.collect_params().values(), ref.collect_params().values()))
moved = not np.allclose(net[1].weight.data().asnumpy(), 0.1)
print("STALE_UOK rank %d maxdiff %r moved %s" % (rank, diff, moved), flush=True)

"""A hybrid store with local updates (update_on_kvstore=False: the servers
only sum): weights set on the last rank only, in another group than rank 0,
are refused at the next step on every rank, compared over the whole world.
Prints `REFUSED <first line>` or `NOT REFUSED`, then `WEIGHTS <digest>`."""

import hashlib

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_mpi

rank, size = mxnet_mpi.rank(), mxnet_mpi.size()
net = gluon.nn.Dense(2, in_units=3)
net.initialize(mx.init.Constant(0.1 * (rank + 1)))
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                        kvstore="dist_sync_mpi", update_on_kvstore=False)
x = mx.nd.array(np.random.RandomState(rank).randn(4, 3))


def step() -> None:
    with autograd.record():
        loss = (net(x) ** 2).sum()
    loss.backward()
    trainer.step(4)
    mx.nd.waitall()


step()
if rank == size - 1:
    net.weight.set_data(mx.nd.full((2, 3), 5.0))
try:
    step()
except mxnet_mpi.MPIKVStoreError as e:
    print("REFUSED %s" % str(e).splitlines()[0], flush=True)
else:
    print("NOT REFUSED", flush=True)
mxnet_mpi.check_consistency(trainer, action="broadcast")
step()
print("WEIGHTS %s" % hashlib.sha256(net.weight.data().asnumpy().tobytes()).hexdigest(),
      flush=True)

"""A frozen Embedding(sparse_grad=True) (grad_req 'null') under kvstore='mpi':
no row_sparse gradient exists, so the Trainer trains as with a dense-gradient
Embedding (it was refused at Trainer creation); unfreezing it later is refused
at the step, naming the parameter.

  mpirun -np N python frozen_sparse.py
Prints "RESULT <rank> same=<bool> unfrozen=<message>".
"""

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_mpi

R = mxnet_mpi.rank()


def train(sparse: bool, unfreeze_at: int | None = None):
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Embedding(20, 4, sparse_grad=sparse),
            gluon.nn.Dense(3, flatten=True, in_units=12))
    mx.random.seed(1)
    net.initialize()
    net[0].collect_params().setattr("grad_req", "null")
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore="mpi")
    x = mx.nd.array(np.random.RandomState(R).randint(0, 20, (4, 3)))
    for step in range(3):
        if step == unfreeze_at:
            net[0].collect_params().setattr("grad_req", "write")
        with autograd.record():
            loss = net(x).sum()
        loss.backward()
        trainer.step(4)
    return net[1].weight.data().asnumpy()


same = np.array_equal(train(sparse=True), train(sparse=False))
try:
    train(sparse=True, unfreeze_at=2)
    unfrozen = "trained"
except mxnet_mpi.MPIKVStoreError as exc:
    unfrozen = "refused:" + ("embedding" in str(exc) and "row_sparse" in str(exc)).__repr__()
mx.nd.waitall()
print("RESULT %d same=%s unfrozen=%s" % (R, same, unfrozen), flush=True)

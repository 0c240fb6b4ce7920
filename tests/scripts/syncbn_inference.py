"""Rank 0 runs a SyncBatchNorm layer in training (autograd.record()), the
other ranks in inference: the layer's first training forward has no partner.
Rank 0 must name it and the job end at once (it waited in MPI's creation of
the layer's channels, which no stall check watches, until the other ranks'
exit wait gave up: 10 minutes by default, naming only rank 0)."""

import mxnet as mx
import numpy as np
from mxnet import autograd

import mxnet_mpi

rank = mxnet_mpi.rank()
net = mx.gluon.nn.Sequential()
net.add(mx.gluon.nn.Dense(4, in_units=3), mxnet_mpi.SyncBatchNorm(in_channels=4))
net.initialize()
x = mx.nd.array(np.random.RandomState(rank).randn(4, 3))
if rank == 0:
    with autograd.record():
        y = net(x)
    y.backward()
else:
    y = net(x)
print("rank %d out %s" % (rank, y.asnumpy().shape), flush=True)

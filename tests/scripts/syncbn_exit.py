"""A SyncBatchNorm backward still queued when the script ends (a slow op
between the loss and the layer's backward; nothing waits). The backward
pushes its sums from a callback the engine runs later: the rank announced
its end without them, and its peer, waiting on them, aborted the job (status
4, "finished its program ... call join()").

  mpirun -np 2 python syncbn_exit.py

Prints "END <rank>" and exits 0.
"""

import mxnet as mx
import numpy as np

import mxnet_mpi

rank = mxnet_mpi.rank()
bn = mxnet_mpi.SyncBatchNorm(in_channels=3)
bn.initialize()
x = mx.nd.array(np.random.RandomState(rank).randn(4, 3, 5))
big = mx.nd.ones((1500, 1500))
with mx.autograd.record():
    loss = bn(x).sum() * mx.nd.dot(big, big).sum()
loss.backward()
print("END %d" % rank, flush=True)

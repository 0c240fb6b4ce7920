"""MXNet's own parameter server (dist_sync / dist_async) run through the
runner, with the Trainer kept alive until the interpreter exits by another
module (as training wrappers and callbacks keep it).

  python -m mxnet_mpi.launch -n 2 --groups 2 --servers 1 -- python ps_exit.py KVSTORE
The loss is linear in the weights, so the final weights do not depend on the
order the servers apply the pushes in (dist_async too): 4 steps of plain SGD
(lr 0.25) from weights 0.5 and biases 0 give every rank a weight sum of -30
and a bias sum of -6, printed as 'FINAL <rank> <weight sum> <bias sum>'.
On dist_sync a 5th step follows that rank 0 leaves queued at its exit; rank 1
waits for it and prints 'AFTER5 1 -39 -7.5'.
"""

import importlib
import os
import sys

import mxnet as mx
from mxnet import autograd, gluon

# A module that outlives the script (imported after mxnet, as usual): it holds
# the Trainer until the interpreter exits.
_keeper = importlib.import_module("_keeper")

kvstore = sys.argv[1]
net = gluon.nn.Dense(3, in_units=4)
net.initialize(mx.init.Constant(0.5))
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.25}, kvstore=kvstore)
_keeper.KEEP.append(trainer)
mpi_rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
for _step in range(4):
    x = mx.nd.ones((2, 4)) * (mpi_rank + 1)
    with autograd.record():
        out = net(x).sum()
    out.backward()
    trainer.step(2)
kv = trainer._kvstore
mx.nd.waitall()   # every push sent
kv._barrier()     # and applied on the servers
for i, param in enumerate(trainer._params):
    kv.pull(i, out=param.list_data(), priority=-i)
print("FINAL %d %.6f %.6f" % (mpi_rank, net.weight.data().sum().asscalar(),
                              net.bias.data().sum().asscalar()), flush=True)

if kvstore == "dist_sync":
    # A 5th step that rank 0 leaves queued when its script ends: its input
    # waits for ~1 GFLOP x 12 of exact work (ones stay ones). MXNet's exit
    # handler skips queued operations, so without mxnet_mpi's drain at exit
    # rank 0's pushes would never be sent and rank 1, whose pushes were sent,
    # would wait forever for the servers to merge them.
    x = mx.nd.ones((2, 4)) * (mpi_rank + 1)
    if mpi_rank == 0:
        slow = mx.nd.ones((800, 800))
        for _ in range(12):
            slow = mx.nd.dot(slow, slow) / 800
        x = x * slow[:2, :4]
    with autograd.record():
        out = net(x).sum()
    out.backward()
    trainer.step(2)
    if mpi_rank == 1:
        mx.nd.waitall()   # the pull of step 5 needs rank 0's pushes merged
        print("AFTER5 %d %.6f %.6f" % (mpi_rank, net.weight.data().sum().asscalar(),
                                       net.bias.data().sum().asscalar()), flush=True)

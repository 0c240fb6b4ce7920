"""Trainer + mxnet_mpi.horovod.DistributedOptimizer: optimizer states saved on
one number of ranks and loaded on another (a resume on another allocation).

  mpirun -np N python hvd_states.py FILE save|load|fresh [set01]

save: one step, then rank 0 writes FILE (trainer.save_states); load: load FILE,
then one step; fresh: one step with no file. Prints one JSON line per rank:
the weight's first row, and whether this rank is in the optimizer's set.
The loaded optimizer kept the saving job's process set (on more ranks, the
extra ones stepped alone) and its rescale_grad (1/2 on one rank). set01: the
saving job's optimizer runs on process set [0, 1] (loaded where [0, 1] is the
whole job, it could not be loaded at all).
"""

from __future__ import annotations

import json
import sys

import mxnet as mx
from mxnet import autograd, gluon

import mxnet_mpi.horovod as hvd

path, what = sys.argv[1], sys.argv[2]
hvd.init()
net = gluon.nn.Dense(2, in_units=3)
net.initialize(mx.init.Constant(0.1))
ps = hvd.add_process_set([0, 1]) if sys.argv[3:] == ["set01"] else hvd.global_process_set
trainer = gluon.Trainer(net.collect_params(),
                        hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1),
                                                 process_set=ps),
                        kvstore=None)
if what == "load":
    trainer.load_states(path)
x = mx.nd.ones((2, 3)) * (hvd.rank() + 1)
with autograd.record():
    loss = net(x).sum()
loss.backward()
trainer.step(2)
if what == "save" and hvd.rank() == 0:
    trainer.save_states(path)
print(json.dumps({"rank": hvd.rank(), "weight": net.weight.data().asnumpy()[0].tolist(),
                  "included": trainer._optimizer._process_set.included()}), flush=True)

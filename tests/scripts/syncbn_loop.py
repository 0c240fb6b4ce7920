"""Several SyncBatchNorm layers trained for some steps with no sync point in
the loop (no asnumpy, no waitall): must finish, with the same weights on every
rank. `mpirun -np N python syncbn_loop.py STEPS`; prints "SYNCBN_LOOP <rank> <checksum>"."""

import sys

import mxnet as mx
import numpy as np

import mxnet_mpi

steps = int(sys.argv[1])
net = mx.gluon.nn.Sequential()
for _ in range(4):
    net.add(mx.gluon.nn.Dense(16, in_units=16), mxnet_mpi.SyncBatchNorm(in_channels=16),
            mx.gluon.nn.Activation("relu"))
mx.random.seed(3)
net.initialize(mx.init.Xavier())
trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05}, kvstore="mpi")
rng = np.random.RandomState(mxnet_mpi.rank())
for _step in range(steps):
    x = mx.nd.array(rng.rand(6 + mxnet_mpi.rank(), 16))
    with mx.autograd.record():
        loss = (net(x) ** 2).mean()
    loss.backward()
    trainer.step(1)
total = sum(float(p.data().abs().sum().asscalar()) for p in net.collect_params().values()
            if "running" not in p.name)
print("SYNCBN_LOOP %d %.9g" % (mxnet_mpi.rank(), total), flush=True)

"""Nadam in one process whose parameters move to another device after the
first step (reset_ctx); prints the weights as one JSON line. With mxnet_mpi's
mends in (the start-up hook) it must update as MXNet alone does
(MXNET_MPI_AUTOLOAD=0): an earlier mend froze m_schedule after the move."""

import json

import mxnet as mx
import numpy as np

net = mx.gluon.nn.Dense(3, in_units=5)
net.initialize(mx.init.Constant(0.2), ctx=mx.cpu(0))
trainer = mx.gluon.Trainer(net.collect_params(), "nadam", {"learning_rate": 0.05})
x = np.random.RandomState(0).randn(5, 4, 5).astype("f4")
for step in range(5):
    if step == 1:
        net.collect_params().reset_ctx(mx.cpu(1))
    ctx = mx.cpu(0) if step == 0 else mx.cpu(1)
    with mx.autograd.record():
        loss = (net(mx.nd.array(x[step], ctx=ctx)) ** 2).sum()
    loss.backward()
    trainer.step(4)
print(json.dumps(np.concatenate([p.data(ctx).asnumpy().ravel()
                                 for p in net.collect_params().values()]).tolist()))

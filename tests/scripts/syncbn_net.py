"""A small residual convnet with five mxnet_mpi.SyncBatchNorm layers (oneDNN
convolutions between them) against the same net with gluon.nn.BatchNorm in one
process on the global batch: every parameter's gradient of the first step
(summed over ranks) and the weights after a few SGD steps.

  mpirun -np N python syncbn_net.py OUT_DIR [--devices D [--sequential]]
                          rank r: batch of 3 + 2 r images, split unevenly over D CPU devices
                          (D a list "2,1": rank r's count is its r-th item)
                          (--sequential: one backward() per device, else one for all)
  python syncbn_net.py OUT_DIR --reference N    one process, BatchNorm, global batch
"""

import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_mpi

out_dir = sys.argv[1]
ref = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--reference" else 0
devices = sys.argv[sys.argv.index("--devices") + 1] if "--devices" in sys.argv else "1"
# "2,1": this rank's count from a list by rank (ranks with different numbers of devices)
devices = int(devices.split(",")[0 if ref else mxnet_mpi.rank()] if "," in devices else devices)
sequential = "--sequential" in sys.argv
ctx = [mx.cpu(i) for i in range(devices)]
STEPS = 3
Norm = gluon.nn.BatchNorm if ref else mxnet_mpi.SyncBatchNorm


class Residual(gluon.Block):
    def __init__(self, c: int, **kwargs) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.body = gluon.nn.Sequential()
            self.body.add(gluon.nn.Conv2D(c, 3, padding=1, in_channels=c), Norm(in_channels=c),
                          gluon.nn.Activation("relu"),
                          gluon.nn.Conv2D(c, 3, padding=1, in_channels=c), Norm(in_channels=c))

    def forward(self, x):
        return mx.nd.relu(self.body(x) + x)


net = gluon.nn.Sequential()
net.add(gluon.nn.Conv2D(8, 3, padding=1, in_channels=3), Norm(in_channels=8),
        gluon.nn.Activation("relu"), Residual(8),
        gluon.nn.Conv2D(16, 3, strides=2, padding=1, in_channels=8), Norm(in_channels=16),
        gluon.nn.Activation("relu"), gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(5, in_units=16))
mx.random.seed(7)
net.initialize(mx.init.Xavier(), ctx=ctx)
params = net._collect_params_with_prefix()


def batch(step: int, r: int):
    rng = np.random.RandomState(100 * step + r)
    return (rng.rand(3 + 2 * r, 3, 8, 8).astype(np.float32) * 2 + r,
            rng.randint(0, 5, 3 + 2 * r).astype(np.float32))


size = ref or mxnet_mpi.size()
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01},
                        kvstore=None if ref else "mpi")
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
result = {}
for step in range(STEPS):
    if ref:
        parts = [batch(step, r) for r in range(ref)]
        x, y = (mx.nd.array(np.concatenate([p[i] for p in parts])) for i in (0, 1))
    else:
        x, y = (mx.nd.array(a) for a in batch(step, mxnet_mpi.rank()))
    # uneven parts: the first device takes the rounding up
    xs = gluon.utils.split_and_load(x, ctx, even_split=False)
    ys = gluon.utils.split_and_load(y, ctx, even_split=False)
    with autograd.record():
        losses = [loss_fn(net(xi), yi) for xi, yi in zip(xs, ys)]
    if sequential:
        for loss in losses:
            loss.backward()
    else:
        autograd.backward(losses)
    trainer.step(sum(3 + 2 * r for r in range(size)))
    if step == 0:   # after the Trainer's allreduce: gradients summed over devices and ranks
        for k, p in params.items():
            if p.grad_req != "null":
                grads = [g.asnumpy() for g in p.list_grad()]
                assert all(np.array_equal(g, grads[0]) for g in grads), k
                result["grad " + k] = grads[0]
for k, p in params.items():
    datas = [d.asnumpy() for d in p.list_data()]
    assert all(np.array_equal(d, datas[0]) for d in datas), k
    result["weight " + k] = datas[0]
os.makedirs(out_dir, exist_ok=True)
np.savez(os.path.join(out_dir, "ref.npz" if ref else "rank%d.npz" % mxnet_mpi.rank()), **result)
print("done", flush=True)

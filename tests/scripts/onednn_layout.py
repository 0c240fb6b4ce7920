"""Collectives on conv weights that an inference forward left in oneDNN layout
(MXNet reorders them in place for inference; training-mode forwards do not)."""

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_mpi

rank, size = mxnet_mpi.rank(), mxnet_mpi.size()
x = mx.nd.ones((2, 3, 8, 8))


def conv_after_inference(seed):
    mx.random.seed(seed)
    net = gluon.nn.Conv2D(8, 3, in_channels=3)
    net.initialize(mx.init.Uniform(1.0))
    before = net.weight.data().asnumpy()
    net(x).wait_to_read()  # inference forward: weight goes to oneDNN layout
    return net, before


kv = mx.kv.create("mpi")
net, w0 = conv_after_inference(seed=5)  # same on every rank
w = net.weight.data()
kv.pushpull("w", w)                      # in place on a oneDNN array
np.testing.assert_allclose(w.asnumpy(), w0 * size, rtol=1e-6)

net2, w2 = conv_after_inference(seed=100 + rank)  # differs per rank
out = mx.nd.zeros(w2.shape)
kv.broadcast("b", net2.weight.data(), out=out)     # oneDNN input, plain output
ref = mx.nd.zeros(w2.shape)
kv.broadcast("ref", mx.nd.array(w2), out=ref)       # the same, from plain arrays
np.testing.assert_array_equal(out.asnumpy(), ref.asnumpy())
_, w_root = conv_after_inference(seed=100)           # rank 0's, which both must hold
np.testing.assert_array_equal(out.asnumpy(), w_root)

# Trainer built after an inference forward (e.g. a shape-inference call)
net3, _ = conv_after_inference(seed=200 + rank)
trainer = gluon.Trainer(net3.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore="mpi")
with autograd.record():
    loss = net3(x).sum()
loss.backward()
trainer.step(2)
mine = net3.weight.data().asnumpy()
check = mx.nd.array(mine)
kv.broadcast("check", check, out=check)
np.testing.assert_array_equal(mine, check.asnumpy())
print("ONEDNN_OK rank %d" % rank, flush=True)

"""Module.fit on uneven shards (rank r has 2 + 3 r batches per epoch), as MXNet's
fit.py gets from a RecordIO file split by bytes: with our stores fit joins at
the end of each epoch by itself, so every rank finishes, exit 0, with the
same weights.

  module_uneven.py MODE [DEVICES [OPTIMIZER]]   DEVICES: CPU contexts per rank, e.g. 2,1,1;
  OPTIMIZER: sgd (with momentum, the default) or adam
"""

import sys

import mxnet as mx
import numpy as np

import mxnet_mpi

mode = sys.argv[1]
rank, size = mxnet_mpi.rank(), mxnet_mpi.size()
devices = int(sys.argv[2].split(",")[rank]) if len(sys.argv) > 2 else 1
adam = len(sys.argv) > 3 and sys.argv[3] == "adam"
batch, nbatches = 8, 2 + 3 * rank
rng = np.random.RandomState(100 + rank)
x = rng.randn(nbatches * batch, 6).astype(np.float32)
y = rng.randint(0, 4, size=(nbatches * batch,)).astype(np.float32)
it = mx.io.NDArrayIter(x, y, batch_size=batch, shuffle=False, label_name="softmax_label")

data = mx.sym.Variable("data")
net = mx.sym.FullyConnected(data, num_hidden=12, name="fc1")
net = mx.sym.Activation(net, act_type="relu")
net = mx.sym.FullyConnected(net, num_hidden=4, name="fc2")
net = mx.sym.SoftmaxOutput(net, name="softmax")

mx.random.seed(1000 + rank)
mod = mx.mod.Module(net, context=[mx.cpu(i) for i in range(devices)])
mod.fit(it, num_epoch=3, kvstore="mpi_" + mode, optimizer="adam" if adam else "sgd",
        optimizer_params={"learning_rate": 0.01} if adam else
        {"learning_rate": 0.1, "momentum": 0.9},
        initializer=mx.init.Xavier())
arg, _ = mod.get_params()
checksum = sum(float(v.asnumpy().astype(np.float64).sum()) for v in arg.values())
print("rank %d MODULE_CHECKSUM %.12g" % (rank, checksum), flush=True)

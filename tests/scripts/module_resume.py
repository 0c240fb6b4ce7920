"""A Module checkpoint (weights and optimizer states) resumed on another number
of devices per rank, against the run that never stopped.

  mpirun -np N python module_resume.py OUTDIR NDEV_SAVE NDEV_RESUME

Run A trains 2 epochs of SGD with momentum on NDEV_SAVE devices per rank and
checkpoints after the first (Module.save_checkpoint with states: mxnet_mpi
writes the states by parameter), and also writes the states as MXNet numbers
them (parameter x devices + device). Run B resumes the checkpoint on
NDEV_RESUME devices, run C the MXNet-numbered file; each trains the second
epoch. Prints one JSON line per rank: the largest difference of B's and C's
weights from A's (momentum loaded into other parameters' places moved them
by about 0.1, exit 0).
"""

from __future__ import annotations

import json
import os
import pickle
import sys

import mxnet as mx
import numpy as np

import mxnet_mpi

OUT, NDEV_A, NDEV_B = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
RANK, SIZE = mxnet_mpi.rank(), mxnet_mpi.size()
os.makedirs(OUT, exist_ok=True)
PREFIX = os.path.join(OUT, "r%d" % RANK)   # each rank its own files
BATCH = 6   # per rank; every device count used divides it

rng = np.random.RandomState(7)
X = rng.randn(4, SIZE, BATCH, 5).astype(np.float32)
Y = rng.randint(0, 3, size=(4, SIZE, BATCH)).astype(np.float32)
data = mx.io.NDArrayIter(X[:, RANK].reshape(-1, 5), Y[:, RANK].reshape(-1), batch_size=BATCH,
                         shuffle=False, label_name="softmax_label")

net = mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=7, name="fc1")
net = mx.sym.Activation(net, act_type="relu")
net = mx.sym.FullyConnected(net, num_hidden=3, name="fc2")
net = mx.sym.SoftmaxOutput(net, name="softmax")
OPT = {"learning_rate": 0.3, "momentum": 0.9}


def devices(n: int) -> list:
    return [mx.cpu(i) for i in range(n)]


def mxnet_numbered(epoch, *_):
    if epoch == 0:   # after the first epoch, as the checkpoint
        with open(PREFIX + "-mxnet.states", "wb") as f:
            f.write(pickle.dumps(a._updater.states))


mx.random.seed(1000 + RANK)
a = mx.mod.Module(net, context=devices(NDEV_A))
a.fit(data, num_epoch=2, kvstore="mpi", optimizer="sgd", optimizer_params=OPT,
      initializer=mx.init.Xavier(),
      epoch_end_callback=[mx.callback.module_checkpoint(a, PREFIX, save_optimizer_states=True),
                          mxnet_numbered])
want = {k: v.asnumpy() for k, v in a.get_params()[0].items()}


def resumed(states_file: str | None) -> float:
    data.reset()
    m = mx.mod.Module.load(PREFIX, 1, load_optimizer_states=states_file is None,
                           context=devices(NDEV_B))
    if states_file is not None:
        m.bind(data.provide_data, data.provide_label)
        m.init_optimizer(kvstore="mpi", optimizer="sgd", optimizer_params=OPT)
        m.load_optimizer_states(states_file)
    m.fit(data, begin_epoch=1, num_epoch=2, kvstore="mpi", optimizer="sgd",
          optimizer_params=OPT)
    got = m.get_params()[0]
    return max(float(np.abs(got[k].asnumpy() - v).max()) for k, v in want.items())


print(json.dumps({"rank": RANK, "checkpoint": resumed(None),
                  "mxnet_numbered": resumed(PREFIX + "-mxnet.states")}), flush=True)

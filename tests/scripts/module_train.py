"""Module.fit with a kvstore given as a string; saves final weights per rank.

  --kvstore mpi        under mpirun (ranks seed differently and see different data)
  --reference N        one process on the N shards concatenated, no kvstore
"""

import argparse
import os

import mxnet as mx
import numpy as np

import mxnet_mpi

ap = argparse.ArgumentParser()
ap.add_argument("--kvstore", default="mpi")
ap.add_argument("--reference", type=int, default=0)
ap.add_argument("--outdir", required=True)
args = ap.parse_args()

if args.reference:
    rank, size, kvstore = 0, args.reference, None
else:
    rank, size, kvstore = mxnet_mpi.rank(), mxnet_mpi.size(), args.kvstore
batch, nbatches = 8, 4
rng = np.random.RandomState(7)
X = rng.randn(nbatches, size, batch, 6).astype(np.float32)
Y = rng.randint(0, 4, size=(nbatches, size, batch)).astype(np.float32)
if args.reference:
    # batch b of the reference = the ranks' b-th batches side by side
    x, y, bs = X.reshape(-1, 6), Y.reshape(-1), batch * size
else:
    x, y, bs = X[:, rank].reshape(-1, 6), Y[:, rank].reshape(-1), batch
it = mx.io.NDArrayIter(x, y, batch_size=bs, shuffle=False, label_name="softmax_label")

data = mx.sym.Variable("data")
net = mx.sym.FullyConnected(data, num_hidden=12, name="fc1")
net = mx.sym.Activation(net, act_type="relu")
net = mx.sym.FullyConnected(net, num_hidden=4, name="fc2")
net = mx.sym.SoftmaxOutput(net, name="softmax")

mx.random.seed(1000 if args.reference else 1000 + rank)
mod = mx.mod.Module(net, context=mx.cpu())
mod.fit(it, num_epoch=2, kvstore=kvstore, optimizer="sgd",
        optimizer_params={"learning_rate": 0.5, "momentum": 0.9},
        initializer=mx.init.Xavier())
arg, _ = mod.get_params()
os.makedirs(args.outdir, exist_ok=True)
np.savez(os.path.join(args.outdir, "rank%d.npz" % rank), **{k: v.asnumpy() for k, v in arg.items()})
print("rank %d done, kvstore type %s rescale_grad %r"
      % (rank, getattr(mod._kvstore, "type", None), mod._optimizer.rescale_grad), flush=True)

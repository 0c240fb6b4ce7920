"""Train a small Gluon net with a hybrid, MPI or ps-lite store; save weights per rank.

  --kvstore dist_sync_mpi|dist_async_mpi|mpi   under mpirun (or mxnet_mpi.launch);
                                               the kvstore goes to Trainer as a string
  --kvstore dist_sync|dist_async               plain ps-lite worker (DMLC_* env set)
  --reference N                                one process, no kvstore, on the N
                                               rank shards concatenated
  --model dense     Dense(16, deferred) -> Dense(8) -> Dense(3), as gluon_train.py
  --model sparse    Embedding(VOCAB, 4, sparse_grad=True) -> Dense(8) -> Dense(3); the
                    tokens never use the last UNUSED rows of the embedding
  --model sparse_weight   the same with contrib SparseEmbedding (row_sparse weight,
                    pulled by row_sparse_pull for the rows of each batch)
Every rank (of N) uses its own slice of a global batch each step; SGD with momentum
and weight decay; trainer.step(per-rank batch). Writes rank<r>.npz (weights after
every step) and rank<r>.json (store type, routes, counters, losses).
"""

import argparse
import json
import os

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_mpi

VOCAB, UNUSED, TOKENS = 30, 6, 3

ap = argparse.ArgumentParser()
ap.add_argument("--kvstore", default="dist_sync_mpi")
ap.add_argument("--reference", type=int, default=0)
ap.add_argument("--model", choices=("dense", "sparse", "sparse_weight"), default="dense")
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--lr", type=float, default=0.1)
ap.add_argument("--outdir", required=True)
ap.add_argument("--same-seed", action="store_true", help="all ranks init identically")
ap.add_argument("--mults", action="store_true",
                help="Gluon lr_mult/wd_mult on some parameters (dense model)")
ap.add_argument("--separable", action="store_true",
                help="labels from a fixed linear rule (learnable: for loss thresholds)")
args = ap.parse_args()

kv_obj = None
if args.reference:
    # row_sparse weights need a kvstore in MXNet's Trainer, even in one process
    rank, size = 0, args.reference
    kvstore = "local" if args.model == "sparse_weight" else None
elif args.kvstore in ("dist_sync", "dist_async"):
    kvstore = kv_obj = mx.kv.create(args.kvstore)
    rank, size = kv_obj.rank, kv_obj.num_workers
else:
    rank, size, kvstore = mxnet_mpi.rank(), mxnet_mpi.size(), args.kvstore

rng = np.random.RandomState(42)
if args.model == "dense":
    X = rng.randn(args.steps, size, args.batch, 5).astype(np.float32)
    if args.separable:
        W = np.random.RandomState(7).randn(5, 3)
        Y = np.argmax(X @ W, axis=-1).astype(np.float32)
    else:
        Y = rng.randint(0, 3, size=(args.steps, size, args.batch)).astype(np.float32)
else:
    X = rng.randint(0, VOCAB - UNUSED, size=(args.steps, size, args.batch, TOKENS))
    X = X.astype(np.float32)
    Y = (X.sum(axis=-1) % 3).astype(np.float32)

mx.random.seed(1000 if (args.same_seed or args.reference) else 1000 + rank)
net = gluon.nn.HybridSequential() if args.model != "sparse_weight" else gluon.nn.Sequential()
if args.model == "dense":
    net.add(gluon.nn.Dense(16, activation="tanh"),          # deferred init
            gluon.nn.Dense(8, in_units=16, activation="tanh"),  # initialised at once
            gluon.nn.Dense(3))
else:
    emb = (gluon.nn.Embedding(VOCAB, 4, sparse_grad=True) if args.model == "sparse"
           else gluon.contrib.nn.SparseEmbedding(VOCAB, 4))
    net.add(emb,
            gluon.nn.Flatten(),
            gluon.nn.Dense(8, activation="tanh"),               # deferred init
            gluon.nn.Dense(3, in_units=8))
net.initialize(mx.init.Uniform(0.5))
params = net.collect_params()
if args.mults:   # dense0_weight slower, dense0_bias frozen by its rate, dense1_bias decayed more
    plist = list(params.values())
    plist[0].lr_mult, plist[1].lr_mult, plist[3].wd_mult = 0.3, 0.0, 50.0
opt_params = {"learning_rate": args.lr, "momentum": 0.9, "wd": 1e-3}
step_batch = args.batch
if args.model == "sparse_weight":
    # The first forward pulls rows, which sends the optimizer to the servers before
    # any step() could set rescale_grad: fix it up front (MXNet's own rule for
    # distributed row_sparse weights), and step(1).
    opt_params["rescale_grad"], step_batch = 1.0 / args.batch, 1
trainer = gluon.Trainer(params, "sgd", opt_params, kvstore=kvstore)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
store = trainer._kvstore_params["kvstore"]   # the store object once Trainer created it

xa = mx.nd.array(X.reshape((-1,) + X.shape[3:]))
ya = mx.nd.array(Y.reshape(-1))
# Loss on the whole data set before training (runs deferred initialisation).
initial_loss = float(loss_fn(net(xa), ya).mean().asscalar())
saved, losses = {}, []
# Weights right after Trainer creation and the first forward (world rank 0's).
def value(p):
    """A parameter's full value (row_sparse weights: all rows, pulled from the store)."""
    if p._stype == "row_sparse":
        return p.row_sparse_data(mx.nd.arange(p.shape[0], dtype="int64")).asnumpy()
    return p.data().asnumpy()


for i, p in enumerate(params.values()):
    saved["init_p%d" % i] = value(p)
for step in range(args.steps):
    if args.reference:
        x, y = X[step].reshape((-1,) + X.shape[3:]), Y[step].reshape(-1)
    else:
        x, y = X[step, rank], Y[step, rank]
    with autograd.record():
        loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
    loss.backward()
    trainer.step(step_batch)
    losses.append(float(loss.mean().asscalar()))
    for i, p in enumerate(params.values()):
        saved["s%d_p%d" % (step, i)] = value(p)

final_loss = float(loss_fn(net(xa), ya).mean().asscalar())

os.makedirs(args.outdir, exist_ok=True)
np.savez(os.path.join(args.outdir, "rank%d.npz" % rank), **saved)
info = {"rank": rank, "size": size, "losses": losses, "initial_loss": initial_loss,
        "final_loss": final_loss, "param_names": list(params.keys()),
        "trainer_keys": [p.name for p in trainer._params]}   # kvstore key -> name
if isinstance(store, mxnet_mpi.MPIKVStore):
    info["type"] = store.type
    if isinstance(store, mxnet_mpi.HybridKVStore):
        info.update(group=store.group, group_rank=store.group_rank, route=store.route,
                    num_groups=store.num_groups, is_ps_worker=store.is_ps_worker,
                    routes={str(k): v for k, v in store.routes.items()},
                    stats=dict(store.stats))
        ones = mx.nd.ones((2,))   # the store's group, as kv.comm names it
        mxnet_mpi.allreduce_(ones, comm=store.comm)
        info["group_sum"] = ones.asnumpy().tolist()
elif kv_obj is not None:
    info["type"] = kv_obj.type
with open(os.path.join(args.outdir, "rank%d.json" % rank), "w") as f:
    json.dump(info, f)
print("rank %d of %d done, final loss %.4f" % (rank, size, final_loss), flush=True)

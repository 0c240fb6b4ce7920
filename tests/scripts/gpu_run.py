"""GPU arrays through the stores (run only where a GPU exists).

  mpirun -np 2 python gpu_run.py exact MODE
      pushpull/broadcast of GPU arrays (ranks share GPU local_rank % gpus),
      exact against numpy; prints "CHECK <name> ok|FAIL"
  mpirun -np 2 python gpu_run.py trainer OUT_DIR
      gluoncv resnet18_v1 on the GPU, kvstore='mpi', 3 steps; rank r saves
      OUT_DIR/rank<r>.npz
  python gpu_run.py reference OUT_DIR NRANKS
      one process: the same steps, each rank's shard run forward/backward
      separately (BatchNorm sees the same per-rank batches) with gradients
      accumulated, then one update on the global batch; saves OUT_DIR/ref.npz
"""

import os
import sys

import mxnet as mx
import numpy as np

import mxnet_mpi

what = sys.argv[1]
GPUS = mx.context.num_gpus()
assert GPUS > 0, "no GPU"
BATCH, STEPS = 4, 3


def shard(step: int, r: int):
    rng = np.random.RandomState(100 * step + r)
    return (mx.nd.array(rng.rand(BATCH, 3, 32, 32).astype(np.float32)),
            mx.nd.array(rng.randint(0, 10, BATCH).astype(np.float32)))


def make_net(ctx):
    from gluoncv.model_zoo import get_model
    mx.random.seed(7)
    net = get_model("resnet18_v1", classes=10)
    net.initialize(mx.init.Xavier(), ctx=ctx)
    return net


def save(net, path: str) -> None:
    params = {k: v.data().asnumpy() for k, v in net.collect_params().items()
              if "running" not in k}   # running stats are updated per forward: not compared
    np.savez(path, **params)


if what == "exact":
    mode = sys.argv[2]
    ctx = mx.gpu(mxnet_mpi.local_rank() % GPUS)
    kv = mx.kv.create("mpi_" + mode)
    R, N = kv.rank, kv.num_workers
    for name, n in (("small", 1000), ("chunked", 3 << 20)):   # 12 MB: three 4 MB chunks
        for dtype in ("float32", "float64"):
            for step in range(3):
                base = (np.arange(n) % 251).astype(dtype)
                a = mx.nd.array(base + R + step, ctx=ctx, dtype=dtype)
                kv.pushpull("%s-%s" % (name, dtype), a)
                want = N * base + sum(range(N)) + N * step
                ok = np.array_equal(a.asnumpy(), want.astype(dtype))
                out = mx.nd.zeros((n,), ctx=ctx, dtype=dtype)
                b = mx.nd.array(base + R, ctx=ctx, dtype=dtype)
                kv.broadcast("b-%s-%s" % (name, dtype), b, out=out)
                ok = ok and np.array_equal(out.asnumpy(), base.astype(dtype))
                print("CHECK %s-%s-step%d %s" % (name, dtype, step, "ok" if ok else "FAIL"),
                      flush=True)
    print("CHECK buffers_reused %s" % ("ok" if kv._staging.stats()["allocations"] ==
                                       kv._staging.stats()["buffers"] else "FAIL"), flush=True)
elif what == "trainer":
    out = sys.argv[2]
    ctx = mx.gpu(mxnet_mpi.local_rank() % GPUS)
    net = make_net(ctx)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": 0.01, "momentum": 0.9}, kvstore="mpi")
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(STEPS):
        x, y = shard(step, mxnet_mpi.rank())
        with mx.autograd.record():
            loss = loss_fn(net(x.as_in_context(ctx)), y.as_in_context(ctx))
        loss.backward()
        trainer.step(BATCH * mxnet_mpi.size())
    os.makedirs(out, exist_ok=True)
    save(net, os.path.join(out, "rank%d.npz" % mxnet_mpi.rank()))
elif what == "reference":
    out, nranks = sys.argv[2], int(sys.argv[3])
    ctx = mx.gpu(0)
    net = make_net(ctx)
    params = net.collect_params()
    params.setattr("grad_req", "add")
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.01, "momentum": 0.9},
                               kvstore=None)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(STEPS):
        params.zero_grad()
        for r in range(nranks):
            x, y = shard(step, r)
            with mx.autograd.record():
                loss = loss_fn(net(x.as_in_context(ctx)), y.as_in_context(ctx))
            loss.backward()
        trainer.step(BATCH * nranks)
    os.makedirs(out, exist_ok=True)
    save(net, os.path.join(out, "ref.npz"))

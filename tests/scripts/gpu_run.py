"""GPU arrays through the stores (run only where a GPU exists).

  python gpu_run.py probe
      whether host<->GPU copies and a GPU kernel run: prints "COPY ok|FAIL ..."
      and "KERNEL ok|FAIL ..." (MXNet's CUDA builds carry machine code for
      sm_50-86 only and no PTX, so no kernel of theirs runs on e.g. Hopper)
  mpirun -np 2 python gpu_run.py exact MODE
      pushpull (in place and into `out`) and broadcast of GPU arrays (ranks
      share GPU local_rank % gpus), exact against numpy; uses only copies
      between host and GPU, no GPU kernel; prints "CHECK <name> ok|FAIL" and
      "CHECKS <count>"
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
# Without a GPU, "exact" runs on cpu_pinned arrays (with MXNET_MPI_FORCE_STAGING=1
# the same staged path): only to check this script itself.
DEVICE = (lambda i: mx.gpu(i % GPUS)) if GPUS else (lambda i: mx.cpu_pinned(0))
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


if what == "probe":
    ctx = mx.gpu(0)
    try:
        x = np.arange(1 << 20, dtype=np.float32)
        ok = np.array_equal(mx.nd.array(x, ctx=ctx).asnumpy(), x)
        print("COPY %s" % ("ok" if ok else "FAIL values differ"), flush=True)
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        print("COPY FAIL %s" % str(e).splitlines()[0], flush=True)
    try:
        a = mx.nd.ones((64, 64), ctx=ctx)
        got = mx.nd.dot(a, a).sum().asscalar()
        print("KERNEL %s" % ("ok" if got == 64 * 64 * 64 else "FAIL dot sum %s" % got),
              flush=True)
    except Exception as e:  # noqa: BLE001
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        print("KERNEL FAIL %s" % " | ".join(lines[:3])[:400], flush=True)
elif what == "exact":
    mode = sys.argv[2]
    ctx = DEVICE(mxnet_mpi.local_rank())
    kv = mx.kv.create("mpi_" + mode)
    R, N = kv.rank, kv.num_workers
    checks = 0
    for name, n in (("small", 1000), ("chunked", 3 << 20)):   # 12 MB: three 4 MB chunks
        for dtype in ("float32", "float64"):
            for step in range(3):
                base = (np.arange(n) % 251).astype(dtype)
                a = mx.nd.array(base + R + step, ctx=ctx, dtype=dtype)
                kv.pushpull("%s-%s" % (name, dtype), a)
                want = N * base + sum(range(N)) + N * step
                ok = np.array_equal(a.asnumpy(), want.astype(dtype))
                src = mx.nd.array(base * (R + 1), ctx=ctx, dtype=dtype)
                dst = mx.nd.array(np.zeros(n, dtype), ctx=ctx, dtype=dtype)  # no kernel
                kv.pushpull("o-%s-%s" % (name, dtype), src, out=dst)
                ok = ok and np.array_equal(dst.asnumpy(), (base * sum(range(1, N + 1))
                                                           ).astype(dtype))
                ok = ok and np.array_equal(src.asnumpy(), (base * (R + 1)).astype(dtype))
                out = mx.nd.array(np.zeros(n, dtype), ctx=ctx, dtype=dtype)
                b = mx.nd.array(base + R, ctx=ctx, dtype=dtype)
                kv.broadcast("b-%s-%s" % (name, dtype), b, out=out)
                ok = ok and np.array_equal(out.asnumpy(), base.astype(dtype))
                print("CHECK %s-%s-step%d %s" % (name, dtype, step, "ok" if ok else "FAIL"),
                      flush=True)
                checks += 1
    st = kv._staging.stats()
    print("CHECK buffers_reused %s" % ("ok" if st["allocations"] == st["buffers"] > 0
                                       else "FAIL %s" % st), flush=True)
    print("CHECKS %d" % (checks + 1), flush=True)
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

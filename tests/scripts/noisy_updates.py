"""SGLD (noise in every update) on ranks seeded apart, as for Dropout, with
rank 1 on two devices: after 4 steps, through a Trainer, a Module, the
store's own optimizer (kv.set_optimizer, push, pull) and mxnet_mpi.horovod's
DistributedTrainer and DistributedOptimizer, every rank and device holds the
same weights; through a Trainer and a Module they match one process seeded
as rank 0, training on the whole batch on one device.

  mpirun -np 2 python noisy_updates.py

Prints "RESULT <path> ranks_alike=.. devices_alike=.. one_process=.." per
rank and path.
"""

import mxnet as mx
import numpy as np

import mxnet_mpi

RANK, SIZE = mxnet_mpi.rank(), mxnet_mpi.size()
STEPS, BATCH = 4, 4
X = np.random.RandomState(0).randn(STEPS, SIZE * BATCH, 5).astype("f4")


def seeded(rank: int) -> None:
    mx.random.seed(1000 + rank)


def trainer_weights(kvstore, ctxs, rows) -> list:
    net = mx.gluon.nn.Dense(3, in_units=5)
    net.initialize(mx.init.Constant(0.1), ctx=ctxs)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgld", {"learning_rate": 0.01},
                               kvstore=kvstore)
    return gluon_steps(net, trainer, ctxs, rows)


def gluon_steps(net, trainer, ctxs, rows) -> list:
    """STEPS steps of `rows` split over `ctxs`: each parameter's copies."""
    for step in range(STEPS):
        xs = mx.gluon.utils.split_and_load(X[step, rows], ctxs)
        with mx.autograd.record():
            losses = [(net(x) ** 2).sum() for x in xs]
        mx.autograd.backward(losses)
        trainer.step(BATCH)
    return [[p.data(c).asnumpy() for c in ctxs] for p in net.collect_params().values()]


def module_weights(kvstore, ctxs, rows) -> list:
    data = mx.sym.Variable("data")
    out = mx.sym.MakeLoss(mx.sym.sum(mx.sym.square(
        mx.sym.FullyConnected(data, num_hidden=3, name="fc"))))
    mod = mx.mod.Module(out, data_names=["data"], label_names=None, context=ctxs)
    n = len(X[0, rows])
    mod.bind(data_shapes=[("data", (n, 5))])
    mod.init_params(mx.init.Constant(0.1))
    mod.init_optimizer(kvstore=kvstore, optimizer="sgld",
                       optimizer_params={"learning_rate": 0.01, "rescale_grad": 1.0 / BATCH})
    for step in range(STEPS):
        mod.forward_backward(mx.io.DataBatch([mx.nd.array(X[step, rows])]))
        mod.update()
    group = mod._exec_group
    return [[a.asnumpy() for a in arrays] for arrays in group.param_arrays]


def store_weights(kvstore, ctxs, rows) -> list:
    kv = mx.kv.create(kvstore) if kvstore else None
    w = mx.nd.full((3, 5), 0.1)
    if kv is None:
        opt = mx.optimizer.create("sgld", learning_rate=0.01)
        updater = mx.optimizer.get_updater(opt)
    else:
        kv.set_optimizer(mx.optimizer.create("sgld", learning_rate=0.01))
        kv.init(0, w)
    for step in range(STEPS):
        grads = [mx.nd.array(X[step, rows][:3] * (i + 1), ctx=c) for i, c in enumerate(ctxs)]
        if kv is None:
            updater(0, grads[0], w)
        else:
            kv.push(0, grads)
            kv.pull(0, out=w)
    return [[w.asnumpy()]]


def hvd_weights(kind: str):
    def run(kvstore, ctxs, rows) -> list:
        import mxnet_mpi.horovod as hvd
        hvd.init()
        net = mx.gluon.nn.Dense(3, in_units=5)
        net.initialize(mx.init.Constant(0.1), ctx=ctxs)
        if kind == "trainer":
            trainer = hvd.DistributedTrainer(net.collect_params(), "sgld",
                                             {"learning_rate": 0.01})
        else:   # one device: Horovod's DistributedOptimizer updates the first only
            ctxs = ctxs[:1]
            net.collect_params().reset_ctx(ctxs)
            opt = hvd.DistributedOptimizer(mx.optimizer.create("sgld", learning_rate=0.01))
            trainer = mx.gluon.Trainer(net.collect_params(), opt, kvstore=None)
        return gluon_steps(net, trainer, ctxs, rows)
    return run


PATHS = {"trainer": trainer_weights, "module": module_weights, "store": store_weights,
         "hvd_trainer": hvd_weights("trainer"), "hvd_optimizer": hvd_weights("optimizer")}

for path, run in PATHS.items():
    ctxs = [mx.cpu(i) for i in range(1 + RANK)]
    seeded(RANK)
    mine = run("mpi", ctxs, slice(RANK * BATCH, (RANK + 1) * BATCH))
    flat = np.concatenate([copies[0].ravel() for copies in mine])
    total = mx.nd.array(flat)
    mxnet_mpi.allreduce_(total)
    ranks_alike = bool(np.array_equal(total.asnumpy(), flat * SIZE))
    devices_alike = all(np.array_equal(c, copies[0]) for copies in mine for c in copies)
    one = None   # the store's sum of the ranks' gradients, Horovod's mean: no twin here
    if path in ("trainer", "module"):
        seeded(0)
        ref = run(None, [mx.cpu(0)], slice(None))
        one = max(float(np.abs(c[0] - r[0]).max()) for c, r in zip(mine, ref))
    print("RESULT %s ranks_alike=%s devices_alike=%s one_process=%s"
          % (path, ranks_alike, devices_alike, "n/a" if one is None else one < 1e-6),
          flush=True)

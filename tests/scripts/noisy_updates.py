"""SGLD (noise in every update) on ranks seeded apart, as for Dropout, with
rank 1 on two devices: after 4 steps, through a Trainer, a Module, the
store's own optimizer (kv.set_optimizer, push, pull) and mxnet_mpi.horovod's
DistributedTrainer and DistributedOptimizer, every rank and device holds the
same weights, and they are not those of the update without its noise. Also:
float16 weights with float32 master copies (the masters alike too), and
uneven data where rank 0 runs out first and joins. mx.random.seed still
chooses the noise (the ranks agree on a seed drawn on rank 0), and a
subclass that overrides SGLD's update is warned about.

  mpirun -np 2 python noisy_updates.py

Prints "RESULT <path> ranks_alike=.. devices_alike=.. noisy=.." per rank and
path ("masters_alike=.." for fp16).
"""

import warnings

import mxnet as mx
import numpy as np

import mxnet_mpi

RANK, SIZE = mxnet_mpi.rank(), mxnet_mpi.size()
STEPS, BATCH, LR = 4, 4, 0.01
X = np.random.RandomState(0).randn(STEPS, SIZE * BATCH, 5).astype("f4")
ROWS = slice(RANK * BATCH, (RANK + 1) * BATCH)


def optimizer(noisy: bool):
    # SGLD's update without its noise is SGD's at half the rate
    return ("sgld", {"learning_rate": LR}) if noisy else ("sgd", {"learning_rate": LR / 2})


def gluon_steps(net, trainer, ctxs, steps=STEPS) -> list:
    """`steps` steps of this rank's rows split over `ctxs`: each parameter's copies."""
    for step in range(steps):
        xs = mx.gluon.utils.split_and_load(X[step, ROWS], ctxs)
        with mx.autograd.record():
            losses = [(net(x) ** 2).sum() for x in xs]
        mx.autograd.backward(losses)
        trainer.step(BATCH)
    return [[p.data(c).asnumpy() for c in ctxs] for p in net.collect_params().values()]


def dense(ctxs):
    net = mx.gluon.nn.Dense(3, in_units=5)
    net.initialize(mx.init.Constant(0.1), ctx=ctxs)
    return net


def trainer_weights(noisy, ctxs) -> list:
    net = dense(ctxs)
    name, params = optimizer(noisy)
    return gluon_steps(net, mx.gluon.Trainer(net.collect_params(), name, params, kvstore="mpi"),
                       ctxs)


def join_weights(noisy, ctxs) -> list:
    """Rank 0 has 2 batches, rank 1 all of them; rank 0 joins."""
    net = dense(ctxs)
    name, params = optimizer(noisy)
    trainer = mx.gluon.Trainer(net.collect_params(), name, params, kvstore="mpi")
    gluon_steps(net, trainer, ctxs, steps=2 if RANK == 0 else STEPS)
    mxnet_mpi.join(trainer)
    return [[p.data(c).asnumpy() for c in ctxs] for p in net.collect_params().values()]


def module_weights(noisy, ctxs) -> list:
    data = mx.sym.Variable("data")
    out = mx.sym.MakeLoss(mx.sym.sum(mx.sym.square(
        mx.sym.FullyConnected(data, num_hidden=3, name="fc"))))
    mod = mx.mod.Module(out, data_names=["data"], label_names=None, context=ctxs)
    mod.bind(data_shapes=[("data", (BATCH, 5))])
    mod.init_params(mx.init.Constant(0.1))
    name, params = optimizer(noisy)
    mod.init_optimizer(kvstore="mpi", optimizer=name,
                       optimizer_params=dict(params, rescale_grad=1.0 / BATCH))
    for step in range(STEPS):
        mod.forward_backward(mx.io.DataBatch([mx.nd.array(X[step, ROWS])]))
        mod.update()
    return [[a.asnumpy() for a in arrays] for arrays in mod._exec_group.param_arrays]


def store_weights(noisy, ctxs) -> list:
    kv = mx.kv.create("mpi")
    name, params = optimizer(noisy)
    kv.set_optimizer(mx.optimizer.create(name, **params))
    w = mx.nd.full((3, 5), 0.1)
    kv.init(0, w)
    for step in range(STEPS):
        kv.push(0, [mx.nd.array(X[step, ROWS][:3] * (i + 1), ctx=c) for i, c in enumerate(ctxs)])
        kv.pull(0, out=w)
    return [[w.asnumpy()]]


def hvd_weights(kind: str):
    def run(noisy, ctxs) -> list:
        import mxnet_mpi.horovod as hvd
        hvd.init()
        name, params = optimizer(noisy)
        if kind == "trainer":
            net = dense(ctxs)
            trainer = hvd.DistributedTrainer(net.collect_params(), name, params)
        else:   # one device: Horovod's DistributedOptimizer updates the first only
            ctxs = ctxs[:1]
            net = dense(ctxs)
            opt = hvd.DistributedOptimizer(mx.optimizer.create(name, **params))
            trainer = mx.gluon.Trainer(net.collect_params(), opt, kvstore=None)
        return gluon_steps(net, trainer, ctxs)
    return run


class Scale(mx.gluon.Block):
    """Elementwise float16 (MXNet's CPU FullyConnected has no float16)."""

    def __init__(self):
        super().__init__()
        self.w = self.params.get("w", shape=(5,), dtype="float16",
                                 init=mx.init.Constant(0.5))

    def forward(self, x):
        return x.astype("float16") * self.w.data(x.context)


def masters_alike() -> tuple:
    """float16 weights, multi_precision: (weights alike, masters alike, noisy)."""
    net = Scale()
    ctxs = [mx.cpu(0)]
    net.initialize(ctx=ctxs)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgld",
                               {"learning_rate": LR, "multi_precision": True}, kvstore="mpi")
    gluon_steps(net, trainer, ctxs)
    master = trainer._updaters[0].states[0][0]
    pair = np.concatenate([net.w.data().asnumpy().astype("f4"), master.asnumpy()])
    total = mx.nd.array(pair)
    mxnet_mpi.allreduce_(total)
    alike = total.asnumpy() == pair * SIZE
    return bool(alike[:5].all()), bool(alike[5:].all())


PATHS = {"trainer": trainer_weights, "module": module_weights, "store": store_weights,
         "join": join_weights, "hvd_trainer": hvd_weights("trainer"),
         "hvd_optimizer": hvd_weights("optimizer")}

for path, run in PATHS.items():
    ctxs = [mx.cpu(i) for i in range(1 + RANK)]
    mx.random.seed(1000 + RANK)
    mine = run(True, ctxs)
    flat = np.concatenate([copies[0].ravel() for copies in mine])
    total = mx.nd.array(flat)
    mxnet_mpi.allreduce_(total)
    ranks_alike = bool(np.array_equal(total.asnumpy(), flat * SIZE))
    devices_alike = all(np.array_equal(c, copies[0]) for copies in mine for c in copies)
    plain = np.concatenate([copies[0].ravel() for copies in run(False, ctxs)])
    noisy = float(np.abs(flat - plain).max()) > 1e-2   # noise of std sqrt(LR) = 0.1
    print("RESULT %s ranks_alike=%s devices_alike=%s noisy=%s"
          % (path, ranks_alike, devices_alike, noisy), flush=True)
mx.random.seed(1000 + RANK)
weights, masters = masters_alike()
print("RESULT fp16 ranks_alike=%s masters_alike=%s" % (weights, masters), flush=True)


def chain(seed: int) -> np.ndarray:
    """A Trainer's SGLD chain from the same start, ranks seeded apart from `seed`."""
    mx.random.seed(seed + RANK)
    return np.concatenate([c[0].ravel() for c in trainer_weights(True, [mx.cpu(0)])])


first, other, again = chain(1), chain(777), chain(1)
print("RESULT seeds choose_noise=%s repeat=%s"
      % (not np.array_equal(first, other), np.array_equal(first, again)), flush=True)


class OwnNoise(mx.optimizer.SGLD):
    def update(self, index, weight, grad, state):
        super().update(index, weight, grad, state)
        weight[:] += mx.nd.random.normal(0, 0.01, shape=weight.shape)


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    net = dense([mx.cpu(0)])
    gluon_steps(net, mx.gluon.Trainer(net.collect_params(), OwnNoise(learning_rate=LR),
                                      kvstore="mpi"), [mx.cpu(0)], steps=1)
print("RESULT subclass warned=%s" % any("OwnNoise overrides SGLD.update" in str(w.message)
                                       for w in caught), flush=True)

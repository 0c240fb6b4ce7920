"""Nadam and LARS (momentum, a scheduler that changes the rate every step)
in one process whose parameters move to another device after the first step
(reset_ctx); prints {optimizer: weights} as one JSON line. With mxnet_mpi's
mends in (the start-up hook) they must update as MXNet alone does
(MXNET_MPI_AUTOLOAD=0): earlier mends keyed their steps by the first device
they saw, and froze Nadam's m_schedule (or LARS's rates) after the move."""

import json

import mxnet as mx
import numpy as np


def train(name: str) -> list:
    net = mx.gluon.nn.Dense(3, in_units=5)
    net.initialize(mx.init.Constant(0.2), ctx=mx.cpu(0))
    params = {"learning_rate": 0.05}
    if name == "lars":
        params = {"momentum": 0.9, "lr_scheduler": mx.lr_scheduler.FactorScheduler(
            step=1, factor=0.7, base_lr=0.1)}
    trainer = mx.gluon.Trainer(net.collect_params(), name, params)
    x = np.random.RandomState(0).randn(5, 4, 5).astype("f4")
    for step in range(5):
        if step == 1:
            net.collect_params().reset_ctx(mx.cpu(1))
        ctx = mx.cpu(0) if step == 0 else mx.cpu(1)
        with mx.autograd.record():
            loss = (net(mx.nd.array(x[step], ctx=ctx)) ** 2).sum()
        loss.backward()
        trainer.step(4)
    return np.concatenate([p.data(ctx).asnumpy().ravel()
                           for p in net.collect_params().values()]).tolist()


def by_hand(name: str) -> list:
    """One Trainer step, then the Trainer's updater called by hand: updates no
    Trainer step marks (an earlier mend took them for another device's copy
    of the marked step, and froze Nadam's schedule)."""
    net = mx.gluon.nn.Dense(3, in_units=5)
    net.initialize(mx.init.Constant(0.2))
    trainer = mx.gluon.Trainer(net.collect_params(), name, {"learning_rate": 0.05})
    x = np.random.RandomState(0).randn(4, 8, 5).astype("f4")
    for step in range(4):
        with mx.autograd.record():
            loss = (net(mx.nd.array(x[step])) ** 2).sum()
        loss.backward()
        if step == 0:
            trainer.step(8)
        else:
            trainer._optimizer.rescale_grad = 1 / 8.
            for i, p in enumerate(trainer._params):
                trainer._updaters[0](i, p.grad(), p.data())
    return net.weight.data().asnumpy().ravel().tolist()


print(json.dumps({"nadam": train("nadam"), "lars": train("lars"),
                  "nadam_by_hand": by_hand("nadam")}))

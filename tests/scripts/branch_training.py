"""A scheduler that changes the rate every step and a branch (parameters 0
and 1) taken in even steps only, ignore_stale_grad=True, 6 steps in one
process, per optimizer; prints {optimizer: weights} as one JSON line.

  python branch_training.py OPTIMIZER[,OPTIMIZER...] [--one-at-a-time]

--one-at-a-time: as in a rank of an MPI job, where mxnet_mpi chose to update
one weight at a time (import mxnet_mpi with its choice recorded); without it,
run as MXNet alone (MXNET_MPI_AUTOLOAD=0 in the environment) with MXNet's own
group sizes.
"""

import json
import os
import sys

OPTIMIZERS, ONE = sys.argv[1].split(","), "--one-at-a-time" in sys.argv
if ONE:
    from _mxnet_mpi_autoload import AGGREGATION_VAR, SET_HERE
    os.environ[AGGREGATION_VAR] = SET_HERE[AGGREGATION_VAR] = "1"
    import mxnet_mpi  # noqa: F401  (its mends)

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402


class Branch(mx.gluon.Block):
    def __init__(self):
        super().__init__()
        self.a = mx.gluon.nn.Dense(5, in_units=5)
        self.b = mx.gluon.nn.Dense(2, in_units=5)

    def forward(self, x, use_a):
        return self.b(self.a(x) if use_a else x)


def train(optimizer: str) -> list:
    net = Branch()
    net.initialize()
    rng = np.random.RandomState(1)
    for p in net.collect_params().values():
        p.set_data(mx.nd.array(rng.randn(*p.shape) * 0.5))
    params = {"lr_scheduler": mx.lr_scheduler.FactorScheduler(step=1, factor=0.7, base_lr=0.1)}
    if optimizer in ("sgd", "lars"):
        params["momentum"] = 0.9
    trainer = mx.gluon.Trainer(net.collect_params(), optimizer, params, kvstore=None)
    x = np.random.RandomState(0).randn(6, 8, 5).astype("f4")
    for step in range(6):
        with mx.autograd.record():
            loss = (net(mx.nd.array(x[step]), step % 2 == 0) ** 2).sum()
        loss.backward()
        trainer.step(8, ignore_stale_grad=True)
    return np.concatenate([p.data().asnumpy().ravel()
                           for p in net.collect_params().values()]).tolist()


print(json.dumps({name: train(name) for name in OPTIMIZERS}))

"""Hybrid-store error paths from MXNet's nightly kvstore tests, run under the
launcher. `--case`:

uninit_pull   pull of a key never initialised: every rank of every group gets the
              same MPIKVStoreError (not only the ps-lite worker), and the store
              still works afterwards.
rsp_no_rows   row_sparse_pull where no rank of a group asks for a row.
two_trainers  three Trainers on one store (MXNet's tests do this): no key is
              re-initialised on the servers; training still matches.
sub_block     a Trainer whose parameters have other shapes at keys 0 and 1 than
              two_trainers' layer there: refused, naming both.
lr_changed    a Trainer's learning rate set on every rank after a step (the servers
              run the optimizer as sent): the next step is refused on every rank.
train_steps   5 steps, READY after the first, then 3 s of other work before the
              program ends (time for the test to stop the scheduler).
train_loop    pushes and pulls until killed; READY after the first step.

Prints `RESULT <json>` per rank.
"""

import argparse
import json
import os
import time

import mxnet as mx
from mxnet import gluon

import mxnet_mpi  # noqa: F401  (registers the stores)

p = argparse.ArgumentParser()
p.add_argument("--case", required=True, help="a case, or several joined by commas")
p.add_argument("--kvstore", default="dist_sync_mpi")
args = p.parse_args()

kv = mx.kv.create(args.kvstore)
rank, size = kv.rank, kv.num_workers


SHARED: list = []   # a net whose Trainers' keys the servers hold


class Beside(gluon.Block):
    """Two layers on the same input, summed: `a`'s parameters come first."""

    def __init__(self, a, b):
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x):
        return self.a(x) + self.b(x)


def step_error(pairs) -> str | None:
    """One step of each (net, trainer) on ones: None, or the store's error."""
    try:
        for net, trainer in pairs:
            with mx.autograd.record():
                loss = net(mx.nd.ones((1, 3))).sum()
            loss.backward()
            trainer.step(1)
        return None
    except mxnet_mpi.MPIKVStoreError as e:
        return str(e)


def run_case(case: str) -> dict:
    out: dict = {"rank": rank, "group": kv.group, "case": case}
    if case == "uninit_pull":
        kv.init(3, mx.nd.ones((2, 3)))
        t0 = time.monotonic()
        try:
            kv.pull(99, out=mx.nd.zeros((2, 3)))
            out["error"] = None
        except mxnet_mpi.MPIKVStoreError as e:
            out["error"] = str(e).splitlines()[0]
        out["seconds"] = time.monotonic() - t0
        # the store stays usable: a valid pull after the caught error
        o = mx.nd.zeros((2, 3))
        kv.pull(3, out=o)
        out["after"] = o.asnumpy().tolist()
    elif case == "rsp_no_rows":
        shape = (6, 2)
        kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))
        # an int key: the cases share one store, and MXNet allows one key type per store
        kv.init(7, mx.nd.ones(shape).tostype("row_sparse"))
        o = mx.nd.sparse.zeros("row_sparse", shape)
        # group 0 asks for nothing; group 1 asks for row 2 on its rank 0 only
        ids = [2] if (kv.group == 1 and kv.group_rank == 0) else []
        kv.row_sparse_pull(7, out=o, row_ids=mx.nd.array(ids, dtype="int64"))
        out["rows"] = o.indices.asnumpy().tolist()
        out["dense"] = o.tostype("default").asnumpy().tolist()
    elif case == "two_trainers":
        net = gluon.nn.Dense(2, in_units=3)
        net.initialize(mx.init.Constant(0.5))
        SHARED.append(net)   # its weights hold keys 0 and 1 on the servers
        params = net.collect_params()
        trainers = [gluon.Trainer(params, "sgd", {"learning_rate": 0.1}, kvstore=kv)
                    for _ in range(3)]
        x = mx.nd.ones((1, 3)) * (rank + 1)
        for tr in trainers:
            with mx.autograd.record():
                loss = net(x).sum()
            loss.backward()
            tr.step(1)
        out["weight"] = net.weight.data().asnumpy().tolist()
        out["bias"] = net.bias.data().asnumpy().tolist()
    elif case == "other_params":
        # two nets of the layout two_trainers gave keys 0 and 1, a Trainer each
        nets = [gluon.nn.Dense(2, in_units=3) for _ in range(2)]
        trainers = []
        for net in nets:
            net.initialize(mx.init.Constant(0.5))
            trainers.append(gluon.Trainer(net.collect_params(), "sgd",
                                          {"learning_rate": 0.1}, kvstore=kv))
        out["error"] = step_error(zip(nets, trainers))
    elif case == "raw_key":
        # key 2 gets a value of the store's own init first; then a Trainer over
        # two_trainers' layer (keys 0 and 1) and a new one beside it (keys 2 and
        # 3, the layout uninit_pull gave key 3)
        kv.init(2, mx.nd.ones((2,)) * 7)
        net = Beside(SHARED[0], gluon.nn.Dense(2, in_units=3))
        net.b.initialize(mx.init.Constant(0.5))
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.0}, kvstore=kv)
        out["error"] = step_error([(net, trainer)])
    elif case == "sub_block":
        net = gluon.nn.Dense(4, in_units=3)
        net.initialize(mx.init.Constant(0.5))
        try:
            trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                                    kvstore=kv)
            out["error"] = step_error([(net, trainer)])
        except mxnet_mpi.MPIKVStoreError as e:
            out["error"] = str(e)
    elif case == "lr_changed":
        # two_trainers' net, whose weights hold keys 0 and 1 on the servers
        net = SHARED[0] if SHARED else gluon.nn.Dense(2, in_units=3)
        if not SHARED:
            net.initialize(mx.init.Constant(0.5))
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)

        def step():
            with mx.autograd.record():
                loss = net(mx.nd.ones((1, 3))).sum()
            loss.backward()
            trainer.step(1)
        step()
        trainer.set_learning_rate(0.05)
        try:
            step()
            out["error"] = None
        except mxnet_mpi.MPIKVStoreError as e:
            out["error"] = str(e)
    elif case in ("train_steps", "train_loop"):
        # train_loop: pushes and pulls until killed; train_steps: 5 steps, then 3 s
        # of other work; both print READY after the first step
        kv.init(0, mx.nd.zeros((4,)))
        g, w = mx.nd.ones((4,)), mx.nd.zeros((4,))
        looping = case == "train_loop"
        for step in range(100000 if looping else 5):
            kv.push(0, g)
            kv.pull(0, out=w)
            w.wait_to_read()
            if step == 0:
                print("READY rank %d pid %d" % (rank, os.getpid()), flush=True)
            if looping:
                time.sleep(0.01)
        time.sleep(3)
        out["w"] = w.asnumpy().tolist()
    mx.nd.waitall()
    return out


for case in args.case.split(","):
    print("RESULT " + json.dumps(run_case(case)), flush=True)

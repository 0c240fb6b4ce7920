"""Two Trainers (two nets of the same shapes: the same keys and layouts) on
ONE store object.

  mpirun -np 2 python shared_store.py same,order

same   every rank steps them in the same order: each net gets its own sums
       (the weights of one process stepping both on the ranks' whole batch);
order  rank 1 steps them in the other order: every rank raises, naming the
       store's second Trainer and each rank's parameters (it summed one net's
       gradients into the other's, silently).
shapes a second Trainer over a sub-block's parameters (other shapes at the
       same keys) is refused, naming both keys' parameters and the fix, and so
       is a Trainer at a key the store's own kv.init gave another shape; with a
       store of its own (kvstore='mpi') it trains as one process does.

Prints "RESULT <rank> <case> <outcome>".
"""

import sys

import mxnet as mx
import numpy as np

import mxnet_mpi

CASES = sys.argv[1].split(",")
RANK, SIZE = mxnet_mpi.rank(), mxnet_mpi.size()


def nets():
    a, b = mx.gluon.nn.Dense(3, in_units=5), mx.gluon.nn.Dense(3, in_units=5)
    a.initialize(mx.init.Constant(0.1))
    b.initialize(mx.init.Constant(-0.2))
    return a, b


NETS: list = []   # the last steps()'s two nets


def steps(kv, rows: list, order) -> list:
    a, b = nets()
    NETS[:] = [a, b]
    ta = mx.gluon.Trainer(a.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
    tb = mx.gluon.Trainer(b.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
    x = mx.nd.array(np.concatenate([np.full((2, 5), r + 1.0) for r in rows]))
    for _ in range(3):
        with mx.autograd.record():
            loss = a(x).sum() + 10 * b(x).sum()
        loss.backward()
        for t in order(ta, tb):
            t.step(2)
    return [a.weight.data().asnumpy(), b.weight.data().asnumpy()]


def same() -> str:
    mine = steps(mx.kv.create("mpi"), [RANK], lambda ta, tb: (ta, tb))
    ref = steps(None, list(range(SIZE)), lambda ta, tb: (ta, tb))
    return "matches" if all(np.allclose(m, r, rtol=1e-6) for m, r in zip(mine, ref)) \
        else "differs"


def order() -> str:
    try:
        steps(mx.kv.create("mpi"), [RANK], lambda ta, tb: (ta, tb) if RANK == 0 else (tb, ta))
        mx.nd.waitall()
        return "trained"
    except mxnet_mpi.MPIKVStoreError as e:
        # each rank's collective named by its own Trainer's parameters
        text, (a, b) = str(e), NETS
        said = "ranks disagree" in text and "the store's Trainer 2" in text and all(
            "'%s'" % p.name in text for p in (a.weight, b.weight))
        return "refused" if said else "other: " + text[:600]


def shapes() -> str:
    def train(stores, rows: list) -> list:
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Dense(4, in_units=5), mx.gluon.nn.Dense(2, in_units=4))
        net.initialize(mx.init.Constant(0.1))
        NETS[:] = [net]
        k1, k2 = stores()
        t1 = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=k1)
        t2 = mx.gluon.Trainer(net[1].collect_params(), "sgd", {"learning_rate": 0.1},
                              kvstore=k2)
        x = mx.nd.array(np.concatenate([np.full((2, 5), r + 1.0) for r in rows]))
        for t in (t1, t2, t1):
            with mx.autograd.record():
                loss = net(x).sum()
            loss.backward()
            t.step(2)
        return [p.data().asnumpy() for p in net.collect_params().values()]

    def one_store():
        kv = mx.kv.create("mpi")
        return kv, kv

    try:
        train(one_store, [RANK])
        return "trained on one store"
    except mxnet_mpi.MPIKVStoreError as e:
        # key 0: each Trainer's first parameter by name (the bias)
        text, first, second = str(e), NETS[0][0].bias.name, NETS[0][1].bias.name
        if "key 0 (parameter %r) for the store's Trainer 2" % second not in text or \
                "by parameter %r" % first not in text or "its own store" not in text:
            return "other: " + text[:600]
    # a key the store's own kv.init gave another shape: the hint says which
    # keys a Trainer takes
    raw = mx.kv.create("mpi")
    raw.init(0, mx.nd.zeros((7,)))
    try:
        train(lambda: (raw, "mpi"), [RANK])
        return "trained on a raw key"
    except mxnet_mpi.MPIKVStoreError as e:
        if "by the store's own calls" not in str(e) or "numbers past the Trainer's " \
                "parameters" not in str(e):
            return "other: " + str(e)[:600]
    mine = train(lambda: ("mpi", "mpi"), [RANK])
    ref = train(lambda: (None, None), list(range(SIZE)))
    return "refused, own stores match" if all(
        np.allclose(m, r, rtol=1e-6) for m, r in zip(mine, ref)) else "own stores differ"


for case in CASES:
    run = {"same": same, "order": order, "shapes": shapes}[case]
    print("RESULT %d %s %s" % (RANK, case, run()), flush=True)

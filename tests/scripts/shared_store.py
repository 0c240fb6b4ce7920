"""Two Trainers (two nets of the same shapes: the same keys and layouts) on
ONE store object.

  mpirun -np 2 python shared_store.py same,order

same   every rank steps them in the same order: each net gets its own sums
       (the weights of one process stepping both on the ranks' whole batch);
order  rank 1 steps them in the other order: every rank raises, naming the
       store's second Trainer and each rank's parameters (it summed one net's
       gradients into the other's, silently).

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


for case in CASES:
    print("RESULT %d %s %s" % (RANK, case, {"same": same, "order": order}[case]()), flush=True)

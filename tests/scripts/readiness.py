"""Randomised readiness: ranks make their arrays ready in different orders.

Run as `mpirun -np N python readiness.py OUT_DIR [N_KEYS] [SEED]`.

Every rank issues the same sequence of collectives (same keys, shapes,
dtypes and kinds, from a seed shared by all ranks), but before each one it
pushes a random amount of engine compute (a chain of mx.nd.dot on random
matrices, drawn from a per-rank seed) whose result is folded into the
array with a zero weight. So the arrays become ready after delays that
differ from rank to rank, and the collectives are pushed back to back with
no waiting. Priorities are random per rank too. At the end every result is
checked exactly against numpy, including ops pushed after the collectives
that read (or overwrite) their arrays.
"""

from __future__ import annotations

import os
import sys
import time

import mxnet as mx
import numpy as np
from _common import DTYPES, Results, data, total

import mxnet_mpi

RANK = mxnet_mpi.rank()
SIZE = mxnet_mpi.size()
KV = mx.kv.create(os.environ.get("MXMPI_TEST_STORE", "mpi"))  # e.g. mpi_<mode>
DEVS = [mx.cpu(0), mx.cpu(1)]


def nd(arr: np.ndarray, ctx=None):
    return mx.nd.array(arr, ctx=ctx or mx.cpu(0), dtype=arr.dtype)


class Delayer:
    """Pushes random engine work that must finish before an array is ready."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.pool = {n: mx.nd.array(rng.random((n, n)), dtype="float32")
                     for n in (16, 64, 128, 256, 384)}
        self.dots = 0

    def delay(self, arr) -> None:
        k = int(self.rng.integers(0, 5))  # 0 .. 4 chained dots
        if k == 0:
            return
        n = int(self.rng.choice(list(self.pool)))
        m = self.pool[n]
        s = m
        for _ in range(k):
            s = mx.nd.dot(s, m) / n
        self.dots += k
        zero = (mx.nd.sum(s) * 0).astype(arr.dtype).reshape((1,) * len(arr.shape))
        mx.nd.broadcast_add(arr, zero, out=arr)  # a write that waits for the dots


def random_shape(rng: np.random.Generator) -> tuple:
    ndim = int(rng.integers(1, 4))
    shape = tuple(int(x) for x in rng.integers(1, 6, size=ndim))
    return shape


def run(res: Results, n_keys: int, seed: int) -> None:
    common = np.random.default_rng(seed)  # identical on every rank
    mine = np.random.default_rng(seed * 1000 + 17 + 7919 * RANK)  # differs per rank
    delayer = Delayer(mine)
    checks = []
    plan = []
    for i in range(n_keys):
        kind = common.choice(["pushpull", "pushpull", "pushpull", "out", "devices",
                              "broadcast", "push"])
        plan.append((i if i % 2 else "k%d" % i, random_shape(common),
                     str(common.choice(DTYPES)), kind))
    # the first 60 keys again, with other data, at the end: keys reused while busy
    plan += [(k, s, d, kd) for k, s, d, kd in plan[:min(60, n_keys)]]

    t0 = time.time()
    for case, (key, shape, dtype, kind) in enumerate(plan):
        prio = int(mine.integers(-5, 6))
        what = "case %d key %r %s %s %s" % (case, key, kind, dtype, shape)
        if kind == "pushpull":
            a = nd(data(case, RANK, 0, shape, dtype))
            delayer.delay(a)
            KV.pushpull(key, a, priority=prio)
            want = total(case, SIZE, 1, shape, dtype)
            checks.append((a, want, what))
            if mine.random() < 0.4:  # a read right after the collective sees its result
                checks.append((a * 2, (want.astype(np.int64) * 2).astype(dtype),
                               what + " (read after)"))
        elif kind == "out":
            a = nd(data(case, RANK, 0, shape, dtype))
            o = nd(np.full(shape, 1, dtype=dtype))
            delayer.delay(a)
            delayer.delay(o)  # a pending write on the out as well
            KV.pushpull(key, a, out=o, priority=prio)
            a[:] = 3  # overwrite the value at once: must wait until the collective read it
            checks.append((o, total(case, SIZE, 1, shape, dtype), what))
            checks.append((a, np.full(shape, 3, dtype=dtype), what + " (value overwritten)"))
        elif kind == "devices":
            vals = [nd(data(case, RANK, d, shape, dtype), ctx) for d, ctx in enumerate(DEVS)]
            for v in vals:
                delayer.delay(v)
            KV.pushpull(key, vals, priority=prio)
            want = total(case, SIZE, len(DEVS), shape, dtype)
            checks.extend((v, want, what + " dev %d" % d) for d, v in enumerate(vals))
        elif kind == "push":  # push sums into the stored value, pull copies it out
            vals = [nd(data(case, RANK, d, shape, dtype), ctx) for d, ctx in enumerate(DEVS)]
            for v in vals:
                delayer.delay(v)
            KV.push(key, vals, priority=prio)
            o = nd(np.zeros(shape, dtype=dtype))
            delayer.delay(o)
            KV.pull(key, out=o, priority=prio)
            checks.append((o, total(case, SIZE, len(DEVS), shape, dtype), what))
        else:  # broadcast from rank 0 into a delayed out
            a = nd(data(case, RANK, 0, shape, dtype))
            o = nd(np.zeros(shape, dtype=dtype))
            delayer.delay(a)
            delayer.delay(o)
            KV.broadcast(key, a, out=o, priority=prio)
            checks.append((o, data(case, 0, 0, shape, dtype), what))
            checks.append((a, data(case, RANK, 0, shape, dtype), what + " (value kept)"))
    pushed = time.time() - t0
    for a, want, what in checks:
        res.equal(a, want, what)
    print("rank %d: %d collectives, %d dots, pushed in %.2fs, done in %.2fs"
          % (RANK, len(plan), delayer.dots, pushed, time.time() - t0), flush=True)
    res.check(len(checks) >= len(plan), "too few checks")


def main() -> None:
    out_dir = sys.argv[1]
    n_keys = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    res = Results(out_dir, RANK)
    res.run("readiness", run, n_keys, seed)
    res.write(size=SIZE, n_keys=n_keys)


if __name__ == "__main__":
    main()

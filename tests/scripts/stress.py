"""Stress: N collectives on K keys with random sizes (1 to ~200k elements),
pushed back to back; each rank delays each array by a different random amount
of engine work, so ranks make arrays ready in different orders; broadcasts are
interleaved. Every result is checked exactly.

  stress.py MODE N K
"""

import sys

import mxnet as mx
import numpy as np

import mxnet_mpi

mode, n, nkeys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kv = mx.kv.create("mpi_" + mode)
rank, size = mxnet_mpi.rank(), mxnet_mpi.size()
plan_rng = np.random.RandomState(7)           # same plan on every rank
delay_rng = np.random.RandomState(100 + rank)  # different delays per rank
sizes = np.exp(plan_rng.uniform(0, np.log(200_000), nkeys)).astype(int)
dtypes = plan_rng.choice(["float32", "int32", "float64"], nkeys)
mats = [mx.nd.array(delay_rng.rand(m, m)) for m in (32, 96, 192)]
scale = sum(r + 1 for r in range(size))
checks = []
for i in range(n):
    k = int(plan_rng.randint(nkeys))
    value = int(plan_rng.randint(1, 50))
    arr = mx.nd.full((int(sizes[k]),), value * (rank + 1), dtype=dtypes[k])
    if delay_rng.rand() < 0.5:  # random engine work before the array is ready
        m = mats[delay_rng.randint(len(mats))]
        s = m
        for _ in range(delay_rng.randint(1, 4)):
            s = mx.nd.dot(s, m)
        arr += (s.sum() * 0).astype(dtypes[k])
    if plan_rng.rand() < 0.15:
        out = mx.nd.zeros_like(arr)
        kv.broadcast(k, arr, out=out, priority=-k)
        checks.append((out, value))
    else:
        kv.pushpull(k, arr, priority=int(delay_rng.randint(-5, 5)))
        checks.append((arr, value * scale))
    if i % 500 == 499:  # bounded memory: let the engine catch up now and then
        for a, want in checks:
            assert (a.asnumpy() == want).all(), (i, a.dtype, want)
        checks.clear()
for a, want in checks:
    assert (a.asnumpy() == want).all(), (a.dtype, want)
print("STRESS_OK rank %d: %d collectives on %d keys in %s mode" % (rank, n, nkeys, mode),
      flush=True)

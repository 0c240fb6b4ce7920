"""Several stores alive at once (as with a GAN's two trainers), in the modes
given on the command line, use the SAME keys with different data; pushes are
interleaved and ranks make arrays ready in different orders. Each store must
return its own sums."""

import sys

import mxnet as mx
import numpy as np

import mxnet_mpi

modes = sys.argv[1].split(",")
rank, size = mxnet_mpi.rank(), mxnet_mpi.size()
stores = [mx.kv.create("mpi_" + m) for m in modes]
assert [s.mode for s in stores] == modes
rng = np.random.RandomState(100 + rank)  # per-rank delays
nkeys, rounds = 40, 3
scratch = mx.nd.zeros((64, 64))
expected, arrays = [], []
for rnd in range(rounds):
    for k in range(nkeys):
        for s_idx, store in enumerate(stores):
            n = 1 + (k * 37 + s_idx * 11) % 300
            base = np.arange(n, dtype=np.float32) + 1000 * s_idx + 7 * k + rnd
            arr = mx.nd.array(base * (rank + 1))
            # random per-rank engine work before the array is ready
            for _ in range(rng.randint(0, 4)):
                scratch = mx.nd.dot(scratch, scratch) * 0
            arr += scratch.sum() * 0
            store.pushpull(k, arr, priority=-k)
            arrays.append(arr)
            expected.append(base * sum(r + 1 for r in range(size)))
for arr, exp in zip(arrays, expected):
    np.testing.assert_array_equal(arr.asnumpy(), exp)
print("OK", len(arrays), "collectives over", len(stores), "stores", flush=True)

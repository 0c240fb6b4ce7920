"""Sum known integers over kvstore 'mpi' for many steps while a test pulls a
host's network cable; every result is checked exactly.

  python netfault_train.py --steps N --sleep S
Prints 'READY <rank>' after a warm-up, 'STEP <i>' (rank 0) after each step and
'EXACT <rank> <steps>' at the end; raises on any wrong sum.
"""

import argparse
import time

import mxnet as mx
import numpy as np

import mxnet_mpi  # noqa: F401  (registers kvstore "mpi")

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=50)
ap.add_argument("--sleep", type=float, default=0.1, help="seconds between steps")
ap.add_argument("--size", type=int, default=1 << 16, help="floats per key")
args = ap.parse_args()

kv = mx.kv.create("mpi")
rank, size = kv.rank, kv.num_workers
keys = ["a", "b", "c"]
bufs = {k: mx.nd.zeros((args.size,)) for k in keys}
warm = mx.nd.ones((4,))
kv.pushpull("warmup", warm)
warm.wait_to_read()
print("READY %d" % rank, flush=True)
ramp = np.arange(args.size, dtype=np.float32) % 7
for step in range(args.steps):
    for i, k in enumerate(keys):
        # small integers: exact in float32 whatever the summation order
        bufs[k][:] = mx.nd.array(ramp + rank + step + i)
        kv.pushpull(k, bufs[k], priority=-i)
    for i, k in enumerate(keys):
        want = size * (ramp + step + i) + size * (size - 1) // 2
        got = bufs[k].asnumpy()
        if not np.array_equal(got, want):
            raise AssertionError("rank %d step %d key %s: wrong sum (max error %g)"
                                 % (rank, step, k, np.abs(got - want).max()))
    if rank == 0:
        print("STEP %d" % step, flush=True)
    time.sleep(args.sleep)
print("EXACT %d %d" % (rank, args.steps), flush=True)

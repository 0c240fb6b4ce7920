"""Scenarios that must fail fast with a clear message on every rank.

  python faults.py SCENARIO MODE
    shape      key 'w' has shape (3,) on rank 0 and (4,) elsewhere
    dtype      key 'w' is float32 on rank 0 and float64 elsewhere
    order      ranks push keys 'a' and 'b' (same shapes) in different orders
    missing    only rank 0 pushes key 'only_rank0'; the others do other work
    two_stores a second store; rank 0 waits on the first store's key 'x' while
               rank 1 waits on the second's key 'y' (used in different orders)
    raise      rank 1 raises in the training loop
    sigkill    rank 1 kills itself with SIGKILL in the training loop
    ok         everything agrees (control)
"""

import os
import signal
import sys
import time

import mxnet as mx
from faults_caught import scenario as mismatch  # the same calls, left uncaught here

import mxnet_mpi  # noqa: F401  (registers the stores)

scenario, mode = sys.argv[1], sys.argv[2]
kv = mx.kv.create("mpi_" + mode)
rank = kv.rank
warm = mx.nd.ones((2,))
kv.pushpull("warmup", warm)
warm.wait_to_read()
print("rank %d ready" % rank, flush=True)

if scenario in ("shape", "dtype", "order", "ok"):
    mismatch(kv, scenario, rank)
elif scenario == "missing":
    a = mx.nd.ones((3,))
    if rank == 0:
        kv.pushpull("only_rank0", a)
        a.wait_to_read()
    else:
        time.sleep(120)
elif scenario == "two_stores":
    other = mx.kv.create("mpi_" + mode)
    a, b = mx.nd.ones((3,)), mx.nd.ones((4,))
    first, second = ((kv, "x", a), (other, "y", b)) if rank == 0 else ((other, "y", b),
                                                                     (kv, "x", a))
    for store, key, arr in (first, second):
        store.pushpull(key, arr)
        arr.wait_to_read()
elif scenario in ("raise", "sigkill"):
    a = mx.nd.ones((1000,))
    for step in range(10000):
        kv.pushpull("g", a)
        a.wait_to_read()
        a[:] = 1
        if rank == 1 and step == 5:
            if scenario == "raise":
                raise RuntimeError("boom on rank 1 at step 5")
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.01)
print("rank %d finished %s" % (rank, scenario), flush=True)

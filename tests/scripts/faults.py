"""Scenarios that must fail fast with a clear message on every rank.

  python faults.py SCENARIO MODE
    shape      key 'w' has shape (3,) on rank 0 and (4,) elsewhere
    dtype      key 'w' is float32 on rank 0 and float64 elsewhere
    order      ranks push keys 'a' and 'b' (same shapes) in different orders
    missing    only rank 0 pushes key 'only_rank0'; the others do other work
    raise      rank 1 raises in the training loop
    sigkill    rank 1 kills itself with SIGKILL in the training loop
    ok         everything agrees (control)
"""

import os
import signal
import sys
import time

import mxnet as mx

import mxnet_mpi

scenario, mode = sys.argv[1], sys.argv[2]
kv = mx.kv.create("mpi_" + mode)
rank = kv.rank
warm = mx.nd.ones((2,))
kv.pushpull("warmup", warm)
warm.wait_to_read()
print("rank %d ready" % rank, flush=True)

if scenario == "shape":
    a = mx.nd.ones((3,) if rank == 0 else (4,))
    kv.pushpull("w", a)
    a.wait_to_read()
elif scenario == "dtype":
    a = mx.nd.ones((3,), dtype="float32" if rank == 0 else "float64")
    kv.pushpull("w", a)
    a.wait_to_read()
elif scenario == "order":
    a, b = mx.nd.ones((5,)), mx.nd.ones((5,))
    keys = ["a", "b"] if rank == 0 else ["b", "a"]
    # first use in a common order, so only the later order differs
    kv.pushpull("a", a)
    kv.pushpull("b", b)
    mx.nd.waitall()
    kv.pushpull(keys[0], a)
    kv.pushpull(keys[1], b)
    mx.nd.waitall()
elif scenario == "missing":
    a = mx.nd.ones((3,))
    if rank == 0:
        kv.pushpull("only_rank0", a)
        a.wait_to_read()
    else:
        time.sleep(120)
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
elif scenario == "ok":
    a = mx.nd.ones((3,))
    kv.pushpull("w", a)
    assert a.asnumpy().tolist() == [mxnet_mpi.size()] * 3
print("rank %d finished %s" % (rank, scenario), flush=True)

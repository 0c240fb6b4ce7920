"""`import mxnet_mpi` in a plain `python` process (no mpirun): a world of size 1.

Prints one JSON line with what it saw; tests/test_world_single.py checks it.
"""

from __future__ import annotations

import json

import mxnet as mx
import numpy as np

import mxnet_mpi


def observe() -> dict:
    out = {"rank": mxnet_mpi.rank(), "size": mxnet_mpi.size(),
           "local_rank": mxnet_mpi.local_rank(), "local_size": mxnet_mpi.local_size()}
    w = mxnet_mpi.world()
    out["world"] = [w.id, w.rank, w.size]
    kv = mx.kv.create("mpi")
    out["kv"] = [kv.rank, kv.num_workers, kv.type]
    problems = []
    for dtype in mxnet_mpi.SUPPORTED_DTYPES:
        x = (np.arange(12) % 7 - 3).reshape(3, 4).astype(dtype)
        a = mx.nd.array(x, dtype=dtype)
        kv.pushpull("pp-" + dtype, a)
        o = mx.nd.zeros((3, 4), dtype=dtype)
        kv.pushpull("ppo-" + dtype, mx.nd.array(x, dtype=dtype), out=o)
        b = mx.nd.zeros((3, 4), dtype=dtype)
        kv.broadcast("bc-" + dtype, mx.nd.array(x, dtype=dtype), out=b)
        kv.init("init-" + dtype, mx.nd.array(x, dtype=dtype))
        p = mx.nd.zeros((3, 4), dtype=dtype)
        kv.pull("init-" + dtype, out=p)
        d = mx.nd.array(x, dtype=dtype)
        mxnet_mpi.allreduce_(d, comm=w)
        for what, got in (("pushpull", a), ("pushpull out", o), ("broadcast", b),
                          ("init/pull", p), ("allreduce_", d)):
            got = got.asnumpy()
            if got.dtype != x.dtype or not np.array_equal(got, x):
                problems.append("%s %s changed the value: %s" % (what, dtype, got))
    out["problems"] = problems
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(observe()), flush=True)

"""Ranks that create different stores (another kvstore type, or other
MXNET_MPI_* store settings in the environment) get an MPIKVStoreError naming
what each created, on every rank, at once, and nothing is left half made: a
store created alike afterwards sums exactly. (Stores of different kinds
duplicate different communicators; left unchecked, the ranks' collectives
would not meet and the job would wait for the stall abort.)

Prints one JSON line per rank.
"""

import json
import os

import mxnet as mx
import numpy as np

import mxnet_mpi

rank = mxnet_mpi.rank()
out = {"rank": rank}


def refused(create) -> str:
    try:
        create()
    except mxnet_mpi.MPIKVStoreError as e:
        return str(e)
    return ""


out["kinds"] = refused(lambda: mx.kv.create("mpi_funneled" if rank == 0 else "mpi_chained"))
if rank == 1:
    os.environ["MXNET_MPI_CHUNK_BYTES"] = "65536"
out["settings"] = refused(lambda: mx.kv.create("mpi"))
os.environ.pop("MXNET_MPI_CHUNK_BYTES", None)
kv = mx.kv.create("mpi")
x = mx.nd.array(np.arange(1000) * (rank + 1), dtype="float32")
kv.pushpull("x", x)
out["exact_after"] = bool(np.array_equal(x.asnumpy(), np.arange(1000) * 3.0))
print(json.dumps(out), flush=True)

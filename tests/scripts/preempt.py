"""Pre-emption in the funneled store (MXNET_MPI_PREEMPT_BYTES).

  python preempt.py OUT_DIR

order   a large allreduce (priority 0) is pushed, then, while it moves piece by
        piece, a small one (priority 10): the small one must complete before
        the large one (from the timeline). Prints
        "ORDER small_first=<bool> pieces=<n> between=<bool>" (between: the
        small one ran between two pieces of the large one, i.e. it became
        ready after the large one started and still went first).
hints   arrays large and small, with priorities that differ between ranks
        (each rank its own permutation), summed and averaged: exact.
join    rank 0 pushes one large allreduce and joins; the others push three
        more, pre-empted piece by piece while rank 0 stands in: exact.

Every rank prints "PREEMPT_OK rank <r>" at the end.
"""

import json
import os
import sys
import time

import mxnet as mx
import numpy as np

import mxnet_mpi
from mxnet_mpi import timeline

out_dir = sys.argv[1]
rank, size = mxnet_mpi.rank(), mxnet_mpi.size()
kv = mx.kv.create("mpi_funneled")
piece = kv.stream.options()["preempt_bytes"]
assert piece == 4096, "run with MXNET_MPI_PREEMPT_BYTES=4096 (the pieces counted below)"
scale = size * (size + 1) // 2          # sum over ranks of (rank + 1)

# ----------------------------------------------------------------- order
timeline.start()
n_large = 1 << 21                       # 8 MiB of float32: 2048 pieces of 4 KiB
large = mx.nd.full((n_large,), rank + 1)
small = mx.nd.full((10,), 10 * (rank + 1))
mx.nd.waitall()
kv.pushpull("large", large, priority=0)
time.sleep(0.005)                       # the large one is under way
kv.pushpull("small", small, priority=10)
mx.nd.waitall()
assert (large.asnumpy() == scale).all()
assert (small.asnumpy() == 10 * scale).all()
trace = timeline.dump(os.path.join(out_dir, "trace.json"), rank)
timeline.stop()
with open(trace) as f:
    events = {e["name"].split()[1]: e["args"] for e in json.load(f)["traceEvents"]
              if e.get("cat") == "collective"}
big, little = events["key='large'"], events["key='small'"]
pieces = big.get("pieces_us", [])
between = any(a[1] <= little["start_us"] and little["end_us"] <= b[0]
              for a, b in zip(pieces, pieces[1:]))
print("ORDER rank %d small_first=%s pieces=%d between=%s"
      % (rank, little["end_us"] < big["end_us"], len(pieces), between), flush=True)

# ----------------------------------------------------------------- hints
rng = np.random.RandomState(3)          # the same arrays on every rank
sizes = [int(n) for n in rng.choice([3, 1000, 70_000, 300_000], 24)]
prio = np.random.RandomState(50 + rank).permutation(len(sizes))   # differ by rank
for average in (False, True):
    kv.average = average
    arrs = [mx.nd.full((n,), (i + 1) * (rank + 1), dtype="float64") for i, n in enumerate(sizes)]
    for i, a in enumerate(arrs):
        kv.pushpull(i, a, priority=int(prio[i]))
    for i, a in enumerate(arrs):
        want = (i + 1) * scale / (size if average else 1)
        assert (a.asnumpy() == want).all(), (average, i, sizes[i])
kv.average = False

# ----------------------------------------------------------------- join
steps = 1 if rank == 0 else 3
arrs = [mx.nd.full((200_000,), (s + 1) * (rank + 1)) for s in range(steps)]
for s, a in enumerate(arrs):
    kv.pushpull("j%d" % s, a, priority=-s)
kv.join()
for s, a in enumerate(arrs):
    want = (s + 1) * (scale if s == 0 else scale - 1)   # rank 0 joined after step 0
    assert (a.asnumpy() == want).all(), (s, a[:3].asnumpy(), want)
print("PREEMPT_OK rank %d" % rank, flush=True)

"""A job beside another on one machine: exact allreduces until told to stop.

  mpirun -np 2 python shm_neighbours.py STOP_FILE

Prints "rank R segments PATHS job NAME" (the shared-memory segments this
process has mapped: its own and its peers', from /proc/self/maps; the job's
name, PMIX_NAMESPACE) after its first
allreduce, then allreduces every 20 ms, checking each sum exactly, until a
rank sees STOP_FILE (the ranks agree on it through the sum; at most 60 s),
and prints "rank R exact N".
"""

from __future__ import annotations

import os
import sys
import time

import mxnet as mx
import numpy as np

import mxnet_mpi  # noqa: F401

stop_file = sys.argv[1]
kv = mx.kv.create("mpi")
rank, size = kv.rank, kv.num_workers
want = size * (size + 1) / 2


def allreduce(step: int, stop: bool = False) -> bool:
    """One allreduce, checked; whether any rank wants to stop."""
    a = mx.nd.full((5001,), rank + 1)
    a[5000] = float(stop)
    kv.pushpull("w", a)
    got = a.asnumpy()
    if not np.all(got[:5000] == want):
        raise SystemExit("rank %d step %d: sum %s, not %s" % (rank, step, got[:4], want))
    return bool(got[5000] > 0)


allreduce(0)
with open("/proc/self/maps") as f:   # a file unlinked since is "PATH (deleted)"
    mapped = sorted({line.split(None, 5)[5].strip().removesuffix(" (deleted)")
                     for line in f if "/sm_segment." in line})
print("rank %d segments %s job %s" % (rank, " ".join(mapped), os.environ["PMIX_NAMESPACE"]),
      flush=True)
steps, end = 1, time.time() + 60
while not allreduce(steps, os.path.exists(stop_file) or time.time() > end):
    steps += 1
    time.sleep(0.02)
print("rank %d exact %d" % (rank, steps), flush=True)

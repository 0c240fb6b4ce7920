"""Waits at the edges of a job across hosts (test_network_faults.py).

  mpirun ... python netfault_edges.py late_store   rank 1 creates its store 4 s after
                                                  the others (MPI started on both)
  mpirun ... python netfault_edges.py finish       READY after one allreduce, then
                                                  (the test stops a host's Open MPI
                                                  daemon) one more and DONE
"""

from __future__ import annotations

import sys
import time

import mxnet as mx

import mxnet_mpi

scenario = sys.argv[1]
rank = mxnet_mpi.rank()   # starts MPI on every rank
print("READY %d" % rank, flush=True)
if scenario == "late_store":
    if rank == 1:
        time.sleep(4)
    kv = mx.kv.create("mpi")
else:
    kv = mx.kv.create("mpi")
    a = mx.nd.ones((1 << 12,)) * (rank + 1)
    kv.pushpull("g", a)
    a.wait_to_read()
    time.sleep(3)
kv.pushpull("h", mx.nd.ones((4,)))
mx.nd.waitall()
print("DONE %d" % rank, flush=True)

"""A worker for tests/test_launch.py, run by ``python -m mxnet_mpi.launch``.

  --mode fail    create a dist_sync_mpi store (ps-lite is live), then rank
                 FAIL_RANK raises
  --mode kill    the same, but rank FAIL_RANK dies by SIGKILL
  --mode sleep   create the store, print READY, sleep (the test signals the launcher)
  --mode mpi     pure MPI (launch --servers 0): allreduce with kvstore 'mpi' and
                 print what the launcher set up
"""

import argparse
import os
import signal
import sys
import time

import mxnet as mx

import mxnet_mpi

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=("fail", "kill", "sleep", "mpi"), required=True)
ap.add_argument("--fail-rank", type=int, default=1)
args = ap.parse_args()

rank = mxnet_mpi.rank()
if args.mode == "mpi":
    kv = mx.kv.create("mpi")
    x = mx.nd.ones((3,)) * (rank + 1)
    kv.pushpull(0, x)
    print("SUM %s GROUP_SIZE %s DMLC_VARS %s" % (
        x.asnumpy().tolist(), os.environ.get("MXNET_MPI_GROUP_SIZE"),
        sorted(k for k in os.environ if k.startswith("DMLC_"))), flush=True)
    sys.exit(0)

kv = mx.kv.create("dist_sync_mpi")
w = mx.nd.zeros((4,))
kv.init(0, w)
kv.pushpull(0, mx.nd.ones((4,)), out=w)     # through the server: sum over all ranks
total = w.asnumpy().tolist()
barrier = mx.nd.ones((1,))
mxnet_mpi.allreduce_(barrier)
barrier.asnumpy()   # every rank got here: ps-lite is up and in use everywhere
print("READY rank %d pid %d ps_worker %s sum %s" % (rank, os.getpid(), kv.is_ps_worker, total),
      flush=True)
if args.mode in ("fail", "kill"):
    if rank == args.fail_rank:
        if args.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("rank %d fails on purpose" % rank)
    time.sleep(120)     # the launcher must not wait for this
else:
    time.sleep(300)

"""A worker for tests/test_launch.py, run by ``python -m mxnet_mpi.launch``.

  --mode fail    create a dist_sync_mpi store (ps-lite is live), then rank
                 FAIL_RANK raises
  --mode kill    the same, but rank FAIL_RANK dies by SIGKILL
  --mode sleep   create the store, print READY, sleep (the test signals the launcher)
  --mode mpi     pure MPI (launch --servers 0): allreduce with kvstore 'mpi' and
                 print what the launcher set up
  --mode exit-hang  no store and no MPI (launch --servers 0): each rank computes,
                 prints SCRIPT_DONE and ends its script; then rank 1 waits for
                 ever in an exit handler and rank 0 in an object's __del__ at
                 interpreter teardown
"""

import argparse
import atexit
import os
import signal
import sys
import time
import types

import mxnet as mx

import mxnet_mpi

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=("fail", "kill", "sleep", "mpi", "exit-hang"), required=True)
ap.add_argument("--fail-rank", type=int, default=1)
args = ap.parse_args()

if args.mode == "exit-hang":
    mpi_rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    assert mx.nd.ones((2,)).sum().asscalar() == 2
    if mpi_rank == 1:
        atexit.register(time.sleep, 300)   # runs first: registered last

    class Stuck:
        def __del__(self, sleep=time.sleep):
            sleep(300)

    if mpi_rank == 0:   # a module's objects are freed at interpreter teardown
        stash = types.ModuleType("_exit_hang_stash")
        stash.obj = Stuck()
        sys.modules[stash.__name__] = stash
    print("SCRIPT_DONE rank %d pid %d" % (mpi_rank, os.getpid()), flush=True)
    sys.exit(0)

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

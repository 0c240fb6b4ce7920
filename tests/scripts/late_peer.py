"""Ranks waiting for a late peer sleep: rank 1 comes 3 s late to the first
store's creation, then to a communicator split; rank 0 prints the CPU time
its process took per second of each wait ('WAIT <what> <cpu/wall>')."""

import time
from typing import Any, Callable

import mxnet as mx

import mxnet_mpi

LATE_S = 3.0
world = mxnet_mpi.world()   # MPI starts on every rank at once


def wait(what: str, call: Callable[[], Any]) -> Any:
    if world.rank == 1:
        time.sleep(LATE_S)
    wall, cpu = time.monotonic(), time.process_time()
    result = call()
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    if world.rank == 0:
        print("WAIT %s %.3f after %.1f s" % (what, cpu / wall, wall), flush=True)
    return result


kv = wait("store", lambda: mx.kv.create("mpi"))
half = wait("split", lambda: world.split(0))
a = mx.nd.ones((3,))
kv.pushpull("x", a, out=a)
print("rank %d sum %s" % (world.rank, a.asnumpy().tolist()), flush=True)
half.free()

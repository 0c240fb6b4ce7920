"""Rank 1 raises an uncaught exception while rank 0 waits in a pushpull that
can never complete: mxnet_mpi's excepthook must abort the whole job."""

import mxnet as mx

import mxnet_mpi

kv = mx.kv.create("mpi")
if mxnet_mpi.rank() == 1:
    raise RuntimeError("deliberate failure on rank 1")
a = mx.nd.ones((4,))
kv.pushpull("never-matched", a)
a.wait_to_read()  # blocks: rank 1 never joins
print("rank 0 finished", flush=True)

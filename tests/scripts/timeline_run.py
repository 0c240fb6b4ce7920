"""Known collectives with MXNET_MPI_TIMELINE set, and MXNet's profiler on."""

import sys

import mxnet as mx

import mxnet_mpi

mode, prof = sys.argv[1], sys.argv[2]
mx.profiler.set_config(profile_all=True, filename=prof % mxnet_mpi.rank())
mx.profiler.set_state("run")
kv = mx.kv.create("mpi_" + mode)
arrs = [mx.nd.ones((100 * (i + 1),)) for i in range(5)]
for _step in range(4):
    for i in reversed(range(5)):
        kv.pushpull(i, arrs[i], priority=-i)
kv.broadcast("b", arrs[0], out=mx.nd.zeros_like(arrs[0]))
mx.nd.waitall()
mx.profiler.set_state("stop")
mx.profiler.dump()
print("pushed 21 collectives", flush=True)

"""Known collectives with MXNET_MPI_TIMELINE set, and MXNet's profiler on.

  python timeline_run.py MODE[,MODE...] PROFILE_PATTERN
Mode number m (in the order given) uses keys 10*m .. 10*m+4 and broadcast key
'b<m>', so each mode's events can be told apart in one trace."""

import sys

import mxnet as mx

import mxnet_mpi

modes, prof = sys.argv[1].split(","), sys.argv[2]
mx.profiler.set_config(profile_all=True, filename=prof % mxnet_mpi.rank())
mx.profiler.set_state("run")
for m, mode in enumerate(modes):
    kv = mx.kv.create("mpi_" + mode)
    arrs = [mx.nd.ones((100 * (i + 1),)) for i in range(5)]
    for _step in range(4):
        for i in reversed(range(5)):
            kv.pushpull(10 * m + i, arrs[i], priority=-i)
    kv.broadcast("b%d" % m, arrs[0], out=mx.nd.zeros_like(arrs[0]))
    mx.nd.waitall()
mx.profiler.set_state("stop")
mx.profiler.dump()
print("pushed %d collectives" % (21 * len(modes)), flush=True)

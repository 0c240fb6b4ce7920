"""40 small allreduces ready together, per mode (each its own store), with
the default MXNET_MPI_FUSION_BYTES and with 0 (no fusion): the store is
created after the setting changes on every rank, so one job runs both.
Keys: '<mode initial><fusion bytes>k<i>'. Run with MXNET_MPI_TIMELINE set."""

import os
import sys

import mxnet as mx
import numpy as np

import mxnet_mpi

for mode in sys.argv[1].split(","):
    for fusion in ("1048576", "0"):
        os.environ["MXNET_MPI_FUSION_BYTES"] = fusion
        kv = mx.kv.create("mpi_" + mode)
        keys = ["%s%sk%d" % (mode[0], fusion, i) for i in range(40)]
        xs = [mx.nd.full((100,), i) for i in range(40)]
        outs = [mx.nd.zeros((100,)) for _ in range(40)]
        kv.init(keys, xs)
        mx.nd.waitall()
        # the 40 inputs are one op's outputs, after a slow one: all are pushed
        # before any is ready, and all become ready at once (pushed ready, one
        # by one, each could start alone)
        big = mx.nd.ones((600, 600))
        gate = mx.nd.dot(big, big)[0, 0:1] * 0
        flat = mx.nd.broadcast_add(mx.nd.concat(*xs, dim=0), gate)
        for key, x, out in zip(keys, mx.nd.split(flat, num_outputs=40, axis=0), outs):
            kv.pushpull(key, x, out=out)
        mx.nd.waitall()
        ok = all(np.array_equal(o.asnumpy(), np.full(100, i * mxnet_mpi.size(), "f"))
                 for i, o in enumerate(outs))
        print("rank %d %s fusion %s exact %s" % (mxnet_mpi.rank(), mode, fusion, ok), flush=True)
        del kv

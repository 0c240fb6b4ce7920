"""A hybrid store given an integer array: refused with a named error on every
rank (MXNet's server aborted on it, ending the job with no word from us);
floating-point keys then train on. Prints REFUSED <dtype> and SUM <values>."""

import mxnet as mx

import mxnet_mpi

kv = mx.kv.create("dist_sync_mpi")
for dtype in ("int32", "uint8"):
    try:
        kv.init("n_" + dtype, mx.nd.zeros((4,), dtype=dtype))
        print("NOT REFUSED %s" % dtype, flush=True)
    except mxnet_mpi.MPIKVStoreError as e:
        named = "floating-point arrays only" in str(e) and dtype in str(e)
        print("REFUSED %s %s" % (dtype, named), flush=True)
kv.init("f", mx.nd.zeros((3,)))
out = mx.nd.zeros((3,))
kv.pushpull("f", mx.nd.ones((3,)), out=out)
print("SUM %s" % out.asnumpy().tolist(), flush=True)

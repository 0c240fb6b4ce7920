"""A device of the rank skips SyncBatchNorm (two CPU contexts, one rank).

  python syncbn_skip.py forward    a training forward on device 0 alone, then a
                                   step on both: the step is refused (no pairing
                                   of device 0's second forward with device 1's
                                   first), nothing is left waiting, and the next
                                   step on both devices works
  python syncbn_skip.py backward   only device 0's loss is backpropagated: the
                                   layer's backward waits for device 1 until the
                                   stall watchdog aborts, naming the layer
"""

import sys

import mxnet as mx
import numpy as np
from mxnet import autograd

import mxnet_mpi

ctx = [mx.cpu(0), mx.cpu(1)]
bn = mxnet_mpi.SyncBatchNorm(in_channels=3)
bn.initialize(ctx=ctx)
xs = [mx.nd.array(np.random.RandomState(i).rand(4, 3)).as_in_context(c) for i, c in enumerate(ctx)]

if sys.argv[1] == "forward":
    with autograd.record():
        alone = bn(xs[0])
    try:
        with autograd.record():
            for x in xs:
                bn(x)
    except mxnet_mpi.MPIKVStoreError as exc:
        print("REFUSED", exc, flush=True)
    mx.nd.waitall()   # the abandoned forward was ended (with NaN), not left waiting
    print("ALONE_NAN", bool(np.isnan(alone.asnumpy()).all()), flush=True)
    with autograd.record():   # a full step afterwards meets again
        ys = [bn(x) for x in xs]
    both = np.concatenate([y.asnumpy() for y in ys])
    # as one BatchNorm over both devices' samples
    ref = mx.gluon.nn.BatchNorm(in_channels=3)
    ref.initialize()
    with autograd.record():
        want = ref(mx.nd.concat(*[x.as_in_context(mx.cpu()) for x in xs], dim=0)).asnumpy()
    print("RECOVERED", bool(np.allclose(both, want, rtol=1e-4, atol=1e-5)), flush=True)
else:
    for x in xs:
        x.attach_grad()
    with autograd.record():
        ys = [bn(x) for x in xs]
    ys[0].backward()
    print("BACKWARD_PUSHED", flush=True)
    xs[0].grad.wait_to_read()
    print("UNEXPECTED: backward finished without device 1", flush=True)

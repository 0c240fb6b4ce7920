"""When a hybridized block's gradients become ready, with MXNet's backward
segment default as this process found it (no flag) and with MXNet's own 15 ops
per segment (a flag on the block), in a process that imports nothing but
mxnet (with the argument ``package-first``: mxnet_mpi, then mxnet).

Four Dense layers: backward makes the last layer's gradients first. Prints one
JSON line: the environment's MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD and, per
configuration, the smallest of 3 passes of (ready time of the second layer's
weight gradient - that of the fourth's), in ms: about one layer's backward
when every op is a segment of its own, about 0 when both are made in one.
"""

import json
import os
import sys
import time

if sys.argv[1:] == ["package-first"]:
    import mxnet_mpi  # noqa: F401

import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402


def spread(**flags) -> float:
    net = gluon.nn.HybridSequential()
    for _ in range(4):
        net.add(gluon.nn.Dense(1024, activation="relu", in_units=1024))
    net.initialize()
    net.hybridize(static_alloc=True, static_shape=True, **flags)
    x = mx.nd.random.uniform(shape=(256, 1024))
    weights = [layer.weight for layer in net]
    gaps = []
    for _ in range(4):
        mx.nd.waitall()
        with autograd.record():
            y = net(x).sum()
        y.backward()
        weights[3].grad().wait_to_read()
        t3 = time.perf_counter()
        weights[1].grad().wait_to_read()
        gaps.append((time.perf_counter() - t3) * 1e3)
    return min(gaps[1:])   # the first pass builds the graph


print(json.dumps({"env": os.environ.get("MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD"),
                  "default": spread(), "mxnet15": spread(backward_bulk_size=15)}), flush=True)

"""What MXNet's engine does with the defaults this process found (no flag) and
with MXNet's own (a flag), in a process that imports nothing but mxnet (with
the argument ``package-first``: mxnet_mpi, then mxnet; with ``mxnet-first``:
mxnet, then mxnet_mpi, and only ``update`` is measured).

Prints one JSON line: the three variables as the process found them and, in
ms, the smallest of a few measurements of

- ``backward``: the ready time of the second of four Dense layers' weight
  gradient minus that of the fourth's (backward makes the last layer's first):
  about one layer's backward when every op is an engine segment of its own,
  about 0 when both come out of one segment (flag: 15 ops per segment);
- in an MPI job of two ranks only (rank 0 prints):
  ``forward``: of eight Dense layers, the last one's weight is held as being
  written for ``HOLD_S`` (as a weight still on the wire); from its release
  until the forward's output is ready: about one layer's forward when the
  first seven ran meanwhile (a segment per op), the whole forward when they
  are one segment waiting for that weight (flag: 15 ops per segment);
  ``update``: the gradient of the fourth of four parameters arrives late
  (rank 1 sends it ``HOLD_S`` after a barrier);
  from ``Trainer.step`` until the first parameter is updated: about 0 when
  each parameter has its own update op, about the hold when SGD updates the
  four in one op (flag: the optimizer's group of 4, MXNet's default).
"""

import json
import os
import sys
import time

ORDER = sys.argv[1] if sys.argv[1:] else "mxnet"
if ORDER == "package-first":
    import mxnet_mpi  # noqa: F401

import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

if ORDER == "mxnet-first":
    import mxnet_mpi  # noqa: F401, E402

HOLD_S = 0.3
VARS = ("MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD", "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD",
        "MXNET_OPTIMIZER_AGGREGATION_SIZE")


def dense_net(width: int, layers: int = 4, dtype: str = "float32", **flags):
    net = gluon.nn.HybridSequential()
    for _ in range(layers):
        net.add(gluon.nn.Dense(width, activation="relu", in_units=width))
    net.initialize()
    net.cast(dtype)
    net.hybridize(static_alloc=True, static_shape=True, **flags)
    return net


def spread(**flags) -> float:
    net = dense_net(1024, **flags)
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


def barrier() -> None:
    mxnet_mpi.ops.allreduce(mx.nd.zeros((1,))).wait_to_read()


def held(arr, rank: int) -> float:
    """Rank 1 sends `arr` to rank 0 HOLD_S after a barrier: until then rank
    0's `arr` has a pending write (a broadcast waiting on the network, not on
    a core). Returns when it arrives, as perf_counter (waiting for `arr`
    itself would queue behind the ops already waiting on it)."""
    barrier()
    arrival = time.perf_counter() + HOLD_S
    if rank == 1:
        time.sleep(HOLD_S)
    mxnet_mpi.ops.broadcast_(arr, root_rank=1)
    return arrival


def forward_tail(**flags) -> float:
    # The last layer's weight is held as being written (an engine op that
    # does not finish until released, as a weight whose allreduce is still
    # on the wire), in this process: the tail is measured from the release,
    # on this process's clock, with no peer's timing in it.
    from mxnet_mpi import _native
    net = dense_net(512, layers=8, dtype="float64", **flags)   # held writes are float64
    x = mx.nd.random.uniform(shape=(256, 512), dtype="float64")
    with autograd.record():
        net(x).wait_to_read()   # builds the graph
    weight = net[7].weight.data()
    tails = []
    for _ in range(3):
        value = weight.copy()
        mx.nd.waitall()
        ticket = _native.hold_write(weight, "forward probe: the last layer's weight")
        with autograd.record():
            y = net(x)
        time.sleep(HOLD_S)   # the first seven layers run meanwhile, or wait
        released = time.perf_counter()
        _native.release_write(ticket, value)
        y.wait_to_read()
        tails.append((time.perf_counter() - released) * 1e3)
    return min(tails)


def update_wait(rank: int, group: int | None = None) -> float:
    net = gluon.nn.Sequential()
    for _ in range(2):
        net.add(gluon.nn.Dense(256, in_units=256))   # 4 parameters: w, b, w, b
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=None)
    if group is not None:
        trainer._optimizer.aggregate_num = group
    params = list(net.collect_params().values())
    x = mx.nd.ones((8, 256))
    waits = []
    for _ in range(2):
        with autograd.record():
            y = net(x).sum()
        y.backward()
        mx.nd.waitall()
        held(params[3].grad(), rank)
        t0 = time.perf_counter()
        trainer.step(8)
        params[0].data().wait_to_read()
        waits.append((time.perf_counter() - t0) * 1e3)
        mx.nd.waitall()
    return min(waits)


out = {"env": {v: os.environ.get(v) for v in VARS}}
if ORDER != "mxnet-first":
    out["backward"] = {"default": spread(), "mxnet15": spread(backward_bulk_size=15)}
if int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) == 2:
    import mxnet_mpi

    rank = mxnet_mpi.rank()
    if ORDER != "mxnet-first":
        out["forward"] = {"default": forward_tail(),
                          "mxnet15": forward_tail(forward_bulk_size=15)}
    out["update"] = {"default": update_wait(rank), "grouped": update_wait(rank, group=4),
                     "hold": HOLD_S * 1e3}
    if rank != 0:
        sys.exit(0)
print(json.dumps(out), flush=True)

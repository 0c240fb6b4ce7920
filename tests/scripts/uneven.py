"""Uneven data: ranks with different numbers of batches.

  mpirun -np N python uneven.py MODE SCENARIO

join      rank r trains 2 + 3 r steps (SGD with momentum), counting the ranks
          with data by mxnet_mpi.allreduce_ at each, then calls
          mxnet_mpi.join(trainer). Every rank must end with the weights of a
          single process that, at each step, sums the gradients of the ranks
          that still had data (the joined ones contribute nothing), and with the
          same optimizer state (checked by one more step on every rank).
no_join   the same, but ranks just end their program: the ranks that still
          train must fail fast, naming the rank that finished.
join_all  as join, with mxnet_mpi.join() (no argument): the Trainer created on
          the store is brought up to date all the same
join_kv   as join, with the store's own kv.join() (the Trainer was given the store)
join_zero, join_zero_all
          as join and join_all, but rank 1 has no batch at all (its Trainer
          never stepped); with join_zero_all the layer's input size is
          inferred at the first forward, which rank 1 never runs
join_devices
          as join, with Adam, rank 0 (fewest steps) on 2 devices: the root's
          update-count tables are per device id, so rank 0's second device
          counted from 0 again after the join (Adam apart between its copies)
join_zero_root
          as join_zero_all with rank 0 the one with no batch: the others
          take the deferred weights from rank 0 at their first forward, which
          cannot be done once it joined (rank 0 warns why; the job fails)
"""

from __future__ import annotations

import os
import sys
import time

import mxnet as mx
import numpy as np

import mxnet_mpi

mode, scenario = sys.argv[1], sys.argv[2]
RANK, SIZE = mxnet_mpi.rank(), mxnet_mpi.size()
ZERO = 0 if scenario == "join_zero_root" else 1   # the rank with no batch at all
STEPS = [0 if r == ZERO and scenario.startswith("join_zero") else 2 + 3 * r for r in range(SIZE)]
DEFERRED = scenario in ("join_zero_all", "join_zero_root")
BATCH = 4
OPT = ("adam", {"learning_rate": 0.05}) if scenario == "join_devices" else \
    ("sgd", {"learning_rate": 0.05, "momentum": 0.9})
CONTEXTS = [mx.cpu(0), mx.cpu(1)] if scenario == "join_devices" and RANK == 0 else [mx.cpu()]


def batch(r: int, step: int):
    rng = np.random.RandomState(1000 * r + step)
    return mx.nd.array(rng.randn(BATCH, 5)), mx.nd.array(rng.randn(BATCH, 2))


def model(contexts=None):
    net = mx.gluon.nn.Dense(2, in_units=0 if DEFERRED else 5)
    net.initialize(mx.init.Constant(0.1), ctx=list(contexts or [mx.cpu()]))
    return net


def backward(net, x, y) -> None:
    """The loss of batch (x, y) split over the net's devices, backpropagated."""
    contexts = net.weight.list_ctx()
    xs = mx.gluon.utils.split_and_load(x, contexts)
    ys = mx.gluon.utils.split_and_load(y, contexts)
    with mx.autograd.record():
        losses = [loss_of(net, a, b) for a, b in zip(xs, ys)]
    mx.autograd.backward(losses)


def loss_of(net, x, y):
    return ((net(x) - y) ** 2).sum()


def reference(extra_step: bool) -> np.ndarray:
    """One process: at each step the summed gradient of the ranks with data."""
    net = model()
    for p in net.collect_params().values():
        p.grad_req = "add"
    trainer = mx.gluon.Trainer(net.collect_params(), OPT[0], dict(OPT[1]))
    for step in range(max(STEPS) + (1 if extra_step else 0)):
        for p in net.collect_params().values():
            p.zero_grad()
        for r in range(SIZE):
            if step < STEPS[r] or step == max(STEPS):
                x, y = batch(r, step)
                with mx.autograd.record():
                    loss = loss_of(net, x, y)
                loss.backward()
        trainer.step(BATCH)
    return net.weight.data().asnumpy()


net = model(CONTEXTS)
store = mx.kv.create("mpi_" + mode) if scenario == "join_kv" else "mpi_" + mode
# join_devices: the Trainer gets an optimizer object, which the program may
# keep using after a join (it was replaced by a copy on the ranks not the root)
optimizer = mx.optimizer.create(OPT[0], **OPT[1]) if scenario == "join_devices" else OPT[0]
trainer = mx.gluon.Trainer(net.collect_params(), optimizer,
                           None if scenario == "join_devices" else dict(OPT[1]), kvstore=store)
for step in range(STEPS[RANK]):
    backward(net, *batch(RANK, step))
    trainer.step(BATCH)
    if scenario != "no_join":
        # a metric through the free functions: the ranks that joined already
        # serve it with zeros (they left it waiting for the stall abort)
        metric = mx.nd.array([1.0])
        mxnet_mpi.allreduce_(metric, name="ranks with data")
        with_data = sum(1 for r in range(SIZE) if STEPS[r] > step)
        assert metric.asscalar() == with_data, (step, metric.asscalar(), with_data)
mx.nd.waitall()
if scenario == "no_join":
    print("rank %d ends its program at %.3f" % (RANK, time.time()), flush=True)
    sys.exit(0)
if scenario in ("join", "join_zero", "join_devices"):
    root = mxnet_mpi.join(trainer)
elif scenario == "join_kv":
    root = store.join()
else:
    root = mxnet_mpi.join()
if scenario == "join_devices":
    assert trainer._optimizer is optimizer, "join replaced the Trainer's optimizer object"
    # the last rank (one device) saves, every rank loads: the file's update
    # counts are for one device id, and rank 0's second device counted from 0
    path = "/tmp/mxmpi-uneven-states-%d" % os.getppid()   # the ranks' launcher
    if RANK == SIZE - 1:
        trainer.save_states(path)
    mxnet_mpi.allreduce_(mx.nd.ones((1,)), name="states saved").wait_to_read()
    trainer.load_states(path)
    mxnet_mpi.allreduce_(mx.nd.ones((1,)), name="states loaded").wait_to_read()
    if RANK == SIZE - 1:
        os.remove(path)
# One more step on every rank: equal optimizer states give equal weights.
step = max(STEPS)
backward(net, *batch(RANK, step))
trainer.step(BATCH)
copies = [a.asnumpy() for a in net.weight.list_data()]
got = copies[0]
want = reference(extra_step=True)
print("rank %d root %d maxdiff %.3g checksum %.9g" % (RANK, root, np.abs(got - want).max(),
                                                      got.sum()), flush=True)
assert root == SIZE - 1, root
assert np.allclose(got, want, rtol=1e-5, atol=1e-6), (got, want)
assert all((c == got).all() for c in copies), copies   # every device alike
print("rank %d JOIN OK" % RANK, flush=True)

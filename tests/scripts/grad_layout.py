"""The last rank's gradient has another shape at step 2 of 4 (the error caught
on every rank), then the steps go on; every rank ends with the weights of
steps 1, 3 and 4 on the concatenated batches (one process, computed here), and
sums a check key on the same store.

  mpirun -np 2 python grad_layout.py MODE HOW

HOW: step     Trainer.step; the second layer's weight gradient is off
     split    allreduce_grads() and update() in one try
     split_stale  each in a try of its own, update(ignore_stale_grad=True)
     devices  2 devices per rank; the first layer's gradient on the second
              device is off (the local sum failed before any collective)

What went wrong before: the failing rank left the general path's collectives
where its peers ran the step's plan (the pairing shifted, the job aborted); a
failed step's other collectives left errors on gradients that the next step
then skipped (it failed too, updating only some parameters); in the split
form the failing rank raised in allreduce_grads() and never pushed update()'s
batch sizes; with 2 devices the peers' step 2 paired with the failing rank's
step 3 (wrong weights, exit 0).

Prints "STEP <rank> <step> <error>", "WEIGHTS <rank> <max diff to the
reference>" and "CHECK <rank> <sum>".
"""

import sys

import mxnet as mx
import numpy as np

import mxnet_mpi

mode, how = sys.argv[1], sys.argv[2]
kv = mx.kv.create("mpi_" + mode)
R, N = kv.rank, kv.num_workers
devices = [mx.cpu(0), mx.cpu(1)] if how == "devices" else [mx.cpu(0)]


def make(ctx):
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(5, in_units=4), mx.gluon.nn.Dense(3, in_units=5))
    net.initialize(mx.init.Constant(0.1), ctx=ctx)
    return net


def data(r, step):
    rng = np.random.RandomState(10 * r + step)
    return rng.randn(4, 4).astype("float32"), rng.randn(4, 3).astype("float32")


def losses(net, x, y, ctx):
    per = len(x) // len(ctx)
    return [((net(mx.nd.array(x[k * per:(k + 1) * per], ctx=c))
              - mx.nd.array(y[k * per:(k + 1) * per], ctx=c)) ** 2).sum()
            for k, c in enumerate(ctx)]


ref = make([mx.cpu(0)])
ref_trainer = mx.gluon.Trainer(ref.collect_params(), "sgd", {"learning_rate": 0.05},
                               kvstore=None)
for step in (1, 3, 4):
    x = np.concatenate([data(r, step)[0] for r in range(N)])
    y = np.concatenate([data(r, step)[1] for r in range(N)])
    with mx.autograd.record():
        loss = losses(ref, x, y, [mx.cpu(0)])[0]
    loss.backward()
    ref_trainer.step(4)

net = make(devices)
trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05}, kvstore=kv)
off = net[0].weight if how == "devices" else net[1].weight
for step in (1, 2, 3, 4):
    x, y = data(R, step)
    with mx.autograd.record():
        ls = losses(net, x, y, devices)
    mx.autograd.backward(ls)
    saved = list(off._grad)
    if step == 2 and R == N - 1:
        k = len(devices) - 1
        shape = (off.shape[0], off.shape[1] + 1)
        off._grad[k] = mx.nd.zeros(shape, ctx=devices[k])
    errors = []
    if how == "split_stale":   # each call in a try of its own
        for call in (trainer.allreduce_grads,
                     lambda: trainer.update(4, ignore_stale_grad=True), mx.nd.waitall):
            try:
                call()
            except mxnet_mpi.MPIKVStoreError as e:
                errors.append(e)
    else:
        try:
            if how == "split":
                trainer.allreduce_grads()
                trainer.update(4)
            else:
                trainer.step(4)
            mx.nd.waitall()
        except mxnet_mpi.MPIKVStoreError as e:
            errors.append(e)
    if errors:
        print("STEP %d %d %s" % (R, step, str(errors[0]).replace("\n", " ")), flush=True)
    off._grad[:] = saved
diff = max(float(np.abs(p.data(devices[0]).asnumpy() - q.data().asnumpy()).max())
           for p, q in zip(net.collect_params().values(), ref.collect_params().values()))
print("WEIGHTS %d %.3g" % (R, diff), flush=True)
check = mx.nd.ones((5,)) * (R + 1)
kv.pushpull("check", check, out=check)
print("CHECK %d %g" % (R, check.asnumpy()[0]), flush=True)

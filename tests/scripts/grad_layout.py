"""The last rank's weight gradient has another shape at Trainer.step 2 (the
error caught on every rank), then every rank sums a check key on the same
store. The failing rank left the general path's collectives (the batch sizes
alone, a token per key) where its peers ran the step's plan (one grouped
collective carrying the batch sizes): the peers were told of another
collective, the check key paired with a token, and the job aborted.

  mpirun -np 2 python grad_layout.py MODE

Prints "STEP <rank> <step> <error>" and "CHECK <rank> <sum>".
"""

import sys

import mxnet as mx

import mxnet_mpi

kv = mx.kv.create("mpi_" + sys.argv[1])
R, N = kv.rank, kv.num_workers
net = mx.gluon.nn.Dense(3, in_units=4)
net.initialize(mx.init.One())
trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
x, y = mx.nd.ones((8, 4)), mx.nd.zeros((8, 3))
for step in (1, 2):
    with mx.autograd.record():
        loss = ((net(x) - y) ** 2).sum()
    loss.backward()
    if step == 2 and R == N - 1:
        net.weight._grad[0] = mx.nd.zeros((3, 5))
    try:
        trainer.step(8)
        mx.nd.waitall()
    except mxnet_mpi.MPIKVStoreError as e:
        print("STEP %d %d %s" % (R, step, str(e).replace("\n", " ")), flush=True)
check = mx.nd.ones((5,)) * (R + 1)
kv.pushpull("check", check, out=check)
print("CHECK %d %g" % (R, check.asnumpy()[0]), flush=True)

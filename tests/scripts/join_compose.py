"""Joins composed with other features (found probing), 2 ranks; rank r runs
3 - r batches per epoch, then joins.

  mpirun -np 2 python join_compose.py SCENARIO

module_loop  a Module trained by hand (forward_backward + update), then
             mxnet_mpi.join(), then 2 more batches: the ranks ended apart
             (join copied Trainers only), exit 0
check_every  two epochs with mxnet_mpi.join(trainer) after each, under
             MXNET_MPI_CONSISTENCY_EVERY=2 (set by the test): the ranks'
             check counters drifted apart ('ranks disagree', exit 1)
lanes        concurrent mode with 2 lanes for large arrays (MXNET_MPI_LARGE_LANES,
             set by the test), an 80 KB weight: the joined rank had taken the
             lanes in turn fewer times, and the copy after the join hung
chained_two  two Trainers on chained stores, then mxnet_mpi.join(): their
             concurrent joins met the one process-wide chain in different
             orders (stall abort); now a named error
three_stores a store of one's own and two Trainers, then mxnet_mpi.join(), four
             epochs: a store's join thread that started late joined the free
             functions' store a second time (about 1 round in 3 hung)
Prints "WEIGHTS <rank> <values>" or "ERROR <rank> <message>".
"""

from __future__ import annotations

import sys

import mxnet as mx
from mxnet import autograd, gluon, nd

import mxnet_mpi

scenario = sys.argv[1]
R = mxnet_mpi.rank()

if scenario == "module_loop":
    sym = mx.sym.LinearRegressionOutput(mx.sym.FullyConnected(
        mx.sym.Variable("data"), num_hidden=1, name="fc"), name="lro")
    mod = mx.mod.Module(sym, context=mx.cpu(), label_names=["lro_label"])
    mod.bind(data_shapes=[("data", (4, 3))], label_shapes=[("lro_label", (4, 1))])
    mod.init_params(mx.init.One())
    mod.init_optimizer(kvstore="mpi", optimizer="sgd",
                       optimizer_params={"learning_rate": 0.01, "momentum": 0.9})

    def batch(s: int):
        return mx.io.DataBatch([nd.ones((4, 3)) * (s + 1)], [nd.zeros((4, 1))])
    for s in range(3 - R):
        mod.forward_backward(batch(s))
        mod.update()
    mxnet_mpi.join()
    for s in range(2):
        mod.forward_backward(batch(10 + s))
        mod.update()
    print("WEIGHTS %d %s" % (R, mod.get_params()[0]["fc_weight"].asnumpy().ravel().tolist()),
          flush=True)
elif scenario == "check_every":
    net = gluon.nn.Dense(2, in_units=3)
    net.initialize(mx.init.One())
    tr = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore="mpi")
    for _epoch in range(2):
        for s in range(3 - R):
            with autograd.record():
                loss = net(nd.ones((4, 3)) * (s + 1)).sum()
            loss.backward()
            tr.step(4)
        mxnet_mpi.join(tr)
    print("WEIGHTS %d %s" % (R, net.weight.data().asnumpy().ravel().tolist()), flush=True)
elif scenario == "lanes":
    net = gluon.nn.Dense(200, in_units=100)
    net.initialize(mx.init.One())
    tr = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                       kvstore="mpi_concurrent")
    for s in range(3 - R):
        with autograd.record():
            loss = net(nd.ones((4, 100)) * (s + 1)).sum()
        loss.backward()
        tr.step(4)
    mxnet_mpi.join()
    print("WEIGHTS %d %s" % (R, float(net.weight.data().asnumpy().sum())), flush=True)
elif scenario == "three_stores":
    kv = mx.kv.create("mpi")
    ev = nd.ones((2,))
    kv.pushpull("ev", ev, out=ev)
    nets = [gluon.nn.Dense(1, in_units=2) for _ in range(2)]
    trainers = []
    for net in nets:
        net.initialize(mx.init.Constant(1))
        trainers.append(gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                                      kvstore="mpi"))
    for _epoch in range(4):
        for s in range(3 - R):
            for net, tr in zip(nets, trainers):
                with autograd.record():
                    loss = net(nd.ones((1, 2)) * (s + 1)).sum()
                loss.backward()
                tr.step(1)
        mxnet_mpi.join()
    print("WEIGHTS %d %s" % (R, [n.weight.data().asnumpy().ravel().tolist() for n in nets]),
          flush=True)
elif scenario == "chained_two":
    nets = [gluon.nn.Dense(2, in_units=3) for _ in range(2)]
    trainers = []
    for net in nets:
        net.initialize()
        trainers.append(gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                                      kvstore="mpi_chained"))
    for net, tr in zip(nets, trainers):
        with autograd.record():
            loss = net(nd.ones((4, 3))).sum()
        loss.backward()
        tr.step(4)
    try:
        mxnet_mpi.join()
    except mxnet_mpi.MPIKVStoreError as e:
        print("ERROR %d %s" % (R, e), flush=True)

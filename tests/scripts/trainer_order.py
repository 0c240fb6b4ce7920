"""Record the order in which Trainer issues collectives, and prove overlap:
a gate holds back the first layer's gradient; the last layer's gradient must
be fully allreduced while the gate is still closed (backprop not finished).

The order comes from the communication timeline (MXNET_MPI_TIMELINE, or
started here when it is unset, writing to the path given as argument):
collectives sorted by the time they were pushed."""

import json
import os
import re
import sys
import threading

import mxnet as mx
from mxnet import autograd, gluon

import mxnet_mpi

GATE = threading.Event()


class Gate(mx.operator.CustomOp):
    """Identity whose backward waits for GATE: layer 0's gradient depends on it."""

    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], in_data[0])

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        GATE.wait(60)
        self.assign(in_grad[0], req[0], out_grad[0])


@mx.operator.register("gate")
class GateProp(mx.operator.CustomOpProp):
    def __init__(self):
        super().__init__(need_top_grad=True)

    def list_arguments(self):
        return ["data"]

    def infer_shape(self, in_shape):
        return in_shape, in_shape, []

    def create_operator(self, ctx, shapes, dtypes):
        return Gate()


class Net(gluon.Block):
    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.layers = [gluon.nn.Dense(64, in_units=64) for _ in range(4)]
            for i, layer in enumerate(self.layers):
                self.register_child(layer, "l%d" % i)

    def forward(self, x):
        x = mx.nd.Custom(self.layers[0](x), op_type="gate")
        for layer in self.layers[1:]:
            x = layer(x)
        return x


TRACE = os.environ.get("MXNET_MPI_TIMELINE") or sys.argv[1]
if not os.environ.get("MXNET_MPI_TIMELINE"):
    mxnet_mpi.timeline.start()
net = Net()
net.initialize()
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore="mpi")
x = mx.nd.random.uniform(shape=(16, 64))
GATE.set()
with autograd.record():
    loss = net(x).sum()
loss.backward()
trainer.step(1)
mx.nd.waitall()
trace = mxnet_mpi.timeline.dump(TRACE, mxnet_mpi.rank())
with open(trace) as f:
    events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "collective"]
issued = []
for e in sorted(events, key=lambda e: e["args"]["enqueue_us"]):
    m = re.match(r"allreduce keys?=\(?([0-9, ]+)\)?", e["name"])
    if m:  # one key, or a group of one layer's keys ("keys=(7, 6)")
        issued.extend(int(k) for k in m.group(1).replace(" ", "").split(",") if k)
print("ORDER", issued)

GATE.clear()
with autograd.record():
    loss = net(x).sum()
loss.backward()
trainer.allreduce_grads()
last = list(net.collect_params().values())[-1]
waiter = threading.Thread(target=lambda: last.grad().wait_to_read(), daemon=True)
waiter.start()
waiter.join(20)
print("LAST_REDUCED_WHILE_GATE_CLOSED", not waiter.is_alive())
GATE.set()
mx.nd.waitall()
if not os.environ.get("MXNET_MPI_TIMELINE"):
    mxnet_mpi.timeline.stop()

"""Mode selection by name and environment; prints what it finds."""

import logging
import os

import mxnet as mx

import mxnet_mpi

logging.basicConfig(level=logging.INFO, format="LOG %(message)s")
print("DEFAULT", mxnet_mpi.DEFAULT_MODE)
print("ENV", os.environ.get("MXNET_MPI_MODE"))
kv = mx.kv.create("mpi")
print("MPI_TYPE", kv.type, kv.mode)
for m in mxnet_mpi.MODES:
    s = mx.kv.create("mpi_" + m)
    print("BY_NAME", m, s.type, s.mode)
for bad in ("mpi_bogus", "mpi_funneld"):
    try:
        mx.kv.create(bad)
    except mxnet_mpi.MPIKVStoreError as e:
        print("UNKNOWN_NAME", bad, "|", e)
net = mx.gluon.nn.Dense(2, in_units=2)
net.initialize()
try:
    mx.gluon.Trainer(net.collect_params(), "sgd", kvstore="mpi_chaned")
except mxnet_mpi.MPIKVStoreError as e:
    print("UNKNOWN_NAME trainer |", e)



# A store of the user's own, registered with MXNet under a name in our
# namespace, is the user's: created and used as MXNet would (it was refused
# as an unknown mxnet_mpi store)
@mx.kv.KVStoreBase.register
class MPIStoreOfMine(mx.kv.KVStoreBase):   # registered as 'mpistoreofmine'
    def __init__(self):
        pass

    def broadcast(self, key, value, out, priority=0):
        for o in out if isinstance(out, list) else [out]:
            value.copyto(o)

    def pushpull(self, key, value, out=None, priority=0):
        if out is not None:
            for o in out if isinstance(out, list) else [out]:
                value.copyto(o)

    def is_capable(self, capability):
        return False

    @property
    def type(self):
        return "mpistoreofmine"

    @property
    def rank(self):
        return 0

    @property
    def num_workers(self):
        return 1

    def set_optimizer(self, optimizer):
        raise NotImplementedError

    def save_optimizer_states(self, fname, dump_optimizer=False):
        raise NotImplementedError

    def load_optimizer_states(self, fname):
        raise NotImplementedError


mine = mx.kv.create("mpistoreofmine")
tr = mx.gluon.Trainer(net.collect_params(), "sgd", kvstore="mpistoreofmine")
with mx.autograd.record():
    loss = net(mx.nd.ones((1, 2))).sum()
loss.backward()
tr.step(1)
# (one worker on one device: MXNet's Trainer uses no store at all, as without mxnet_mpi)
print("OWN_STORE", type(mine).__name__, "stepped", tr._kvstore is None)

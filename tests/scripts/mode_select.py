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

"""Misconfigured hybrid stores fail with a clear MPIKVStoreError on every rank
(under plain mpirun, without the launcher). Prints `ERR <case>: <message>`."""

import os

import mxnet as mx
from mxnet import gluon

import mxnet_mpi

PS_ENV = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9", "DMLC_NUM_SERVER": "1"}


def attempt(case: str, make) -> None:
    try:
        make()
    except mxnet_mpi.MPIKVStoreError as e:
        print("ERR %s: %s" % (case, str(e).splitlines()[0]), flush=True)
    else:
        print("ERR %s: no error" % case, flush=True)


def trainer(kvstore: str):
    net = gluon.nn.Dense(2, in_units=3)
    net.initialize()
    return gluon.Trainer(net.collect_params(), "sgd", kvstore=kvstore)


rank, size = mxnet_mpi.rank(), mxnet_mpi.size()
# No ps-lite set-up; the plain string goes through Trainer to our store.
attempt("no_ps_env", lambda: trainer("dist_sync_mpi"))
os.environ.update(PS_ENV)
os.environ["DMLC_NUM_WORKER"] = "5"
attempt("no_role", lambda: mx.kv.create("dist_async_mpi"))   # MXNet's own check failed deep
os.environ["DMLC_ROLE"] = "worker"
attempt("num_worker", lambda: mx.kv.create("dist_async_mpi"))
# ps-lite waited for good on a port 'abc' and failed deep inside on 0 servers
for name, value in (("DMLC_PS_ROOT_PORT", "abc"), ("DMLC_NUM_SERVER", "0")):
    good, os.environ[name] = os.environ[name], value
    attempt(name, lambda: mx.kv.create("dist_sync_mpi"))
    os.environ[name] = good
os.environ["MXNET_MPI_GROUP_SIZE"] = str(size + 1)
attempt("group_size", lambda: mx.kv.create("dist_sync_mpi"))
os.environ["MXNET_MPI_GROUP_SIZE"] = "1"
os.environ["MXNET_MPI_HYBRID_ROUTE"] = "sharded"
attempt("sharded_sync", lambda: mx.kv.create("dist_sync_mpi"))
os.environ["MXNET_MPI_HYBRID_ROUTE"] = "nearest"
attempt("bad_route", lambda: mx.kv.create("dist_async_mpi"))
print("rank %d done" % rank, flush=True)

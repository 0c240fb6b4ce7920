"""An unchanged MXNet script: it never names the package, the store is a string.

  python -m mxnet_mpi plain_mxnet.py KVSTORE [fail|exit3]   (the runner)
  python plain_mxnet.py KVSTORE                             (the start-up hook)

fail: the last rank raises after the first step; exit3: every rank calls sys.exit(3)
after it; exit3-last: only the last rank does, the others go on training;
raise3-last: the same with `raise SystemExit(3)`.

Rank r's gradient is [r + 1, 0]; with lr 1 and batch 1 one step leaves the
weight at -(sum over ranks of r + 1) when the ranks really communicate, and
at -(r + 1) when each trains alone. Prints "WEIGHT <rank> <w0> <w1>", and
after `import mxnet` whether libmpi is loaded and MPI initialised ("mpi ...").
"""

import ctypes
import os
import sys

import mxnet as mx
from mxnet import autograd, gluon

kvstore = sys.argv[1]
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))


def mpi_state() -> str:
    try:
        libmpi = ctypes.CDLL("libmpi.so.40", mode=os.RTLD_NOLOAD)
    except OSError:
        return "absent"
    flag = ctypes.c_int()
    libmpi.MPI_Initialized(ctypes.byref(flag))
    return "initialised" if flag.value else "loaded"


print("name %s argv %s mpi %s path0 %s file %s"
      % (__name__, sys.argv[1:], mpi_state(), sys.path[0], __file__), flush=True)
net = gluon.nn.Dense(1, in_units=2, use_bias=False)
net.initialize(mx.init.Constant(0.0))
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1.0}, kvstore=kvstore)
x = mx.nd.array([[rank + 1.0, 0.0]])
with autograd.record():
    loss = net(x).sum()
loss.backward()
trainer.step(1)
w = net.weight.data().asnumpy().ravel()
print("WEIGHT %d %g %g" % (rank, w[0], w[1]), flush=True)
if "exit3" in sys.argv[2:] or ("exit3-last" in sys.argv[2:] and rank == size - 1):
    sys.exit(3)
if "raise3-last" in sys.argv[2:] and rank == size - 1:
    raise SystemExit(3)   # not through sys.exit: the runner must still see the status
if "fail" in sys.argv[2:] and rank == size - 1:
    raise ValueError("boom in the user's script")
for _ in range(200):   # the other ranks go on training: the failure must end them
    with autograd.record():
        loss = net(x).sum()
    loss.backward()
    trainer.step(1)
    net.weight.data().wait_to_read()

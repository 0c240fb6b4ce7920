"""A rank starts a process that uses a store before the rank's own first
store: the child started MPI first, with the rank's launch environment, and
the rank's own start of MPI crashed the job (a segmentation fault, status
255). The rank is refused instead, naming the child.

  mpirun -np 2 python child_first.py

Prints "CHILD <rank> <sum>" from each child, then "RANK refused <child pid>
<message>" (or "RANK made a store").
"""

import subprocess
import sys

import mxnet as mx

import mxnet_mpi

CHILD = ("import sys, mxnet as mx\n"
         "kv = mx.kv.create('mpi')\n"
         "a = mx.nd.ones(2)\n"
         "kv.pushpull('c', a)\n"
         "print('CHILD', kv.rank, a.asnumpy().tolist(), flush=True)\n"
         "sys.stdin.read()\n")   # holds MPI until the rank is done

child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)   # the child has MPI up
try:
    mx.kv.create("mpi")
    print("RANK made a store", flush=True)
except mxnet_mpi.MPIKVStoreError as e:
    print("RANK refused %d %s" % (child.pid, e), flush=True)
child.stdin.close()
child.wait(timeout=60)

"""Closing a store right after its last result arrived, again and again.

  mpirun -np N --bind-to none python close_race.py MODE=CYCLES [MODE=CYCLES ...]

The rank's last request completes on an engine thread that may still be
inside the store; close() must not take the lanes from under it. The race
shows when the rank's threads are not bound to one core (the test pools'
--bind-to none): before the fix, 1,000 chained cycles crashed or hung in 5 of
5 runs. Prints "CLOSED <mode> <cycles> <seconds>" per mode, every result
checked.
"""

import sys
import time

import mxnet as mx

import mxnet_mpi

size = mxnet_mpi.size()
for arg in sys.argv[1:]:
    mode, cycles = arg.split("=")[0], int(arg.split("=")[1])
    t0 = time.monotonic()
    for i in range(cycles):
        kv = mx.kv.create("mpi_" + mode)
        a, b = mx.nd.ones((3,)) * i, mx.nd.ones((5,))
        kv.pushpull("w", a)
        kv.pushpull("v", b)
        assert a.asnumpy().tolist() == [float(i * size)] * 3, (mode, i, a)
        assert b.asnumpy().tolist() == [float(size)] * 5, (mode, i, b)
        kv.close()
    print("CLOSED %s %d %.2f" % (mode, cycles, time.monotonic() - t0), flush=True)

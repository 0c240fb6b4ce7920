"""Closing a store right after its last result arrived, again and again,
while busy processes hold the cores (the load under which the race showed).

  mpirun -np N python close_race.py MODE=CYCLES [MODE=CYCLES ...]

The rank's last request completes on an engine thread that may still be
inside the store; close() must not take the lanes from under it. Prints
"CLOSED <mode> <cycles> <seconds>" per mode, with every result checked.
"""

import ctypes
import signal
import subprocess
import sys
import time

import mxnet as mx

import mxnet_mpi

runs = [(arg.split("=")[0], int(arg.split("=")[1])) for arg in sys.argv[1:]]
size = mxnet_mpi.size()


def die_with_parent() -> None:   # a rank that dies cannot leave them spinning
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"], preexec_fn=die_with_parent,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(2)]
try:
    for mode, cycles in runs:
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
finally:
    for p in busy:
        p.kill()
        p.wait()

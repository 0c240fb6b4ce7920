"""A world of one (no mpirun): sums through the store, then prints where its
shared-memory segment is and what a process it starts inherits; with `wait`,
waits to be killed.

  python singleton_segments.py [wait]
"""

import os
import subprocess
import sys
import time

import mxnet as mx

import mxnet_mpi

kv = mx.kv.create("mpi")
a = mx.nd.ones(3)
kv.pushpull("a", a)
assert a.asnumpy().tolist() == [1.0, 1.0, 1.0] and mxnet_mpi.size() == 1
# the segment this process has mapped, wherever Open MPI put it
with open("/proc/self/maps") as f:
    mapped = {ln.split(None, 5)[5].strip() for ln in f
              if len(ln.split(None, 5)) == 6 and "/sm_segment." in ln}
[segment] = mapped
print("DIR", os.path.dirname(segment), flush=True)
print("FILES", os.path.basename(segment), flush=True)
child = subprocess.run([sys.executable, "-c", "import os; "
                        "print(os.environ.get('OMPI_MCA_btl_sm_backing_directory'))"],
                       capture_output=True, text=True, check=True)
print("CHILD", child.stdout.strip(), flush=True)
if sys.argv[1:] == ["wait"]:
    time.sleep(120)

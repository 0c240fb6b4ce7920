"""The end of a job whose ranks fork: DataLoader worker processes, and exits
that cannot finish.

  mpirun -np 2 python exit_forks.py loaders CYCLES
      first each rank forks a child that computes with MXNet, tries a store
      (must be refused: 'store refused: ...') and exits 0 ('child exited with
      status 0'), then runs a Python process that uses a store, twice: with
      the rank's launch environment (refused, not a second copy of the rank:
      'subprocess inherited refused True') and with mxnet_mpi.rank_children.
      detached() ('subprocess detached world 0 1 ...'), and starts
      Python's multiprocessing resource tracker with a shared-memory block
      left for it to remove (the rank's exit must let it do so). Then train
      with kvstore='mpi' from DataLoaders with 2 fork workers each:
      CYCLES loaders made, partly used (collectives in flight while workers
      fork) and dropped, the last one alive at exit, as a training script
      leaves it. Then each rank also leaves a forked child running that holds
      its output (as a worker pool never terminated would: mpirun would wait
      for it). Prints 'WEIGHTS <rank> <checksum>' and exits normally.
  mpirun -np 2 python exit_forks.py stuck
      rank 1's exit cannot finish: an exit handler that runs after
      mxnet_mpi's waits for ever (as a worker pool that never stops would).
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
import time
from multiprocessing import shared_memory

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_mpi

scenario = sys.argv[1]
CHILD = ("import mxnet as mx, mxnet_mpi\n"
         "try:\n"
         "    kv = mx.kv.create('mpi'); a = mx.nd.ones((3,)); kv.init(0, a)\n"
         "    kv.pushpull(0, a, out=a)\n"
         "    print('world', mxnet_mpi.rank(), mxnet_mpi.size(), a.asnumpy().tolist())\n"
         "except mxnet_mpi.MPIKVStoreError as exc:\n"
         "    print('refused', 'second copy of rank' in str(exc))\n")
if scenario == "stuck" and os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
    # Registered before MPI starts, so it runs after mxnet_mpi's exit handler.
    atexit.register(threading.Event().wait)

rank = mxnet_mpi.rank()
net = gluon.nn.Dense(4, in_units=12)
net.initialize(mx.init.Constant(0.01))
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore="mpi")


def step(x, y) -> None:
    with autograd.record():
        loss = ((net(x.as_in_context(mx.cpu())) - y.as_in_context(mx.cpu())) ** 2).sum()
    loss.backward()
    trainer.step(x.shape[0])


if scenario == "loaders":
    kv = mx.kv.create("mpi")
    pid = os.fork()
    if pid == 0:
        b = (mx.nd.ones((50, 50)) * 2).sum().asscalar()
        try:
            kv.pushpull("in-child", mx.nd.ones((2,)))
            refused = "NOT REFUSED"
        except mxnet_mpi.MPIKVStoreError as exc:
            refused = "refused: %s" % str(exc).splitlines()[0]
        print("child of rank %d computed %g, store %s" % (rank, b, refused), flush=True)
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    print("rank %d child exited with status %d" % (rank, os.waitstatus_to_exitcode(status)),
          flush=True)
    kv.pushpull("after-fork", mx.nd.ones((2,)))
    for how, env in (("inherited", None), ("detached", mxnet_mpi.rank_children.detached())):
        child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                               timeout=120, env=env)
        print("rank %d subprocess %s %s status %d"
              % (rank, how, child.stdout.strip(), child.returncode), flush=True)
        sys.stderr.write(child.stderr)
    # the tracker would remove the block when this rank's process is gone
    block = shared_memory.SharedMemory(
        create=True, size=64, name="exit_forks_%s_%d" % (os.environ["EXIT_FORKS_TOKEN"], rank))

rng = np.random.RandomState(rank)
data = gluon.data.ArrayDataset(rng.rand(64, 12).astype("f"), rng.rand(64, 4).astype("f"))
if scenario == "loaders":
    cycles = int(sys.argv[2])
    for cycle in range(cycles):
        loader = gluon.data.DataLoader(data.transform_first(lambda v: v * 2), batch_size=8,
                                       shuffle=True, num_workers=2, prefetch=4)
        for i, (x, y) in enumerate(loader):
            step(x, y)
            if i == 2 + cycle % 3:   # leave with batches still being prepared
                break
    # `loader` (and its pool of 2 workers) lives until the interpreter exits
    if os.fork() == 0:
        time.sleep(3600)
        os._exit(0)
else:
    step(mx.nd.ones((2, 12)), mx.nd.ones((2, 4)))
print("WEIGHTS %d %.6f" % (rank, net.weight.data().asnumpy().sum()), flush=True)

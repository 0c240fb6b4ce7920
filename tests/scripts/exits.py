"""How ranks leave a job: every way ends it fast and names who, or stays clean.

  mpirun -np 2 python exits.py SCENARIO MODE

Every rank prints "rank R pid P ready" once its store works, then:
  stopped        rank 0 keeps pushing; the test SIGSTOPs rank 1 by pid
  sys_exit       rank 1 calls sys.exit(1); rank 0 keeps pushing
  raise_exit     rank 1 raises SystemExit(3) from a function; rank 0 keeps pushing
  argparse       rank 1 parses bad arguments (argparse exits with status 2)
  pending_error  a collective fails (shapes differ) and nobody waits for it;
                 the program ends normally: exit 0, no abort, a note on stderr
  caught_exit1   a collective error is caught, then every rank sys.exit(1)s
  interrupt      rank 1 raises KeyboardInterrupt (status 130, as Python's); rank 0 keeps
                 pushing
  exit_256       every rank calls sys.exit(256), which Python exits 0 with (256 mod 256)
  exit_caught    rank 1 catches argparse's exit (status 2) and a thread of it calls
                 sys.exit(4) (which ends only that thread); both ranks then push and
                 end cleanly: exit 0
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import mxnet as mx

import mxnet_mpi

scenario, mode = sys.argv[1], sys.argv[2]
kv = mx.kv.create("mpi_" + mode)
RANK = kv.rank
a = mx.nd.ones((1000,))
kv.pushpull("warm", a)
a.wait_to_read()
print("rank %d pid %d ready" % (RANK, os.getpid()), flush=True)


def keep_pushing(seconds: float, steps: int = 10 ** 9) -> None:
    """Allreduce every 50 ms for `steps` steps or until `seconds` have passed."""
    end = time.time() + seconds
    step = 0
    while time.time() < end and step < steps:
        a[:] = 1
        kv.pushpull("g", a)
        a.wait_to_read()
        step += 1
        time.sleep(0.05)


def leave() -> None:
    raise SystemExit(3)


if scenario == "stopped":
    keep_pushing(120)
elif scenario == "sys_exit":
    if RANK == 1:
        time.sleep(0.5)
        sys.exit(1)
    keep_pushing(120)
elif scenario == "raise_exit":
    if RANK == 1:
        time.sleep(0.5)
        leave()
    keep_pushing(120)
elif scenario == "argparse":
    if RANK == 1:
        argparse.ArgumentParser().parse_args(["--no-such-option"])
    keep_pushing(120)
elif scenario == "interrupt":
    if RANK == 1:
        time.sleep(0.5)
        raise KeyboardInterrupt
    keep_pushing(120)
elif scenario == "exit_256":
    keep_pushing(120, steps=3)
    print("rank %d finished %s" % (RANK, scenario), flush=True)
    sys.exit(256)
elif scenario == "pending_error":
    x = mx.nd.ones((3,) if RANK == 0 else (4,))
    kv.pushpull("mismatch", x)
elif scenario == "exit_caught":
    if RANK == 1:
        try:
            argparse.ArgumentParser().parse_args(["--no-such-option"])
        except SystemExit:
            pass
        quitter = threading.Thread(target=sys.exit, args=(4,))
        quitter.start()
        quitter.join()
    keep_pushing(120, steps=3)
elif scenario == "caught_exit1":
    x = mx.nd.ones((3,) if RANK == 0 else (4,))
    kv.pushpull("mismatch", x)
    try:
        x.asnumpy()
    except mxnet_mpi.MPIKVStoreError:
        print("rank %d caught the error" % RANK, flush=True)
    sys.exit(1)
print("rank %d finished %s" % (RANK, scenario), flush=True)

"""Calls that wait for every rank before the collectives' watchdog covers them.

MPI's start-up, the creation of a store and the split of a communicator block
until every rank makes the same call. A rank that never makes it (a script
that does not use the store there, ``MXNET_MPI_AUTOLOAD=0`` on one rank, an
evaluation store made on rank 0 only) kept the others there for good, silently:
the heartbeat watchdog covers collectives, and starts only after MPI. These
waits get the same limits: a stall warning after ``MXNET_MPI_STALL_WARN_S``,
the job's end after ``MXNET_MPI_STALL_ABORT_S``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Iterator

from . import settings
from ._native import LIB
from .report import rank_from_env


def _rank_label(rank: int | None) -> str:
    if rank is None:   # before MPI: what the launcher told the process
        rank = rank_from_env()
    return "" if rank is None else "[rank %d] " % rank


@contextlib.contextmanager
def waiting_for_peers(what: str, why: str, rank: int | None = None,
                      mpi_started: bool = True) -> Iterator[None]:
    """Around a call that returns once every rank made it: `what` waits for the
    other ranks, `why` says what usually keeps them. The warning and the abort
    come from a thread that sleeps until then."""
    warn, abort, _ = settings.stall_limits()
    done = threading.Event()

    def watch() -> None:
        if done.wait(warn):
            return
        label = _rank_label(rank)
        sys.stderr.write("%smxnet_mpi: stall warning: %s has waited %g s for the other ranks: "
                         "%s. Aborts after MXNET_MPI_STALL_ABORT_S=%g s\n"
                         % (label, what, warn, why, abort))
        sys.stderr.flush()
        if done.wait(max(abort - warn, 0.0)):
            return
        sys.stderr.write("%smxnet_mpi: %s has waited more than MXNET_MPI_STALL_ABORT_S=%g s; "
                         "aborting the job\n" % (label, what, abort))
        sys.stderr.flush()
        if mpi_started:
            LIB.mxmpi_abort(3)
        os._exit(3)   # before MPI there is no job to abort: this process ends

    thread = threading.Thread(target=watch, name="mxnet_mpi peer wait", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()

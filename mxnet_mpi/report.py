"""A rank's reports to ``python -m mxnet_mpi.launch``: how the launcher knows
which ranks finished cleanly, and on which host each one ran.

The launcher listens on a TCP port and exports ``MXNET_MPI_REPORT=addr:port``.
A rank started through the runner (``python -m mxnet_mpi``, which the
launcher inserts) connects at start and sends ``start RANK HOST PID``; when
its script has finished, ``done STATUS``; at the very end of Python's exit
handlers, ``end STATUS``. The connection
stays open for the life of the process, so the launcher also learns when a
rank dies without a word (killed, aborted, its host gone): its connection
closes without ``end``. A rank whose host becomes unreachable sends nothing
at all; the launcher names it once the others have ended.

Pure Python and no MXNet: it runs before MXNet is imported. Every failure to
report is silent (the job must not depend on the launcher's port), and a
forked child never reports (it closes its copy of the connection).
"""

from __future__ import annotations

import atexit
import os
import socket

from . import rank_children, settings

ENV = "MXNET_MPI_REPORT"
_state: dict = {"sock": None, "status": None}


def rank_from_env() -> int | None:
    """This process's rank as mpirun set it, before MPI is initialised."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def size_from_env() -> int | None:
    """The number of ranks in this process's job as mpirun set it (None: not
    started by an MPI launcher)."""
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"):   # as the hook's
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def _send(line: str) -> None:
    sock = _state["sock"]
    if sock is None:
        return
    try:
        sock.sendall(line.encode() + b"\n")
    except OSError:
        _drop()


def _drop() -> None:
    sock, _state["sock"] = _state["sock"], None
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass


def started() -> None:
    """Connect to the launcher (if ``MXNET_MPI_REPORT`` is set) and say that
    this rank started; registers the report of its end. Idempotent."""
    target = settings.get(ENV) or ""
    rank = rank_from_env()
    if _state["sock"] is not None or not target or rank is None:
        return
    if rank_children.started_by() is not None:
        return   # a process the rank started (it inherited the variables), not the rank
    host, _, port = target.rpartition(":")
    try:
        _state["sock"] = socket.create_connection((host, int(port)), timeout=3)
        _state["sock"].settimeout(10)
    except (OSError, ValueError):
        return
    _send("start %d %s %d" % (rank, socket.gethostname(), os.getpid()))
    # Registered before the script and MXNet register theirs: runs after them.
    atexit.register(_at_exit)
    os.register_at_fork(after_in_child=_drop)
    # Scripts that end with os._exit(0) (to skip a slow teardown) end cleanly
    # too; in a forked child the connection is gone and nothing is sent.
    quick_exit = os._exit

    def _exit(code: int) -> None:
        _send("end %d" % code)
        quick_exit(code)

    os._exit = _exit


def set_status(status: object) -> None:
    """The exit status the program is about to end with (as sys.exit takes it):
    tells the launcher that the script has finished (its exit comes next)."""
    _state["status"] = status
    _send("done %d" % exit_status(status))


def exit_status(status: object) -> int:
    """The process exit status Python gives for ``sys.exit(status)``: None is
    0, an int is taken modulo 256 (``sys.exit(256)`` exits 0; one beyond 64
    bits gives 255), anything else (a message) is 1."""
    if status is None:
        return 0
    if isinstance(status, int):
        # beyond a C long Python's conversion fails, giving -1: 255
        return status & 0xFF if -(1 << 63) <= status < (1 << 63) else 255
    return 1


def _at_exit() -> None:
    _send("end %d" % exit_status(_state["status"]))
    # The connection stays open until the process is gone: its close tells the
    # launcher that the process really exited (MPI finalised with the others).

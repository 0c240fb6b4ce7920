"""Processes that a rank starts, and the rank's launch environment they inherit.

mpirun gives each rank its identity in the environment (``PMIX_NAMESPACE``,
``PMIX_RANK``, the PMIx server's address, ``OMPI_COMM_WORLD_*``). A process
the rank starts itself (``subprocess``, multiprocessing's spawn workers, which
re-import the main module) inherits it: if that process started MPI, Open MPI
would take it for the rank, and two processes claiming one rank crash the job
(a segmentation fault, status 255, nothing naming the cause).

So a rank that starts MPI marks its environment with its identity and pid
(``MXNET_MPI_RANK_PROCESS``); a process that finds the mark of another process
of its own job and rank is one the rank started. It is refused MPI (world.py):
it cannot be a rank of the job, and training there as a world of one would
quietly leave the job. Started with ``env=detached()`` (no launch variables),
it is a world of one, as any process outside mpirun. A process that mpirun
started (whatever its parent) has no mark of its own job, or its own pid in
it after an exec.

The standard library only (besides the two modules that choose Open MPI's
environment).
"""

from __future__ import annotations

import os
from typing import Mapping, MutableMapping

from . import shm_segments, transport

MARK = "MXNET_MPI_RANK_PROCESS"
# What mpirun puts into a rank's environment to say which process of which
# job it is; the user's own Open MPI settings (OMPI_MCA_*) stay.
LAUNCH_PREFIXES = ("PMIX_", "PRTE_", "OMPI_COMM_WORLD_", "OMPI_WORLD_", "OMPI_APP_CTX_")
LAUNCH_NAMES = ("OMPI_UNIVERSE_SIZE", "OMPI_FILE_LOCATION", "OMPI_NUM_APP_CTX",
                "OMPI_FIRST_RANKS", "OMPI_ARGV", "OMPI_COMMAND", "OMPI_MCA_num_procs",
                "OMPI_MCA_initial_wdir")


def identity(env: Mapping) -> str | None:
    """``<job>:<rank>`` of a process mpirun started with `env`, else None."""
    job, rank = env.get("PMIX_NAMESPACE"), env.get("PMIX_RANK")
    return "%s:%s" % (job, rank) if job and rank is not None else None


def mark(env: MutableMapping | None = None, pid: int | None = None) -> None:
    """Record in `env` (this process's environment) that process `pid` (this
    one) is the rank mpirun started, for the processes it starts later."""
    env = os.environ if env is None else env
    me = identity(env)
    if me is not None:
        env[MARK] = "%s:%d" % (me, os.getpid() if pid is None else pid)


def started_by(env: MutableMapping | None = None, pid: int | None = None) -> int | None:
    """The pid of the rank that started this process (`pid`) and whose launch
    environment it inherited; None for a process that mpirun started, or one
    started outside any job."""
    env = os.environ if env is None else env
    me = identity(env)
    found = env.get(MARK, "")
    owner, _, owner_pid = found.rpartition(":")
    if me is None or owner != me or not owner_pid.isdigit():
        return None
    pid = os.getpid() if pid is None else pid
    return int(owner_pid) if int(owner_pid) != pid else None


def detach(env: MutableMapping | None = None) -> list:
    """Remove the inherited launch variables from `env` (and the rank's job's
    shared-memory directory: a world of one keeps its segment in one of its
    own); returns their names."""
    env = os.environ if env is None else env
    job_dir = shm_segments.job_dir(env)
    names = [n for n in list(env)
             if n.startswith(LAUNCH_PREFIXES) or n in LAUNCH_NAMES or n == MARK]
    if job_dir is not None and env.get(transport.SM_DIR_VAR) == job_dir:
        names.append(transport.SM_DIR_VAR)
    for name in names:
        env.pop(name, None)
    return names


def detached(env: Mapping | None = None) -> dict:
    """A copy of `env` (default: this process's environment) without the
    launch variables: for ``subprocess.run(..., env=detached())``, a process
    that runs as a world of one rank of its own."""
    out = dict(os.environ if env is None else env)
    detach(out)
    return out


# Beside the mark, which only a rank that has started MPI leaves, each process
# that starts MPI claims its rank in the rank's session directory (Open MPI
# makes it per rank and removes it when the job ends): a process that the rank
# started before its own first store, and that started MPI first, is found
# there when the rank starts MPI, instead of crashing the job.
SESSION_VAR = "OMPI_FILE_LOCATION"
CLAIM = "mxnet_mpi.rank"


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not yet waited for, does not)."""
    fields = shm_segments.proc_stat(pid)
    return bool(fields) and fields[0] != "Z"


def claim(env: Mapping | None = None) -> int | None:
    """Claim this job's rank for this process as it starts MPI. Returns the
    pid of another live process that claimed it first, else None (claimed,
    or nothing to claim: not started by mpirun, no session directory)."""
    env = os.environ if env is None else env
    where = env.get(SESSION_VAR, "")
    if identity(env) is None or not where or not os.path.isdir(where):
        return None
    path, me = os.path.join(where, CLAIM), os.getpid()
    mine = "%s.%d" % (path, me)
    try:
        with open(mine, "w") as f:
            f.write(str(me))
        for _ in range(3):
            try:
                os.link(mine, path)   # atomic: fails where a claim exists
                return None
            except FileExistsError:
                try:
                    with open(path) as f:
                        holder = int(f.read().strip() or 0)
                except (OSError, ValueError):
                    holder = 0
                if holder == me:
                    return None
                if holder and _alive(holder):
                    return holder
                try:
                    os.unlink(path)   # a claim of a process that has ended
                except FileNotFoundError:
                    pass
        return None
    except OSError:
        return None
    finally:
        try:
            os.unlink(mine)
        except OSError:
            pass


def parent_of(pid: int) -> int | None:
    """`pid`'s parent process, from /proc (None if it has gone)."""
    fields = shm_segments.proc_stat(pid)
    return int(fields[1]) if fields is not None and len(fields) > 1 else None

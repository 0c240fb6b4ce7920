"""Where a process's Open MPI shared-memory segment lives.

Open MPI 5 keeps each process's segment in ``/dev/shm`` as
``sm_segment.<host>.<uid>.<job>.<local rank>``, where ``<job>`` is a 16-bit
hash of the job's name. Two jobs on one machine whose hashes meet (1 in 65,536
pairs) open the same files and take each other's messages: a crash in the
shared-memory transport, or wrong numbers. A process started by Open MPI's
mpirun therefore gets a directory of its job's own in ``/dev/shm`` (memory,
like Open MPI's default): ``/dev/shm/mxnet_mpi-<uid>/<daemon>.<job name>``,
where ``<daemon>`` is the session directory of this host's mpirun or daemon
(``ompi.<pid>`` or ``prted.<pid>``). Open MPI removes the segments when the
job ends; a directory whose daemon no longer runs is removed by the next
process that prepares one. Without a writable ``/dev/shm``, the process's
mpirun session directory (removed with the job) is used.

The standard library only: transport imports it before anything else runs.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Mapping

SHM = "/dev/shm"
# set for every process mpirun (PRRTE) starts
SERVER_DIR_VAR = "PMIX_SERVER_TMPDIR"   # /tmp/ompi.<mpirun pid> or /tmp/prted.<daemon pid>
JOB_VAR = "PMIX_NAMESPACE"              # prterun-<host>-<mpirun pid>@<job>
SESSION_DIR_VAR = "OMPI_FILE_LOCATION"  # this process's session directory
SERVER = re.compile(r"(?:ompi|prted)\.(\d+)$")
JOB_DIR = re.compile(r"(?:ompi|prted)\.(\d+)\.")  # a per-job directory's name: <daemon>.<job>
SERVERS = ("prterun", "prted", "prte", "mpirun")


def root(shm: str = SHM) -> str:
    """This user's directory of per-job directories."""
    return os.path.join(shm, "mxnet_mpi-%d" % os.getuid())


def job_dir(env: Mapping, shm: str = SHM) -> str | None:
    """The segment directory for a process started by mpirun with `env`:
    its job's own in `shm` where `shm` is a writable directory, else its
    session directory; None when mpirun did not start it."""
    server = os.path.basename(env.get(SERVER_DIR_VAR, "").rstrip("/"))
    job = env.get(JOB_VAR, "")
    if SERVER.match(server) and job and os.path.isdir(shm) and os.access(shm, os.W_OK):
        return os.path.join(root(shm), "%s.%s" % (server, re.sub(r"[^\w@.+-]", "_", job)))
    session = env.get(SESSION_DIR_VAR, "")
    return session if session and os.path.isdir(session) else None


def server_runs(pid: int) -> bool:
    """Whether process `pid` runs and is an mpirun or a daemon of one."""
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip() in SERVERS
    except OSError:
        return False


def remove_stale(shm: str = SHM) -> list:
    """Remove the per-job directories whose daemon no longer runs (a job ended,
    or was killed); returns them."""
    removed = []
    try:
        names = os.listdir(root(shm))
    except OSError:
        return removed
    for name in names:
        m = JOB_DIR.match(name)
        if m is None or server_runs(int(m.group(1))):
            continue
        path = os.path.join(root(shm), name)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def prepare(path: str, shm: str = SHM) -> bool:
    """Create `path` (a job_dir in `shm`, or a session directory), first
    removing stale per-job directories; whether it is ready."""
    if os.path.dirname(path) == root(shm):
        remove_stale(shm)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return False
    return os.path.isdir(path) and os.access(path, os.W_OK)

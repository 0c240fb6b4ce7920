"""Where a process's Open MPI shared-memory segment lives.

Open MPI 5 keeps each process's segment in ``/dev/shm`` as
``sm_segment.<host>.<uid>.<job>.<local rank>``, where ``<job>`` is a 16-bit
hash of the job's name. Two jobs on one machine whose hashes meet (1 in 65,536
pairs) open the same files and take each other's messages: a crash in the
shared-memory transport, or wrong numbers. A process started by Open MPI's
mpirun therefore gets a directory of its job's own in ``/dev/shm`` (memory,
like Open MPI's default): ``/dev/shm/mxnet_mpi-<uid>-<pid ns>/<daemon>.<job
name>``, where ``<daemon>`` is the session directory of this host's mpirun or
daemon (``ompi.<pid>`` or ``prted.<pid>``). Open MPI removes the segments
when the job ends; a directory whose daemon no longer runs is removed by the
next process that prepares one. A pid names a process only in its pid
namespace, so each namespace (``<pid ns>``, the inode of /proc/self/ns/pid)
has a directory of its own and cleans only that one: containers that share
/dev/shm (``docker run --ipc=host``) never remove each other's running jobs'
segments. Without a writable ``/dev/shm``, the process's mpirun session
directory (removed with the job) is used.

A process that starts MPI without mpirun (a singleton, a world of one) has no
daemon that removes its segment when it ends: Open MPI leaves a file in
``/dev/shm`` at every such run. It gets ``single.<pid>.<start time>`` in the
same root, removed when the process exits, or by the next process that
prepares a directory once that process no longer runs (the start time tells a
reused pid). Open MPI also leaves the singleton's job session directory
(``<tmp>/ompi.<host>.<uid>/jf.0/<job>``), empty, after MPI_Finalize; the
process removes it then (session_job_dir names it).

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
SINGLE_DIR = re.compile(r"single\.(\d+)\.(\d+)$")  # a singleton's: single.<pid>.<start time>
# a segment file's name: sm_segment.<host>.<uid>.<job, hex>.<local rank>
SEGMENT = re.compile(r"sm_segment\.(.+)\.(\d+)\.([0-9a-f]+)\.(\d+)$")
# an mpirun or daemon, as /proc/<pid>/comm names it (Open MPI's mpirun, mpiexec
# and oshrun exec prterun; a launcher that is a link to it keeps the link's name)
SERVERS = ("prterun", "prted", "prte", "mpirun", "mpiexec", "oshrun")


def pid_namespace() -> str:
    """This process's pid namespace (the inode of /proc/self/ns/pid), or ""
    where it cannot be read."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def root(shm: str = SHM) -> str:
    """This user's directory of per-job directories, in this pid namespace."""
    ns = pid_namespace()
    return os.path.join(shm, "mxnet_mpi-%d%s" % (os.getuid(), "-" + ns if ns else ""))


def _writable(shm: str) -> bool:
    return os.path.isdir(shm) and os.access(shm, os.W_OK)


def job_dir(env: Mapping, shm: str = SHM) -> str | None:
    """The segment directory for a process started by mpirun with `env`:
    its job's own in `shm` where `shm` is a writable directory, else its
    session directory; None when mpirun did not start it."""
    server = os.path.basename(env.get(SERVER_DIR_VAR, "").rstrip("/"))
    job = env.get(JOB_VAR, "")
    if SERVER.match(server) and job and _writable(shm):
        return os.path.join(root(shm), "%s.%s" % (server, re.sub(r"[^\w@.+-]", "_", job)))
    session = env.get(SESSION_DIR_VAR, "")
    return session if session and os.path.isdir(session) else None


def single_dir(shm: str = SHM) -> str | None:
    """The segment directory of this process as a singleton, in `shm` where it
    is a writable directory, else None."""
    start = start_time(os.getpid())
    if start is None or not _writable(shm):
        return None
    return os.path.join(root(shm), "single.%d.%s" % (os.getpid(), start))


def session_job_dir(segment: str, env: Mapping | None = None) -> str | None:
    """The session directory of the job whose shared-memory segment file is
    named `segment`: ``<tmp>/ompi.<host>.<uid>/jf.0/<job>`` (the job in
    decimal, <tmp> as Open MPI picks it), or None for another name."""
    m = SEGMENT.match(os.path.basename(segment))
    if m is None:
        return None
    env = os.environ if env is None else env
    tmp = next((env[v] for v in ("TMPDIR", "TEMP", "TMP") if env.get(v)), "/tmp")
    return os.path.join(tmp, "ompi.%s.%s" % (m.group(1), m.group(2)), "jf.0",
                        str(int(m.group(3), 16)))


def singleton_session_dir(path: str | None) -> str | None:
    """The session directory of the singleton whose segment directory is `path`
    (from the segment file in it), or None."""
    try:
        names = os.listdir(path) if path else []
    except OSError:
        names = []
    return next((d for d in map(session_job_dir, names) if d), None)


def proc_stat(pid: int) -> list | None:
    """The fields of /proc/<pid>/stat after the command's name (state first,
    then the parent's pid, ...), or None if the process does not run."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks after boot), or None if it does not run."""
    fields = proc_stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def server_runs(pid: int) -> bool:
    """Whether process `pid` runs and is an mpirun or a daemon of one."""
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip() in SERVERS
    except OSError:
        return False


def remove_stale(shm: str = SHM) -> list:
    """Remove the per-job directories whose daemon no longer runs (a job ended,
    or was killed) and the singletons' whose process no longer runs; returns
    them."""
    removed = []
    top = root(shm)
    try:
        names = os.listdir(top)
    except OSError:
        return removed
    for name in names:
        job, single = JOB_DIR.match(name), SINGLE_DIR.match(name)
        if job is not None:
            alive = server_runs(int(job.group(1)))
        elif single is not None:
            alive = start_time(int(single.group(1))) == single.group(2)
        else:
            continue   # not ours
        if alive:
            continue
        path = os.path.join(top, name)
        remove(path)
        removed.append(path)
    return removed


def remove(path: str | None) -> None:
    """Remove a segment directory (a singleton's, at its exit)."""
    if path:
        shutil.rmtree(path, ignore_errors=True)


def prepare(path: str, shm: str = SHM) -> bool:
    """Create `path` (a job_dir or single_dir in `shm`, or a session directory),
    first removing stale ones; whether it is ready."""
    if os.path.dirname(path) == root(shm):
        remove_stale(shm)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return False
    return os.path.isdir(path) and os.access(path, os.W_OK)

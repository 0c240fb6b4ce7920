"""Two jobs on one machine never share shared-memory segments.

Open MPI names a process's shared-memory segment (by default in /dev/shm)
after a 16-bit hash of its job. Two jobs whose hashes meet open the same
files and take each other's messages: a crash in Open MPI's shared-memory
transport (the suite's CI met one, with jobs running side by side) or wrong
numbers. Here job B is given, in /dev/shm, the names its segments would get,
pointing at job A's segments: what a meeting of the hashes does. With
mxnet_mpi's default each job keeps its segments in a directory of its own
(mxnet_mpi/shm_segments.py), so both jobs stay exact."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mpirun import GATE, MPIRUN, ROOT, SCRIPTS, mpi_env, shm_segments


def segment_name(path: str) -> tuple:
    """(host, uid, job in hex, local rank) of a segment file's path."""
    return shm_segments.SEGMENT.match(os.path.basename(path)).groups()


def _hash(text: str) -> int:
    """Open MPI's OPAL_HASH_STR (one-at-a-time) of `text`."""
    h = 0
    for byte in text.encode():
        h = (h + byte) & 0xFFFFFFFF
        h = (h + (h << 10)) & 0xFFFFFFFF
        h ^= h >> 6
    h = (h + (h << 3)) & 0xFFFFFFFF
    h ^= h >> 11
    return (h + (h << 15)) & 0xFFFFFFFF


def job_id(namespace: str) -> int:
    """Open MPI 5's id of a job from its namespace (prterun-HOST-PID@N): the
    16-bit fold of the hash of what precedes '@', then N."""
    name, _, local = namespace.rpartition("@")
    h = _hash(name)
    return (((h >> 16) ^ (h & 0xFFFF)) << 16) | int(local)


def start(stop_file: Path, gate: bool) -> subprocess.Popen:
    """mpirun -np 2 shm_neighbours.py; with `gate`, mpirun (the same process)
    starts only when a line arrives on its stdin, so its pid is known first."""
    cmd = [MPIRUN, "-np", "2", "--oversubscribe", sys.executable,
           str(SCRIPTS / "shm_neighbours.py"), str(stop_file)]
    if gate:
        cmd = [*GATE, *cmd]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=mpi_env(),
                            cwd=str(ROOT), start_new_session=True)


def segments(proc: subprocess.Popen) -> tuple:
    """The segments rank 0 printed (its own and its peer's, in local-rank
    order) and its job's name."""
    for line in proc.stdout:
        if line.startswith("rank 0 segments "):
            words = line.split()
            paths = sorted(words[3:-2], key=lambda p: int(segment_name(p)[3]))
            return paths, words[-1]
    raise AssertionError("job ended before its first allreduce:\n" + proc.stderr.read()[-4000:])


def test_two_jobs_whose_segment_names_meet_stay_apart_and_exact(tmp_path):
    stop = tmp_path / "stop"
    a = start(stop, gate=False)
    b = start(stop, gate=True)
    links = []
    try:
        seg_a, job_a = segments(a)
        node, uid, jid, _ = segment_name(seg_a[0])
        # the names really are Open MPI's: job A's from its name, which holds its mpirun's pid
        assert job_a.endswith("-%d@1" % a.pid) and int(jid, 16) == job_id(job_a), (seg_a, job_a)
        assert os.path.dirname(seg_a[0]) != "/dev/shm", seg_a   # the default moved them
        # job B's names in /dev/shm, Open MPI's default place, lead to job A's segments
        jid_b = job_id(job_a.replace("-%d@" % a.pid, "-%d@" % b.pid))
        for local_rank, target in enumerate(seg_a):
            link = Path("/dev/shm/sm_segment.%s.%s.%x.%d" % (node, uid, jid_b, local_rank))
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(target)
            links.append(link)
        b.stdin.write("go\n")
        b.stdin.flush()
        seg_b, _ = segments(b)   # what /proc/self/maps shows: the files, links followed
        assert not set(seg_b) & set(seg_a), "job B mapped job A's segments %s" % seg_a
        assert int(segment_name(seg_b[0])[2], 16) == jid_b, seg_b   # as predicted
        # job B's start cleaned up stale job directories, not job A's
        assert all(os.path.exists(path) for path in seg_a), seg_a
        time.sleep(1.0)   # both jobs exchange messages side by side
        stop.touch()
        outs = [p.communicate(timeout=90) for p in (a, b)]
    finally:
        for link in links:
            link.unlink(missing_ok=True)
        for p in (a, b):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for p, (out, err) in zip((a, b), outs):
        assert p.returncode == 0, err[-4000:]
        steps = [int(n) for n in re.findall(r"rank \d exact (\d+)", out)]
        assert len(steps) == 2 and min(steps) >= 5, out


def singleton(*args: str) -> tuple:
    """Start tests/scripts/singleton_segments.py; (process, its DIR/FILES/CHILD lines)."""
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "singleton_segments.py"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=mpi_env(), cwd=str(ROOT), start_new_session=True)
    got = {}
    for line in proc.stdout:
        key, _, value = line.rstrip("\n").partition(" ")
        got[key] = value
        if key == "CHILD":
            break
    return proc, got


def test_a_world_of_one_keeps_its_segment_in_a_directory_it_removes():
    """Without mpirun, Open MPI leaves each process's segment file in /dev/shm
    when it ends (no daemon removes it). A world of one keeps it in a directory
    of its own, removed at exit, or by the next process if it was killed; the
    processes it starts do not inherit the setting (they may be mpirun jobs).
    The job session directory Open MPI leaves empty after MPI_Finalize
    (<tmp>/ompi.<host>.<uid>/jf.0/<job>) is removed at exit too."""
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm here")
    killed, first = singleton("wait")
    try:
        assert first.get("CHILD") == "None", (first, killed.stderr.read())
        left = Path(first["DIR"])
        assert left.parent.parent == Path("/dev/shm") and left.name.startswith("single.")
        segment = first["FILES"]
        assert (left / segment).exists()
        assert not (left.parent.parent / segment).exists()
        # the session directory is where the rule says, while the job runs
        session = shm_segments.session_job_dir(segment)
        assert session and Path(session).is_dir(), (segment, session)
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
        # what the killed process could not remove (this test killed it)
        session = shm_segments.session_job_dir(first.get("FILES", ""))
        if session:
            shutil.rmtree(session, ignore_errors=True)
    # killed, it could not remove its directory; the next process that
    # prepares one does (here the next singleton, or one of the other
    # worker's processes meanwhile)
    proc, second = singleton()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and second.get("CHILD") == "None", err[-3000:]
    assert not left.exists()
    mine = Path(second["DIR"])
    assert mine != left and mine.parent == left.parent and not mine.exists()   # removed at exit
    assert not (mine.parent.parent / second["FILES"]).exists()
    assert not Path(shm_segments.session_job_dir(second["FILES"])).exists()

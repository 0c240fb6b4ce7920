"""What killed jobs leave in /tmp, and why the suite removes it.

mpirun (PRRTE) keeps its session directory in /tmp/ompi.<its pid> and removes
it at the end of the job; a job killed with SIGKILL (tests do that on
purpose) leaves it behind, with PMIx's rendezvous files. A later mpirun that
gets the same pid then fails to start. tests/conftest.py removes such
directories before and after a run (mpirun.remove_stale_session_dirs)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from mpirun import GATE, MPIRUN, ROOT, mpi_env, remove_stale_session_dirs


def gated_mpirun() -> subprocess.Popen:
    """`mpirun -np 1 true`, started (as the same process) when a line arrives
    on its stdin: its pid, and so its session directory, is known first."""
    return subprocess.Popen([*GATE, MPIRUN, "-np", "1", "true"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=mpi_env(), cwd=str(ROOT),
                            start_new_session=True)


def left_by_a_killed_job() -> Path:
    """Kill a running mpirun with SIGKILL; return the directory it leaves."""
    job = subprocess.Popen([MPIRUN, "-np", "1", "sleep", "30"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=mpi_env(), cwd=str(ROOT),
                           start_new_session=True)
    left = Path("/tmp/ompi.%d" % job.pid)
    end = time.time() + 30
    while not list(left.glob("pmix.*.tool.%d" % job.pid)) and time.time() < end:
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    assert left.is_dir(), "mpirun %d made no %s" % (job.pid, left)
    return left


def test_a_killed_jobs_directory_breaks_a_later_mpirun_with_its_pid_unless_removed():
    left = left_by_a_killed_job()
    jobs = [gated_mpirun(), gated_mpirun()]
    copies = []
    try:
        for job in jobs:   # as if each got the killed mpirun's pid
            copy = Path("/tmp/ompi.%d" % job.pid)
            shutil.copytree(left, copy)
            for f in copy.iterdir():
                if str(left.name[5:]) in f.name:
                    f.rename(copy / f.name.replace(left.name[5:], str(job.pid)))
            copies.append(copy)
        broken, fixed = jobs
        out, _ = broken.communicate("go\n", timeout=60)
        assert broken.returncode != 0 and "listener thread failed to start" in out, out
        removed = remove_stale_session_dirs()
        assert str(left) in removed and str(copies[1]) in removed, removed
        out, _ = fixed.communicate("go\n", timeout=60)
        assert fixed.returncode == 0, out
    finally:
        for job in jobs:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        for path in [left, *copies]:
            shutil.rmtree(path, ignore_errors=True)


def test_a_running_jobs_directory_is_kept():
    job = subprocess.Popen([MPIRUN, "-np", "1", "sleep", "30"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=mpi_env(), cwd=str(ROOT),
                           start_new_session=True)
    mine = Path("/tmp/ompi.%d" % job.pid)
    try:
        end = time.time() + 30
        while not mine.is_dir() and time.time() < end:
            time.sleep(0.05)
        assert mine.is_dir()
        assert str(mine) not in remove_stale_session_dirs() and mine.is_dir()
    finally:
        os.killpg(job.pid, signal.SIGTERM)   # mpirun ends the job and removes it
        job.wait(timeout=30)
    assert not mine.exists()


def test_the_launcher_removes_what_its_killed_mpirun_left_and_nothing_newer(tmp_path):
    from mxnet_mpi.launch import remove_session_dir

    left = left_by_a_killed_job()
    killed_at = time.time()
    try:
        # made after the kill: another process's with the same pid, kept
        assert not remove_session_dir(int(left.name[5:]), {}, killed_at - 60) and left.is_dir()
        assert remove_session_dir(int(left.name[5:]), {"TMPDIR": "/tmp"}, killed_at)
        assert not left.exists()
    finally:
        shutil.rmtree(left, ignore_errors=True)
    # mpirun's TMPDIR is where it looks; a file of that name is not a session directory
    (tmp_path / "ompi.7").mkdir()
    (tmp_path / "ompi.8").write_text("")
    assert not remove_session_dir(7, {}, time.time())
    assert remove_session_dir(7, {"TMPDIR": str(tmp_path)}, time.time())
    assert not remove_session_dir(8, {"TMPDIR": str(tmp_path)}, time.time())
    assert (tmp_path / "ompi.8").is_file()

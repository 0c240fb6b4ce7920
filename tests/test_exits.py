"""How ranks leave a job (fault injection by the test: signals by PID, exits):
a stopped rank is named by the live ones within the warning setting and the
job aborts at the abort setting; an exit on one rank (sys.exit, SystemExit,
argparse) ends the job within seconds naming it; a forked child exits
cleanly, DataLoader fork workers too, and an exit that cannot finish is
named and aborted; errors pending at exit never turn into an abort of a
clean end."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from launching import alive
from mpirun import MPIRUN, ROOT, SCRIPTS, mpi_env, run_mpi

FAST = {"MXNET_MPI_STALL_WARN_S": "2", "MXNET_MPI_STALL_ABORT_S": "8",
        "MXNET_MPI_HEALTH_INTERVAL_S": "0.2"}
READY = re.compile(r"rank (\d) pid (\d+) ready")


@pytest.mark.parametrize("mode", ["chained", "concurrent"])   # blocking and non-blocking MPI
def test_stopped_rank_is_named_then_the_job_aborts(mode):
    cmd = [MPIRUN, "-np", "2", "--oversubscribe", sys.executable, str(SCRIPTS / "exits.py"),
           "stopped", mode]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=mpi_env(FAST), cwd=str(ROOT), start_new_session=True)
    pids = {}
    try:
        for line in proc.stdout:
            m = READY.search(line)
            if m:
                pids[int(m.group(1))] = int(m.group(2))
            if len(pids) == 2:
                break
        os.kill(pids[1], signal.SIGSTOP)
        t0 = time.time()
        out, err = proc.communicate(timeout=90)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in pids.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode != 0
    warnings = [ln for ln in err.splitlines() if "stall warning" in ln and "[rank 0]" in ln]
    assert warnings, err[-3000:]
    assert any("Missing ranks: 1 (not answering" in w for w in warnings), warnings
    aborts = [ln for ln in err.splitlines() if "MXNET_MPI_STALL_ABORT_S=8" in ln
              and "aborting the MPI job" in ln]
    assert aborts and "1 (not answering" in aborts[0], err[-3000:]
    assert took < 8 + 20, took
    time.sleep(1)
    assert not alive(pids[1]) and not alive(pids[0])


@pytest.mark.parametrize("scenario,status", [("sys_exit", 1), ("raise_exit", 3),
                                             ("argparse", 2), ("interrupt", 130)])
def test_exit_on_one_rank_ends_the_job_fast(scenario, status):
    t0 = time.time()
    proc = run_mpi("exits.py", 2, scenario, "concurrent", env=FAST, check=False, timeout=90)
    took = time.time() - t0
    if scenario == "raise_exit":
        # `raise SystemExit(3)` bypasses sys.exit: Python's exit handlers cannot
        # see the status, so the rank reads as having finished its program
        assert proc.returncode != 0
        named = ("rank 1 is exiting with status %d" % status in proc.stderr
                 or "rank 1 finished its program" in proc.stderr)
    elif scenario == "interrupt":   # Python's status for it: 128 + SIGINT
        assert proc.returncode == status, proc.returncode
        named = "rank 1 raised KeyboardInterrupt" in proc.stderr
    else:   # sys.exit, argparse
        assert proc.returncode == status, proc.returncode
        named = "rank 1 is exiting with status %d" % status in proc.stderr
    assert named, proc.stderr[-3000:]
    assert took < 30, took  # long before the 8 s stall abort would matter, or 600 s
    assert "rank 0 finished" not in proc.stdout


def test_exit_caught_or_in_a_thread_is_not_the_process_status():
    """A SystemExit that the program catches (a harness trying argparse options)
    or that ends only a thread is not how the rank exits: the job ends cleanly
    (it was aborted with status 2 at the end of a correct program)."""
    proc = run_mpi("exits.py", 2, "exit_caught", "funneled", env=FAST, timeout=90)
    assert "exiting with status" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.count("finished exit_caught") == 2, proc.stdout


def test_exit_status_is_taken_modulo_256_as_python_does():
    """sys.exit(256) exits 0 in Python: no abort of a clean end (it was status 1)."""
    proc = run_mpi("exits.py", 2, "exit_256", "funneled", env=FAST, timeout=90)
    assert "exiting with status" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.count("finished exit_256") == 2, proc.stdout


def test_error_nobody_waited_for_does_not_abort_a_clean_end():
    proc = run_mpi("exits.py", 2, "pending_error", "chained", env=FAST, timeout=90)
    assert "nobody waited for it" in proc.stderr and "ranks disagree" in proc.stderr
    for bad in ("terminate called", "Exception ignored", "Aborted"):
        assert bad not in proc.stderr, proc.stderr[-3000:]


def test_caught_error_then_exit_1_ends_cleanly_with_status():
    proc = run_mpi("exits.py", 2, "caught_exit1", "chained", env=FAST, check=False, timeout=90)
    assert proc.returncode != 0
    assert proc.stdout.count("caught the error") == 2
    assert "is exiting with status 1" in proc.stderr
    for bad in ("terminate called", "Exception ignored"):
        assert bad not in proc.stderr, proc.stderr[-3000:]


LOADER_CYCLES = 12   # per rank: 12 DataLoaders x 2 fork workers made, used and dropped


def _procs_with_env(token: str) -> list:
    """PIDs of live processes whose environment holds EXIT_FORKS_TOKEN=token."""
    needle = ("EXIT_FORKS_TOKEN=%s\0" % token).encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                if needle in f.read() + b"\0" and alive(int(entry)):
                    found.append(int(entry))
        except (OSError, ValueError):
            pass
    return found


def test_exit_with_fork_dataloader_workers_ends_cleanly():
    """The exit path under fork-based DataLoader workers (kvstore='mpi',
    MXNET_MKLDNN_ENABLED=0, 2 ranks): LOADER_CYCLES loaders per rank fork their
    workers while collectives run, the last is alive at exit, and each rank also
    leaves a child running that holds its output (mpirun waits for such a
    process, silently): the child is named and ended, the job exits 0 with the
    same weights on both ranks, and no process is left."""
    token = str(os.getpid())
    proc = run_mpi("exit_forks.py", 2, "loaders", str(LOADER_CYCLES), timeout=150,
                   # a loaded machine can take seconds to end 40 worker processes:
                   # stall settings that only a real hang reaches
                   env={"MXNET_MPI_STALL_WARN_S": "30", "MXNET_MPI_STALL_ABORT_S": "60",
                        "MXNET_MKLDNN_ENABLED": "0", "EXIT_FORKS_TOKEN": token})
    # a forked child computes, is refused the store, exits 0 (no finalize, no hang)
    assert proc.stdout.count("child exited with status 0") == 2, proc.stdout[-2000:]
    assert proc.stdout.count("store refused:") == 2 and "forked" in proc.stdout
    # a process the rank started with its launch environment is refused MPI
    # (it is no rank of the job); with that environment removed, a world of one
    assert proc.stdout.count("subprocess inherited refused True status 0") == 2, \
        proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("subprocess detached world 0 1 [1.0, 1.0, 1.0] status 0") == 2, \
        proc.stdout[-2000:] + proc.stderr[-3000:]
    weights = dict(re.findall(r"WEIGHTS (\d) (\S+)", proc.stdout))
    assert len(weights) == 2 and weights["0"] == weights["1"], proc.stdout[-2000:]
    leftovers = re.findall(r"child process\(es\) (.*) of this rank still run at its exit "
                           r"and hold its output", proc.stderr)
    # only the child each rank left on purpose: the DataLoader workers were
    # gone, and Python's resource tracker was left to end by itself
    assert len(leftovers) == 2 and all("," not in c for c in leftovers), proc.stderr[-3000:]
    for bad in ("stall warning", "terminate called", "Traceback"):
        assert bad not in proc.stderr, proc.stderr[-3000:]
    time.sleep(0.5)
    assert _procs_with_env(token) == []
    # the tracker removed the shared-memory blocks the ranks left
    assert [n for n in os.listdir("/dev/shm") if n.startswith("exit_forks_%s" % token)] == []


def test_exit_that_cannot_finish_is_named_and_ended():
    """Rank 1's program ends but its process cannot exit (an exit handler
    waits for ever): both ranks name it at the warning setting, and the job
    is aborted at the abort setting instead of waiting silently."""
    t0 = time.time()
    proc = run_mpi("exit_forks.py", 2, "stuck", env=FAST, check=False, timeout=90)
    took = time.time() - t0
    assert proc.returncode != 0
    err = proc.stderr
    assert "[rank 1] mxnet_mpi: stall warning: this rank's program ended" in err, err[-3000:]
    assert re.search(r"\[rank 0\] mxnet_mpi: stall warning: .*Ranks not there yet: 1 \(its "
                     r"program ended, but its process does not exit", err), err[-3000:]
    assert "more than MXNET_MPI_STALL_ABORT_S=8" in err
    assert took < 8 + 25, took


def test_sys_exit_in_a_thread_ends_only_the_thread_quietly(tmp_path):
    """As plain Python: sys.exit in a thread ends that thread, silently. Our
    sys.exit raised a subclass of SystemExit, which threading printed as an
    uncaught exception on every rank."""
    script = tmp_path / "thread_exit.py"
    script.write_text("import sys, threading, mxnet as mx, mxnet_mpi\n"
                      "mx.kv.create('mpi')\n"
                      "t = threading.Thread(target=lambda: sys.exit(5)); t.start(); t.join()\n"
                      "print('MAIN GOES ON', flush=True)\n")
    proc = run_mpi(str(script), 2, timeout=120)
    assert proc.stdout.count("MAIN GOES ON") == 2, proc.stdout
    assert "Exception in thread" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("status", ["None", "0", "3", "-1", "256", "257", "True", "'msg'",
                                    "2**40+5", "2**63-1", "-2**63", "2**63", "2**64+3"])
def test_exit_status_as_python_gives_it(status):
    """The status a rank reports and aborts with is the one Python exits with
    (2**64+3 gave 3 where Python gives 255)."""
    from mxnet_mpi import report
    python = subprocess.run([sys.executable, "-S", "-c", "import sys; sys.exit(%s)" % status],
                            capture_output=True, timeout=30).returncode
    assert report.exit_status(eval(status)) == python


def test_a_rank_whose_child_started_mpi_first_is_refused_naming_it():
    """A rank starts a process that uses a store before its own first store:
    both claimed one rank, and the job crashed (a segmentation fault, status
    255). The rank is refused, naming its child (rank_children.claim)."""
    proc = run_mpi("child_first.py", 2, timeout=120)
    lines = proc.stdout.splitlines()
    assert sorted(ln for ln in lines if ln.startswith("CHILD")) == \
        ["CHILD 0 [2.0, 2.0]", "CHILD 1 [2.0, 2.0]"], proc.stdout
    refused = [ln.split() for ln in lines if ln.startswith("RANK")]
    assert len(refused) == 2 and all(r[1] == "refused" for r in refused), proc.stdout
    for r in refused:
        assert "already runs MPI in process %s, a process this one started" % r[2] \
            in " ".join(r), proc.stdout
    assert "Segmentation fault" not in proc.stderr, proc.stderr[-3000:]

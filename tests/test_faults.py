"""Reliability: mismatches, stalls and dead ranks end the job fast, non-zero,
with a message naming the key, the ranks and their shapes/dtypes."""

import os
import re
import time
from pathlib import Path

import pytest
from mpirun import run_mpi

MODES = ["chained", "funneled", "concurrent"]
FAST = {"MXNET_MPI_STALL_WARN_S": "1", "MXNET_MPI_STALL_ABORT_S": "4",
        "MXNET_MPI_HEALTH_INTERVAL_S": "0.2"}


def fail(scenario, mode, nranks=2, timeout=60):
    t0 = time.time()
    proc = run_mpi("faults.py", nranks, scenario, mode, env=FAST, timeout=timeout, check=False)
    return proc, time.time() - t0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scenario,wants", [
    ("shape", ["key='w' shape=(3,) float32", "key='w' shape=(4,) float32"]),
    ("dtype", ["key='w' shape=(3,) float32", "key='w' shape=(3,) float64"]),
])
def test_mismatch_named_on_every_rank(mode, scenario, wants):
    proc, _ = fail(scenario, mode)
    assert proc.returncode != 0
    msgs = [ln for ln in proc.stderr.splitlines() if "ranks disagree on a collective" in ln]
    assert msgs, proc.stderr[-3000:]
    for want in wants:
        assert want in msgs[0]
    assert "rank 0 runs" in msgs[0] and "rank 1 runs" in msgs[0]
    # every rank reports it (it may be cut short by the abort, so the native
    # stderr lines, printed first, are what we count in chained/funneled)
    if mode != "concurrent":   # mpirun may interleave bytes of two ranks' lines: search
        named = set(re.findall(r"\[rank (\d)\] mxnet_mpi: ranks disagree", proc.stderr))
        assert {"0", "1"} <= named, proc.stderr[-3000:]


@pytest.mark.parametrize("mode", ["chained", "funneled"])
def test_keys_pushed_in_different_order(mode):
    proc, _ = fail("order", mode)
    assert proc.returncode != 0
    assert "key='a'" in proc.stderr and "key='b'" in proc.stderr
    assert "ranks disagree on a collective" in proc.stderr


@pytest.mark.parametrize("mode", ["chained", "concurrent"])   # blocking and non-blocking MPI
def test_key_missing_on_a_rank_warns_then_aborts(mode):
    proc, took = fail("missing", mode, nranks=3)
    assert proc.returncode != 0
    warn = [ln for ln in proc.stderr.splitlines() if "stall warning" in ln]
    assert warn, proc.stderr[-3000:]
    assert "only_rank0" in warn[0] and "Missing ranks: 1" in warn[0] and " 2 " in warn[0]
    assert "MXNET_MPI_STALL_ABORT_S=4" in proc.stderr
    assert took < 40  # aborted after ~4 s, not after the 120 s the others sleep


def leftovers(marker: str) -> list:
    """PIDs of live processes whose command line contains `marker`."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if marker in (d / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(d.name))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("scenario", ["raise", "sigkill"])
def test_failing_rank_brings_the_job_down(scenario):
    proc, took = fail(scenario, "chained")
    assert proc.returncode != 0
    assert took < 30
    time.sleep(1)
    assert leftovers("faults.py\0" + scenario) == []
    if scenario == "raise":
        assert "boom on rank 1 at step 5" in proc.stderr
        assert "rank 1 raised RuntimeError; aborting the MPI job" in proc.stderr
    assert "rank 0 finished" not in proc.stdout


def test_control_scenario_passes():
    proc, _ = fail("ok", "chained")
    assert proc.returncode == 0 and proc.stdout.count("finished ok") == 2


@pytest.mark.parametrize("mode", ["chained", "concurrent"])
def test_mismatch_is_an_error_under_naive_engine(mode):
    """MXNet's synchronous NaiveEngine drops errors given to an op's completion
    callback: the collective's error must come from the push itself, on every
    rank, never leave the arrays silently unsummed."""
    proc = run_mpi("faults.py", 2, "shape", mode, env={**FAST, "MXNET_ENGINE_TYPE": "NaiveEngine"},
                   timeout=60, check=False)
    assert proc.returncode != 0
    assert "ranks disagree on a collective" in proc.stderr, proc.stderr[-3000:]
    assert "rank 0 finished" not in proc.stdout

"""Reliability: mismatches, stalls and dead ranks end the job fast, non-zero,
with a message naming the key, the ranks and their shapes/dtypes."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from mpirun import run_mpi
from pool import run_pooled

MODES = ["chained", "funneled", "concurrent"]
FAST = {"MXNET_MPI_STALL_WARN_S": "1", "MXNET_MPI_STALL_ABORT_S": "4",
        "MXNET_MPI_HEALTH_INTERVAL_S": "0.2"}


def fail(scenario, mode, nranks=2, timeout=60):
    t0 = time.time()
    proc = run_mpi("faults.py", nranks, scenario, mode, env=FAST, timeout=timeout, check=False)
    return proc, time.time() - t0


MISMATCHES = {
    "shape": ["key='w' shape=(3,) float32", "key='w' shape=(4,) float32"],
    "dtype": ["key='w' shape=(3,) float32", "key='w' shape=(3,) float64"],
    "order": ["key='a'", "key='b'"],
}


def caught_cases(env: dict | None = None, modes=MODES, names=(*MISMATCHES, "ok")) -> dict:
    """{(mode, scenario): [per-rank case]} from one pooled 2-rank job."""
    proc = run_pooled("faults_caught.py", 2, ",".join(modes), ",".join(names), env=env,
                      timeout=120)
    cases: dict = {}
    for ln in proc.stdout.splitlines():
        if ln.startswith("CASE "):
            c = json.loads(ln[5:])
            cases.setdefault((c["mode"], c["scenario"]), []).append(c)
    assert proc.stdout.count("finished") == 2, proc.stdout[-3000:]
    return {"cases": cases, "stderr": proc.stderr}


@pytest.fixture(scope="module")
def caught():
    return caught_cases()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scenario", sorted(MISMATCHES))
def test_mismatch_named_on_every_rank(caught, mode, scenario):
    """Every rank gets the error naming both ranks' calls, at once (not at a
    stall timeout), and the store still sums correctly afterwards."""
    ranks = caught["cases"][(mode, scenario)]
    assert len(ranks) == 2, caught["cases"]
    for c in ranks:
        msg = c["error"]
        assert msg and "ranks disagree on a collective" in msg, c
        assert "rank 0 runs" in msg and "rank 1 runs" in msg, msg
        for want in MISMATCHES[scenario]:
            assert want in msg, msg
        assert c["seconds"] < 10, c
        assert c["after"] == [2.0] * 3, c
    # the native layer names it on each rank's stderr as well
    named = set(re.findall(r"\[rank (\d)\] mxnet_mpi: ranks disagree on a collective of "
                           r"store 'mpi_%s'" % mode, caught["stderr"]))
    assert named == {"0", "1"}, caught["stderr"][-3000:]


@pytest.mark.parametrize("mode", MODES)
def test_control_scenario_passes(caught, mode):
    ranks = caught["cases"][(mode, "ok")]
    assert [c["error"] for c in ranks] == [None, None] and all(c["after"] == [2.0] * 3
                                                               for c in ranks)


def test_uncaught_mismatch_ends_the_job():
    """Left uncaught, the error ends the whole job non-zero on every rank."""
    proc, took = fail("shape", "chained")
    assert proc.returncode != 0 and took < 30
    named = set(re.findall(r"\[rank (\d)\] mxnet_mpi: ranks disagree", proc.stderr))
    assert {"0", "1"} <= named, proc.stderr[-3000:]
    assert "rank 0 finished" not in proc.stdout and "rank 1 finished" not in proc.stdout


def collective_stall_warnings(stderr: str) -> list:
    """The stall warnings about collectives (under load MPI's start-up can wait
    past a 1 s warning too)."""
    return [ln for ln in stderr.splitlines()
            if "stall warning" in ln and "MPI's start-up" not in ln]


@pytest.mark.parametrize("mode", ["chained", "concurrent"])   # blocking and non-blocking MPI
def test_key_missing_on_a_rank_warns_then_aborts(mode):
    proc, took = fail("missing", mode, nranks=3)
    assert proc.returncode != 0
    warn = collective_stall_warnings(proc.stderr)
    assert warn, proc.stderr[-3000:]
    assert "only_rank0" in warn[0] and "Missing ranks: 1" in warn[0] and " 2 " in warn[0]
    assert "MXNET_MPI_STALL_ABORT_S=4" in proc.stderr
    assert took < 40  # aborted after ~4 s, not after the 120 s the others sleep


def test_ranks_waiting_on_different_stores_are_told_so():
    """Each rank waits on a collective of another store than its peer (two
    stores used in different orders): the warning says so, where both named
    the same store and sequence number, as if the peer were on this one."""
    proc, took = fail("two_stores", "funneled")
    assert proc.returncode != 0
    warn = collective_stall_warnings(proc.stderr)
    assert warn, proc.stderr[-3000:]
    assert "of another store, 'mpi_funneled': the ranks wait on different stores" in warn[0]
    assert took < 40


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


@pytest.fixture(scope="module")
def naive():
    """One NaiveEngine pool run for both modes (the engine is chosen at start-up)."""
    return caught_cases({"MXNET_ENGINE_TYPE": "NaiveEngine"}, modes=("chained", "concurrent"),
                        names=("shape",))


@pytest.mark.parametrize("mode", ["chained", "concurrent"])
def test_mismatch_is_an_error_under_naive_engine(naive, mode):
    """MXNet's synchronous NaiveEngine drops errors given to an op's completion
    callback: the collective's error must come from the push itself, on every
    rank, never leave the arrays silently unsummed."""
    ranks = naive["cases"][(mode, "shape")]
    assert len(ranks) == 2
    for c in ranks:
        assert c["error"] and "ranks disagree on a collective" in c["error"], c
        assert c["after"] == [2.0] * 3, c


def test_ranks_waiting_for_a_late_peer_sleep():
    """A peer 3 s late (still loading its data) to a store's creation, then to
    a communicator split: the ranks waiting for it sleep (the blocking MPI
    calls there polled a core: 0.5-1.0 of it), and all goes on exactly."""
    proc = run_mpi("late_peer.py", 2, timeout=120)
    waits = dict((w, float(r)) for w, r in re.findall(r"WAIT (\w+) ([\d.]+) after", proc.stdout))
    assert set(waits) == {"store", "split"}, proc.stdout
    for what, cpu_per_wall in waits.items():
        assert cpu_per_wall < 0.25, (what, proc.stdout)
    assert proc.stdout.count("sum [2.0, 2.0, 2.0]") == 2, proc.stdout


def test_stall_warning_names_only_the_rank_that_is_missing():
    """Ranks with several collectives in flight each report their oldest,
    which differs from rank to rank: a rank in flight on the collective that
    waits is waiting on it too, not missing (rank 2 here was listed as
    missing key 0's collective because its oldest was key 1's)."""
    proc = run_mpi("stall_names.py", 3, timeout=120,
                   env={"MXNET_MPI_STALL_WARN_S": "2", "MXNET_MPI_STALL_ABORT_S": "30"})
    assert proc.stdout.count("sums 3.0 3.0") == 3, proc.stdout
    warnings = re.findall(r"\[rank [02]\] mxnet_mpi: stall warning: .*", proc.stderr)
    assert len(warnings) >= 2, proc.stderr[-3000:]
    for line in warnings:
        assert re.search(r"Ranks waiting on it: [02] [02]\. Missing ranks: 1 \(alive, no "
                         r"collective ready", line), line
        assert not re.search(r"Missing ranks: .*[;:] [02] \(", line), line


@pytest.mark.parametrize("mode,how", [("funneled", "step"), ("concurrent", "step"),
                                      ("funneled", "split"), ("concurrent", "split_stale"),
                                      ("chained", "devices")])
def test_a_gradient_of_another_shape_on_one_rank_keeps_the_ranks_paired(mode, how):
    """A Trainer step whose gradient has another shape on one rank (caught):
    every rank fails that step with the reason and updates nothing, and the
    later steps and collectives are exact (tests/scripts/grad_layout.py says
    what went wrong before: shifted pairing, aborted jobs, a next step that
    updated only some parameters, and with 2 devices, wrong weights with exit
    0)."""
    proc = run_mpi("grad_layout.py", 2, mode, how, timeout=120,
                   env={"MXNET_MPI_STALL_WARN_S": "5", "MXNET_MPI_STALL_ABORT_S": "30"})
    steps = {}
    for ln in proc.stdout.splitlines():
        if ln.startswith("STEP"):
            steps.setdefault(ln.split()[2], []).append(ln)
    assert list(steps) == ["2"] and len(steps["2"]) == 2, proc.stdout
    assert any("rank 1 could not take part in collective" in ln for ln in steps["2"]), steps
    weights = [float(d) for d in re.findall(r"WEIGHTS \d (\S+)", proc.stdout)]
    assert len(weights) == 2 and max(weights) < 1e-5, proc.stdout
    assert sorted(re.findall(r"CHECK \d \S+", proc.stdout)) == ["CHECK 0 3", "CHECK 1 3"], \
        proc.stdout

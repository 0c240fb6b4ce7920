"""Bad input raises MPIKVStoreError with a message naming the problem, and the
store keeps working afterwards: in this process (a world of size 1) and on
2 real MPI ranks, where both ranks must raise the same error and a later
collective must still complete (no rank left stuck in an unmatched one)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mpirun import MPIRUN, mpi_env, run_mpi
from pool import run_pooled

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
import bad_input  # noqa: E402

CASES = {name: (i, words, fn) for i, (name, words, fn) in enumerate(bad_input.CASES)}
CASE_PARAMS = list(CASES)


@pytest.fixture(scope="module")
def kv():
    import mxnet as mx

    import mxnet_mpi
    store = mx.kv.create("mpi")
    assert (mxnet_mpi.rank(), mxnet_mpi.size()) == (0, 1)
    return store


@pytest.mark.parametrize("name", CASE_PARAMS)
def test_bad_input_in_process(kv, name):
    import mxnet as mx

    import mxnet_mpi
    count, words, fn = CASES[name]
    e = bad_input.run_case(kv, fn)
    assert isinstance(e, mxnet_mpi.MPIKVStoreError), "%s raised %r" % (name, e)
    assert isinstance(e, mx.base.MXNetError) and isinstance(e, ValueError)
    missing = [w for w in words if w not in str(e)]
    assert not missing, "message %r lacks %r" % (str(e), missing)
    assert bad_input.store_still_works(kv, 0, 1, name, count) == ""


def test_unknown_mode_lists_valid_modes(monkeypatch):
    import mxnet as mx

    import mxnet_mpi
    monkeypatch.setenv("MXNET_MPI_MODE", "bogus")
    with pytest.raises(mxnet_mpi.MPIKVStoreError) as info:
        mx.kv.create("mpi")
    for mode in mxnet_mpi.MODES:
        assert mode in str(info.value)
    # a store named with its mode ignores the variable
    assert mx.kv.create("mpi_" + mxnet_mpi.DEFAULT_MODE).mode == mxnet_mpi.DEFAULT_MODE
    monkeypatch.setenv("MXNET_MPI_MODE", mxnet_mpi.DEFAULT_MODE)
    assert mx.kv.create("mpi").mode == mxnet_mpi.DEFAULT_MODE


_mpi_run: dict = {}


def mpi_results(tmp_path_factory) -> list:
    if not _mpi_run:
        out = tmp_path_factory.mktemp("bad_input_np2")
        proc = run_pooled("bad_input.py", 2, str(out), timeout=180)
        ranks = []
        for r in range(2):
            path = out / ("rank%d.json" % r)
            assert path.exists(), "rank %d wrote no results\n%s" % (r, proc.stdout[-4000:])
            ranks.append(json.loads(path.read_text()))
        _mpi_run["ranks"] = ranks
    return _mpi_run["ranks"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", CASE_PARAMS)
def test_bad_input_two_ranks(name, tmp_path_factory):
    ranks = mpi_results(tmp_path_factory)
    for res in ranks:
        assert res["size"] == 2
        case = {c["name"]: c for c in res["cases"]}[name]
        assert case["is_mpikv"], "rank %d: %s raised %s: %s" % (
            res["rank"], name, case["type"], case["message"])
        assert case["is_mxnet"] and case["is_value"]
        missing = [w for w in case["words"] if w not in case["message"]]
        assert not missing, "rank %d: message %r lacks %r" % (res["rank"], case["message"],
                                                              missing)
        assert case["same_on_all_ranks"], "rank %d: ranks raised different errors" % res["rank"]
        assert case["after"] == "", "rank %d: %s" % (res["rank"], case["after"])


@pytest.mark.timeout(120)
def test_uncaught_exception_on_one_rank_aborts_the_job(tmp_path):
    """Rank 1 dies with an exception while rank 0 waits in a collective: the
    job must end with an error, not hang."""
    proc = run_mpi("abort_one_rank.py", 2, timeout=90, check=False)
    assert proc.returncode != 0
    assert "rank 1 raised RuntimeError; aborting the MPI job" in proc.stderr, proc.stderr[-3000:]
    assert "rank 0 finished" not in proc.stdout


START_PROBE = r"""
import os, mxnet as mx
for attempt in ("first", "again"):
    try:
        mx.kv.create("mpi")
        print(attempt, "created")
    except mx.base.MXNetError as e:
        print(attempt, type(e).__name__, str(e))
    os.environ.pop("MXNET_MPI_CHUNK_BYTES", None)
"""


def test_ranks_started_with_different_settings_are_told_why():
    """One rank's environment holds other MXNET_MPI_* values from the start: the
    ranks compare them as MPI starts, so the error names each variable and the
    ranks that hold each value, and a later try gets the same error. (An
    averaging or staging setting on one rank used to surface later as 'ranks
    disagree on a collective', naming no variable; a store option as the
    native store's field name.)"""
    differ = ["MXNET_MPI_CHUNK_BYTES=65536", "MXNET_MPI_AVERAGE=1",
              "MXNET_MPI_CONSISTENCY_ACTION=raise", "MXNET_MPI_FORCE_STAGING=1"]
    cmd = [MPIRUN, "-np", "1", sys.executable, "-c", START_PROBE, ":", "-np", "1",
           *[w for d in differ for w in ("-x", d)], sys.executable, "-c", START_PROBE]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=mpi_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("first", "again"))]
    assert len(lines) == 4, proc.stdout
    for ln in lines:
        assert "MPIKVStoreError mxnet_mpi: the ranks' environments hold different " in ln, ln
        for named in ("MXNET_MPI_AVERAGE is 0 on rank 0; 1 on rank 1",
                      "MXNET_MPI_CHUNK_BYTES is 16777216 on rank 0; 65536 on rank 1",
                      "MXNET_MPI_CONSISTENCY_ACTION is warn on rank 0; raise on rank 1",
                      "MXNET_MPI_FORCE_STAGING is 0 on rank 0; 1 on rank 1"):
            assert named in ln, ln
        assert "MXNET_MPI_FUSION_BYTES" not in ln, ln   # the same on both


def test_different_settings_after_mpi4py_started_mpi_end_cleanly():
    """mpi4py started MPI, then the settings were found to differ: mpi4py
    finalised MPI at exit under the library, which still held it (Open MPI's
    'called after MPI_FINALIZE' abort, exit status 14)."""
    probe = "from mpi4py import MPI\n" + START_PROBE
    cmd = [MPIRUN, "-np", "1", sys.executable, "-c", probe, ":", "-np", "1",
           "-x", "MXNET_MPI_AVERAGE=1", sys.executable, "-c", probe]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=mpi_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("MXNET_MPI_AVERAGE is 0 on rank 0; 1 on rank 1") == 4, proc.stdout
    assert "after MPI_FINALIZE" not in proc.stderr, proc.stderr[-3000:]


def test_a_heartbeat_period_on_one_rank_only_is_named():
    """MXNET_MPI_HEALTH_INTERVAL_S=0 (the watchdog off) on one rank only: that
    rank skipped the creation of the heartbeat communicator and every rank hung
    in MPI's start-up, silently. Now every rank is told, on each try."""
    cmd = [MPIRUN, "-np", "1", sys.executable, "-c", START_PROBE, ":", "-np", "1",
           "-x", "MXNET_MPI_HEALTH_INTERVAL_S=0", sys.executable, "-c", START_PROBE]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=mpi_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]   # MPI ends cleanly on every rank
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("first", "again"))]
    assert len(lines) == 4, proc.stdout + proc.stderr[-3000:]
    for ln in lines:
        assert ("MPIKVStoreError mxnet_mpi: MXNET_MPI_HEALTH_INTERVAL_S differs between the "
                "ranks (from 0 to 1 s)") in ln, ln


ONE_STORE = r"""
import mxnet as mx, mxnet_mpi
mxnet_mpi.init()
if mxnet_mpi.rank() == 0:
    mx.kv.create("mpi")   # rank 1 never makes it
print("rank", mxnet_mpi.rank(), "passed", flush=True)
import time; time.sleep(60)
"""
FAST_STALL = {"MXNET_MPI_STALL_WARN_S": "1", "MXNET_MPI_STALL_ABORT_S": "3"}


@pytest.mark.parametrize("peer", ["no_store", "no_mpi"])
def test_waits_for_peers_outside_collectives_end_named(peer):
    """A store created on rank 0 only, or a process of the job that never
    starts MPI (no mxnet_mpi there): the other rank waited in the store's
    creation or in MPI's start-up for good, silently. Now the stall warning
    names the wait and the job ends after MXNET_MPI_STALL_ABORT_S."""
    other = ["-c", ONE_STORE] if peer == "no_store" else ["-c", "import time; time.sleep(60)"]
    cmd = [MPIRUN, "-np", "1", sys.executable, "-c", ONE_STORE, ":", "-np", "1",
           sys.executable, *other]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=mpi_env(FAST_STALL),
                          timeout=120)
    assert proc.returncode != 0
    what = r"creating store 'mpi_\w+'" if peer == "no_store" else r"MPI's start-up"
    assert re.search(r"\[rank 0\] mxnet_mpi: stall warning: %s has waited 1 s for the other "
                     r"ranks" % what, proc.stderr), proc.stderr[-3000:]
    assert re.search(r"\[rank 0\] mxnet_mpi: %s has waited more than "
                     r"MXNET_MPI_STALL_ABORT_S=3 s; aborting the job" % what,
                     proc.stderr), proc.stderr[-3000:]
    assert "rank 0 passed" not in proc.stdout


def test_ranks_that_create_different_stores_are_told_at_once():
    proc = run_pooled("store_kinds.py", 2, timeout=120)
    ranks = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert sorted(r["rank"] for r in ranks) == [0, 1], proc.stdout[-3000:]
    for r in ranks:
        assert "the ranks create different stores" in r["kinds"], r
        assert "rank 0 funneled; rank 1 chained" in r["kinds"], r
        assert "for 'mpi', MXNET_MPI_MODE's" in r["kinds"], r   # where a mode comes from
        assert "rank 0 funneled chunk_bytes=" in r["settings"], r
        assert "MXNET_MPI_MODE" not in r["settings"], r          # only where modes differ
        assert "rank 1 funneled chunk_bytes=65536" in r["settings"], r
        assert r["exact_after"], r


def one_process_stderr(probe: str) -> str:
    """stderr of `probe` run by python (a world of one rank), which must exit 0."""
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=mpi_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def test_stores_created_from_two_threads_are_warned_about():
    """Ranks pair stores by creation order, which threads can make differ
    between ranks (two models of the same shapes then paired silently): a
    store created from another thread than the last is warned about, once."""
    probe = ("import threading, mxnet as mx, mxnet_mpi\n"
             "mx.kv.create('mpi')\n"
             "t = threading.Thread(target=lambda: mx.kv.create('mpi'), name='loader')\n"
             "t.start(); t.join()\n"
             "mx.kv.create('mpi')\n")
    err = one_process_stderr(probe)
    assert err.count("is created from thread 'loader', an earlier one from 'MainThread'") == 1, \
        err[-3000:]
    assert err.count("RuntimeWarning: mxnet_mpi: store") == 1, err[-3000:]


def test_unnamed_collectives_from_two_threads_are_warned_about():
    """Unnamed free-function collectives of one shape from two threads (two
    metric loggers) pair by push order, which differs between ranks: their
    sums mixed the threads' values with no error. Warned about, once; named
    ones are compared by the ranks and pass silently."""
    probe = ("import threading, mxnet as mx, mxnet_mpi\n"
             "a = mx.nd.ones((1,))\n"
             "mxnet_mpi.allreduce_(a, name='loss')\n"
             "t = threading.Thread(target=lambda: mxnet_mpi.allreduce_(a, name='acc'), "
             "name='acc-logger')\n"
             "t.start(); t.join()\n"
             "mxnet_mpi.allreduce_(a)\n"
             "t = threading.Thread(target=lambda: mxnet_mpi.allreduce_(a), name='logger')\n"
             "t.start(); t.join()\n"
             "mxnet_mpi.allreduce_(a)\n")
    err = one_process_stderr(probe)
    assert err.count("collectives without name= are issued from threads 'MainThread' and "
                     "'logger'") == 1, err[-3000:]

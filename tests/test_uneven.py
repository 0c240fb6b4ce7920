"""Uneven data finishes cleanly: join() lets a rank that ran out of data take
part in what the others still run, then every rank continues with the weights
and optimizer state of the rank that ran the most steps; without join, a rank
that finished its program is named at once instead of after the stall abort."""

import re
import time

import pytest
from mpirun import run_mpi
from pool import run_pooled

MODES = ["chained", "funneled", "concurrent"]


@pytest.mark.parametrize("mode", MODES)
def test_join_gives_identical_weights_equal_to_one_process(mode):
    # rank r trains 2 + 3 r steps; the reference is one process summing, at each
    # step, the gradients of the ranks that still had data (see uneven.py)
    proc = run_pooled("uneven.py", 3, mode, "join", timeout=120)
    assert proc.stdout.count("JOIN OK") == 3, proc.stdout
    sums = set(re.findall(r"checksum (\S+)", proc.stdout))
    assert len(sums) == 1, proc.stdout
    assert set(re.findall(r"root (\d+)", proc.stdout)) == {"2"}


@pytest.mark.parametrize("scenario,mode", [("join_kv", "chained"), ("join_zero", "concurrent"),
                                           ("join_zero_all", "funneled"),
                                           ("join_devices", "funneled")])
def test_every_form_of_join_brings_the_trainer_up_to_date(scenario, mode):
    """mxnet_mpi.join() and kv.join() (the forms the no-join error names) bring
    the Trainers created on the store up to date as join(trainer) does (they
    left the ranks that joined early with their old weights: silent drift);
    a rank with no batch at all joins too (join(trainer) refused its Trainer,
    never stepped, as 'not an MPI store')."""
    proc = run_pooled("uneven.py", 3, mode, scenario, timeout=120)
    assert proc.stdout.count("JOIN OK") == 3, proc.stdout
    assert len(set(re.findall(r"checksum (\S+)", proc.stdout))) == 1, proc.stdout


@pytest.mark.parametrize("mode", ["chained", "concurrent"])
def test_finished_rank_is_named_at_once_without_join(mode):
    t0 = time.time()
    proc = run_mpi("uneven.py", 3, mode, "no_join", timeout=120, check=False,
                   env={"MXNET_MPI_STALL_WARN_S": "60", "MXNET_MPI_STALL_ABORT_S": "600"})
    took = time.time() - t0
    assert proc.returncode != 0
    # the Trainer's tables of names and of deferred parameters, its broadcast, 3 steps
    assert "rank 0 finished its program after issuing 6 collectives" in proc.stderr, \
        proc.stderr[-3000:]
    assert "call join()" in proc.stderr
    assert took < 45, took  # not the 60 s stall warning, nor the 600 s abort


def test_root_without_a_batch_and_deferred_parameters_is_told_why():
    """Rank 0 has no batch and the layer's input size comes from the first
    forward: the other ranks cannot take its initial weights from rank 0 once
    it joined. Rank 0 says why and how to avoid it (the others' error named
    only the joined root)."""
    proc = run_mpi("uneven.py", 2, "funneled", "join_zero_root", timeout=60, check=False)
    assert proc.returncode != 0
    assert "rank 0 joins before its first forward pass" in proc.stderr, proc.stderr[-3000:]
    assert "in_units" in proc.stderr


@pytest.mark.parametrize("mode", ["funneled"])   # join per mode: the test above
def test_module_fit_with_uneven_shards_finishes_in_sync(mode):
    """MXNet's fit.py case: shards of 2, 5, 8 batches. Module.fit with our store
    joins at each epoch end by itself: exit 0 and identical weights."""
    proc = run_pooled("module_uneven.py", 3, mode, timeout=120)
    sums = re.findall(r"MODULE_CHECKSUM (\S+)", proc.stdout)
    assert len(sums) == 3 and len(set(sums)) == 1, proc.stdout
    # Ranks on 2, 1 and 3 devices: the join copied optimizer states by MXNet's
    # number (parameter x devices + device), so a rank got another parameter's
    # state (a shape error at the next update); and fit's end of epoch averaged
    # the 3 devices' identical copies, moving that rank's weights by rounding.
    # The same weights on every rank, and as with 1 device each (to rounding).
    proc = run_pooled("module_uneven.py", 3, mode, "2,1,3", timeout=120)
    uneven = re.findall(r"MODULE_CHECKSUM (\S+)", proc.stdout)
    assert len(uneven) == 3 and len(set(uneven)) == 1, proc.stdout
    assert abs(float(uneven[0]) - float(sums[0])) < 1e-6 * abs(float(sums[0])), (uneven, sums)
    # Adam's update counts are kept per device id: they restarted from 0 on
    # the devices a rank took over at the join (1e-3 apart, ranks alike)
    adam = {}
    for devices in ("1,1,1", "2,1,3"):
        proc = run_pooled("module_uneven.py", 3, mode, devices, "adam", timeout=120)
        adam[devices] = re.findall(r"MODULE_CHECKSUM (\S+)", proc.stdout)
        assert len(adam[devices]) == 3 and len(set(adam[devices])) == 1, proc.stdout
    one, many = float(adam["1,1,1"][0]), float(adam["2,1,3"][0])
    assert abs(one - many) < 1e-6 * abs(one), adam


def _joined(out: str) -> dict:
    return dict((ln.split()[1], ln.split(None, 2)[2]) for ln in out.splitlines()
                if ln.startswith(("WEIGHTS ", "ERROR ")))


@pytest.mark.parametrize("scenario", ["module_loop", "check_every", "lanes", "three_stores"])
def test_join_composed_keeps_ranks_alike(scenario):
    """A Module's own loop joined with mxnet_mpi.join() (the ranks ended apart,
    exit 0); joins under MXNET_MPI_CONSISTENCY_EVERY=2 (the ranks' check
    counters drifted: 'ranks disagree', exit 1); concurrent mode with two
    lanes for large arrays (the copy after the join hung); three stores joined
    at once, four times (a round hung about 1 time in 3)."""
    proc = run_pooled("join_compose.py", 2, scenario, timeout=120,
                      env={"MXNET_MPI_CONSISTENCY_EVERY": "2", "MXNET_MPI_LARGE_LANES": "2",
                           "MXNET_MPI_STALL_WARN_S": "5", "MXNET_MPI_STALL_ABORT_S": "30"})
    got = _joined(proc.stdout)
    assert set(got) == {"0", "1"} and got["0"] == got["1"], proc.stdout[-3000:]


def test_join_of_two_chained_stores_is_named():
    proc = run_pooled("join_compose.py", 2, "chained_two", timeout=120,
                      env={"MXNET_MPI_STALL_WARN_S": "5", "MXNET_MPI_STALL_ABORT_S": "20"})
    got = _joined(proc.stdout)
    assert set(got) == {"0", "1"}, proc.stdout[-3000:]
    assert all("cannot be joined together" in v for v in got.values()), got


@pytest.mark.parametrize("optimizer", ["sgd", "nadam"])
def test_join_keeps_the_programs_optimizer_and_scheduler(optimizer):
    """After join(), every rank still uses the program's optimizer and
    lr_scheduler objects, holding the latest rank's states, counts and values
    (Nadam's m_schedule: without it, the settings check stopped the job): a
    scheduler change by the program reaches every rank, and they train alike."""
    proc = run_pooled("join_held_optimizer.py", 2, optimizer, timeout=120)
    got = sorted(ln for ln in proc.stdout.splitlines() if ln.startswith("RANK"))
    assert got == ["RANK %d kept True alike True num_update 5" % r for r in range(2)], \
        proc.stdout + proc.stderr[-3000:]

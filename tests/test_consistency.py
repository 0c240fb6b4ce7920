"""Weight consistency check across real ranks: a 1-ulp difference on one rank is
found and named, 'raise' raises, 'broadcast' restores bit-identical weights,
the periodic setting runs it from Trainer.step, and off it issues nothing."""

import re

import pytest
from mpirun import run_mpi


def results(out: str) -> list:
    return [dict(kv.split("=", 1) for kv in line.split()[1:])
            for line in re.findall(r"RESULT (.*)", out)]


@pytest.mark.parametrize("mode", ["chained", "concurrent"])
def test_api_finds_names_raises_and_repairs(mode):
    proc = run_mpi("consistency.py", 2, mode, "api", timeout=120)
    res = results(proc.stdout)
    assert len(res) == 2, proc.stdout
    for r in res:
        assert r["clean"] == "True" and r["one_collective"] == "True"
        assert r["found"] == "['dense1_weight']" and r["warned"] == "True"
        assert r["raised"] == "yes" and r["still_differ"] == "True" and r["fixed"] == "True"
    assert "first 'dense1_weight', where rank(s) 1 differ from rank 0" in proc.stdout


def test_periodic_check_from_trainer_step_rebroadcasts():
    env = {"MXNET_MPI_CONSISTENCY_EVERY": "2", "MXNET_MPI_CONSISTENCY_ACTION": "broadcast"}
    proc = run_mpi("consistency.py", 2, "funneled", "periodic", env=env, timeout=120)
    assert [r for r in results(proc.stdout)] == [{"warned": "True", "fixed": "True"}] * 2, \
        proc.stdout


def test_off_by_default_costs_no_collective():
    per_step = {}
    for every in ("0", "1"):
        proc = run_mpi("consistency.py", 2, "concurrent", "off", timeout=120,
                       env={"MXNET_MPI_CONSISTENCY_EVERY": every})
        counts = {r["per_step"] for r in results(proc.stdout)}
        assert len(counts) == 1, proc.stdout
        per_step[every] = float(counts.pop())
    assert per_step["1"] == per_step["0"] + 1   # the check is one small collective


def test_periodic_check_from_module_update_rebroadcasts():
    env = {"MXNET_MPI_CONSISTENCY_EVERY": "2", "MXNET_MPI_CONSISTENCY_ACTION": "broadcast"}
    proc = run_mpi("consistency_module.py", 2, "chained", env=env, timeout=120)
    want = {"differs_before": "True", "warned": "True", "names_fc_weight": "True",
            "fixed": "True"}
    assert results(proc.stdout) == [want] * 2, proc.stdout + proc.stderr[-3000:]

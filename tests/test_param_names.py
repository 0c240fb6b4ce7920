"""Mismatch, token and stall messages about a Trainer's or a Module's
collectives name the parameter (as each rank names it), keep the key, and say
which call and step pushed the collective, also when the error is raised
steps later (see tests/scripts/param_names.py)."""

import json
import time

import pytest
from mpirun import run_mpi
from pool import run_pooled

SECTIONS = ("init_shape,deferred_shape,later,bad_value,names_differ,name_counters,"
            "list_order,module_shape")
FAST = {"MXNET_MPI_STALL_WARN_S": "1", "MXNET_MPI_STALL_ABORT_S": "4",
        "MXNET_MPI_HEALTH_INTERVAL_S": "0.2"}


@pytest.mark.parametrize("mode", ["chained", "funneled"])   # relay op / lane thread errors
def test_messages_name_parameter_key_step_and_call(tmp_path, mode):
    run_pooled("param_names.py", 2, mode, str(tmp_path), SECTIONS, timeout=180)
    for r in range(2):
        out = json.loads((tmp_path / ("rank%d.json" % r)).read_text())
        bad = {k: v for k, v in out["sections"].items() if v["status"] != "OK"}
        assert not bad, (r, bad, out["messages"])
        assert sorted(out["sections"]) == sorted(SECTIONS.split(","))


def test_stall_names_parameter_and_step():
    """Rank 1 never issues the allreduce of one layer's parameters."""
    t0 = time.time()
    proc = run_mpi("param_names.py", 2, "concurrent", "-", "stall", env=FAST, timeout=120,
                   check=False)
    assert proc.returncode != 0
    # (under load MPI's start-up can wait past the 1 s warning too: not this one)
    warn = [ln for ln in proc.stderr.splitlines()
            if "stall warning" in ln and "MPI's start-up" not in ln]
    assert warn, proc.stderr[-3000:]
    assert ("'allreduce keys=(1, 0) shapes=((5, 4), (5,)) float32' for parameters "
            "'stall_a_weight', 'stall_a_bias' [Trainer.step 1: gradient allreduce]") in warn[0]
    assert "Missing ranks: 1" in warn[0]
    assert "more than MXNET_MPI_STALL_ABORT_S=4" in proc.stderr
    assert time.time() - t0 < 60   # the abort, not rank 1's 60 s sleep

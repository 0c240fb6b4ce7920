"""Weight consistency check across real ranks: a 1-ulp difference on one rank is
found and named, 'raise' raises, 'broadcast' restores bit-identical weights
and optimizer states,
the periodic setting runs it from Trainer.step and Module.update and leaves out
a rank that joined, off it issues nothing, hybrid stores compare every rank,
and bad settings are named errors. An optimizer that draws noise in its
update (SGLD) draws the same on every rank."""

import re
import sys

import launching
import pytest
from mpirun import SCRIPTS
from pool import run_pooled


def results(out: str) -> list:
    return [dict(kv.split("=", 1) for kv in line.split()[1:])
            for line in re.findall(r"RESULT (.*)", out)]


@pytest.mark.parametrize("mode", ["chained", "concurrent"])
def test_api_finds_names_raises_and_repairs(mode):
    proc = run_pooled("consistency.py", 2, mode, "api", timeout=120)
    res = results(proc.stdout)
    assert len(res) == 2, proc.stdout
    for r in res:
        assert r["clean"] == "True" and r["one_collective"] == "True"
        assert r["found"] == "['dense1_weight']" and r["warned"] == r["repeated"] == "True"
        assert r["raised"] == "yes" and r["still_differ"] == "True" and r["fixed"] == "True"
    assert "first 'dense1_weight' (key 3), where rank(s) 1 differ from rank 0" in proc.stdout


def test_periodic_check_from_trainer_step_rebroadcasts():
    env = {"MXNET_MPI_CONSISTENCY_EVERY": "2", "MXNET_MPI_CONSISTENCY_ACTION": "broadcast"}
    proc = run_pooled("consistency.py", 2, "funneled", "periodic", env=env, timeout=120)
    assert [r for r in results(proc.stdout)] == [{"warned": "True", "fixed": "True"}] * 2, \
        proc.stdout


def test_broadcast_copies_optimizer_states_so_ranks_stay_alike():
    """Rank 1's momentum, or its float32 master copy of float16 weights, moved:
    the broadcast action copied rank 0's weights only, and the next update
    took them apart again (the master copy makes the next weights)."""
    proc = run_pooled("consistency.py", 2, "funneled", "states", timeout=120)
    want = {"%s_%s" % (d, k): "True" for d in ("float32", "float16")
            for k in ("found", "said", "kept", "alike")}
    assert results(proc.stdout) == [want] * 2, proc.stdout + proc.stderr[-3000:]


@pytest.mark.parametrize("nranks", [2, 3])
def test_periodic_check_leaves_out_a_rank_that_joined(nranks):
    """Uneven data: while the last rank has joined (zeros into every sum), the
    checks of the others' further steps saw zeros for its hashes and reported
    its weights as different (with action 'raise', an error). With 3 ranks the
    checks after the join still run: rank 1's moved weight is named, the
    joined rank is not."""
    env = {"MXNET_MPI_CONSISTENCY_EVERY": "1", "MXNET_MPI_CONSISTENCY_ACTION": "raise"}
    proc = run_pooled("consistency.py", nranks, "funneled", "joined", env=env, timeout=120)
    res = results(proc.stdout)
    assert len(res) == nranks, proc.stdout
    if nranks == 2:
        assert res == [{"error": "False", "differ": "None", "same": "True"}] * 2, proc.stdout
    else:
        stepping = [r for r in res if r["error"] == "True"]
        assert len(stepping) >= 2 and all(r["differ"] == "1" for r in stepping), proc.stdout
        # join() ends with the last stepping rank's weights everywhere
        assert all(r["same"] == "True" for r in res), proc.stdout


def test_off_by_default_costs_no_collective():
    per_step = {}
    for every in (None, "1"):   # None: unset, the default
        proc = run_pooled("consistency.py", 2, "concurrent", "off", timeout=120,
                          env={"MXNET_MPI_CONSISTENCY_EVERY": every})
        counts = {r["per_step"] for r in results(proc.stdout)}
        assert len(counts) == 1, proc.stdout
        per_step[every] = float(counts.pop())
    assert per_step["1"] == per_step[None] + 1   # the check is one small collective


def test_periodic_check_from_module_update_rebroadcasts():
    env = {"MXNET_MPI_CONSISTENCY_EVERY": "2", "MXNET_MPI_CONSISTENCY_ACTION": "broadcast"}
    proc = run_pooled("consistency_module.py", 2, "chained", env=env, timeout=120)
    want = {"differs_before": "True", "warned": "True", "names_fc_weight": "True",
            "fixed": "True", "by_hand": "True", "fixed_by_hand": "True",
            "get_params_fresh": "True", "kept": "True", "alike_after": "True"}
    assert results(proc.stdout) == [want] * 2, proc.stdout + proc.stderr[-3000:]


BAD_INPUT = r"""
import os, sys
import mxnet as mx
from mxnet import autograd, gluon
import mxnet_mpi
net = gluon.nn.Dense(2, in_units=3)
net.initialize()
trainer = gluon.Trainer(net.collect_params(), "sgd", kvstore="mpi")
# set after MPI started (where a bad value is refused with the other settings):
# the check reads it again at each step
os.environ["MXNET_MPI_CONSISTENCY_ACTION"] = "repair"
def report(what, fn):
    try:
        fn()
        print(what, "NO ERROR")
    except mxnet_mpi.MPIKVStoreError as exc:
        print(what, "ERROR", exc)
def step():
    with autograd.record():
        loss = net(mx.nd.ones((1, 3))).sum()
    loss.backward()
    trainer.step(1)
report("env", step)
report("action", lambda: mxnet_mpi.check_consistency(trainer, action="fix"))
report("store", lambda: mxnet_mpi.check_consistency({"w": mx.nd.ones(2)}, action="warn"))
report("target", lambda: mxnet_mpi.check_consistency({"w": 3}, store=trainer._kvstore,
                                                   action="warn"))
"""


def test_bad_settings_and_arguments_are_named_errors(tmp_path):
    env = {"MXNET_MPI_CONSISTENCY_EVERY": "5"}
    script = tmp_path / "bad_input.py"
    script.write_text(BAD_INPUT)
    proc = run_pooled(str(script), 1, env=env, timeout=60)
    out = proc.stdout
    # the first step already refuses the misspelt action, not the fifth
    assert "env ERROR MXNET_MPI_CONSISTENCY_ACTION must be one of warn, broadcast, raise, " \
           "got 'repair'" in out, out
    assert "action ERROR action must be one of warn, broadcast, raise, got 'fix'" in out, out
    assert "store ERROR check_consistency needs an mxnet_mpi store" in out, out
    assert "target ERROR check_consistency takes a Trainer" in out and "'w'" in out, out


def test_hybrid_store_compares_the_ranks_of_its_group():
    proc = launching.run(2, 1, 1, [sys.executable, str(SCRIPTS / "consistency.py"),
                                   "dist_sync_mpi", "hybrid"], timeout=120)
    want = {"type": "dist_sync_mpi", "group": "2", "found": "['dense1_weight']",
            "warned": "True", "after": "[]"}
    assert results(proc.stdout) == [want] * 2, proc.stdout[-4000:]


def test_noisy_optimizer_keeps_ranks_and_devices_alike():
    """SGLD adds noise in each update: ranks seeded apart (as for Dropout), and
    a rank's two devices, drew their own and drifted apart silently. The
    noise now comes from what every rank holds alike, through a Trainer, a
    Module, the store's own optimizer and the Horovod-style trainers, with
    float32 master copies, and where rank 0 joins first; and it is noise."""
    proc = run_pooled("noisy_updates.py", 2, timeout=180)
    got = sorted(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    want = ["RESULT %s ranks_alike=True devices_alike=True noisy=True" % path
            for path in ("trainer", "module", "store", "join", "hvd_trainer", "hvd_optimizer")]
    want += ["RESULT fp16 ranks_alike=True masters_alike=True",
             "RESULT seeds choose_noise=True repeat=True", "RESULT subclass warned=True"]
    assert got == sorted(want * 2), proc.stdout + proc.stderr[-3000:]

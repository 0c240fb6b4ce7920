"""Weights or optimizer states written on some ranks only after the trainer
exists (set_data, load_parameters, initialize(force_reinit=True),
Trainer.load_states) would drift apart silently, each rank updating its own
copy: every rank raises at the next step, before applying it, naming what
differs; written alike on every rank, training goes on bit-identical. Written
on rank 0 only before the Trainer exists (deferred-init parameters included),
rank 0's weights go to every rank (tests/scripts/weight_writes.py)."""

import pytest
from pool import run_sections

SECTIONS = {
    "funneled": "set_data,set_data_update,load_parameters,load_states,force_reinit,alike,"
                "horovod,module,deferred_before_trainer,module_fit,store_states,store_settings,"
                "store_join",
    # concurrent splits collectives by size: another carrier of the batch sizes
    "concurrent": "set_data,alike,store_states",
    "chained": "store_states,store_join",
}


@pytest.mark.parametrize("mode", sorted(SECTIONS))
def test_rank_local_writes_are_stopped_and_alike_ones_train_on(tmp_path, mode):
    ranks = run_sections("weight_writes.py", 2, mode, tmp_path, SECTIONS[mode])
    assert ranks[0]["digests"] == ranks[1]["digests"]
    want = {"store_states", "store_states_reloaded"}
    if mode != "chained":
        want |= {"set_data", "alike"}
    if mode == "funneled":
        want |= {"set_data_update", "horovod", "deferred_forward"}
    if mode != "concurrent":
        want.add("store_join")
    assert set(ranks[0]["digests"]) == want


def test_hybrid_local_updates_compare_over_the_world():
    """dist_sync_mpi with local updates, 2 groups of 1: a write on rank 1 (the
    other group) is refused on both ranks; check_consistency's broadcast copies
    rank 0's weights across the groups, and the ranks train on identical; so
    do ranks whose batches use different heads (ignore_stale_grad=True). A
    second hybrid store after close() is refused at once (it waited forever
    on ps-lite: a process joins the parameter server once)."""
    import sys

    from launching import run as launch
    from mpirun import SCRIPTS

    out = launch(2, 2, 1, [sys.executable, str(SCRIPTS / "hybrid_writes.py")], timeout=120).stdout
    refused = [ln for ln in out.splitlines() if "REFUSED" in ln]
    assert len(refused) == 2 and all("NOT REFUSED" not in ln for ln in refused), out[-3000:]
    assert all("Trainer.step 2" in ln and "rank(s) 1 differ from rank 0" in ln
               for ln in refused), refused
    weights = {ln.split("WEIGHTS ")[1] for ln in out.splitlines() if "WEIGHTS " in ln}
    assert len(weights) == 1 and out.count("WEIGHTS ") == 2, out[-3000:]
    # ignore_stale_grad=True with a head per rank (tests/scripts/optimizer_settings.py
    # checks the numbers against one process): the same on every rank of the world
    heads = {ln.split("HEADS ")[1] for ln in out.splitlines() if "HEADS " in ln}
    assert len(heads) == 1 and out.count("HEADS ") == 2, out[-3000:]
    assert heads.pop().endswith("used moved True unused still True")
    reopen = [ln for ln in out.splitlines() if "REOPEN " in ln]
    assert len(reopen) == 2 and all("keep one hybrid store open" in ln for ln in reopen), reopen


def test_hybrid_servers_skip_parameters_no_rank_used():
    """dist_sync_mpi with the servers updating (its default), ignore_stale_grad=True
    and heads per rank: a stale gradient adds nothing and a parameter fresh on no
    rank is neither pushed nor updated (MXNet pushed every gradient buffer, the
    last step's values included, and the servers applied momentum and weight
    decay to unused parameters): equal to one process (tests/scripts/hybrid_stale.py)."""
    import sys

    from launching import run as launch
    from mpirun import SCRIPTS

    out = launch(2, 2, 1, [sys.executable, str(SCRIPTS / "hybrid_stale.py")], timeout=120).stdout
    lines = [ln for ln in out.splitlines() if "STALE_UOK" in ln]
    assert len(lines) == 2, out[-3000:]
    for ln in lines:
        assert float(ln.split("maxdiff ")[1].split()[0]) <= 1e-7 and ln.endswith("moved True"), ln


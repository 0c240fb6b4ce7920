"""Ranks that pass different batch sizes stay bit-identical and follow the
documented rule (docs/store.md, "Batch sizes"), in every mode, on every path
of the Trainer (plan, allreduce_grads + update, several devices, averaging,
fp16 compression), in the Module API and in mxnet_mpi.horovod's
DistributedTrainer: each section's weights equal, bit for bit, a one-process
reference computed in the script (see tests/scripts/batch_sizes.py)."""

import json

import pytest
from pool import run_pooled

# Every path in every mode costs too much here: the paths that differ by mode
# (the plan: chained orders by push, funneled fuses, concurrent splits by size)
# run in every mode, the rest once.
SECTIONS = {
    "chained": "trainer,split,two_devices,module,horovod,horovod_uneven_devices",
    "funneled": "trainer,trainer_float64,average,module,uneven_devices,uneven_devices_split,"
                "cast_after_trainer",
    "concurrent": "trainer,fp16_compression,module",
}


@pytest.mark.parametrize("mode", sorted(SECTIONS))
def test_different_batch_sizes_keep_ranks_identical(tmp_path, mode):
    run_pooled("batch_sizes.py", 2, mode, str(tmp_path), SECTIONS[mode], timeout=240)
    ranks = [json.loads((tmp_path / ("rank%d.json" % r)).read_text()) for r in range(2)]
    for r in ranks:
        bad = {k: v for k, v in r["sections"].items() if v["status"] != "OK"}
        assert not bad, (r["rank"], bad)
        assert sorted(r["sections"]) == sorted(SECTIONS[mode].split(","))
    assert ranks[0]["digests"] == ranks[1]["digests"]   # bit-identical across ranks
    assert len(ranks[0]["digests"]) == len(SECTIONS[mode].split(","))


# The hybrid store with local updates (update_on_kvstore=False), real ps-lite:
# 1 group of 2 and 2 groups of 1. Group 1 starts with MXNet's nightly
# dist_device_sync pattern (str keys, then a two-device Trainer: int keys);
# group 2 the other way round (int keys first).
HYBRID_SECTIONS = {
    1: "hybrid_nightly,hybrid_trainer,hybrid_two_devices,hybrid_optimizer",
    2: "hybrid_trainer,hybrid_two_devices,hybrid_nightly,hybrid_optimizer",
}


@pytest.mark.parametrize("groups", sorted(HYBRID_SECTIONS))
def test_hybrid_local_updates_batch_sizes_and_two_devices(tmp_path, groups):
    """dist_sync_mpi with update_on_kvstore=False: ranks with different batch
    sizes, and with two devices each, stay bit-identical and equal the
    one-process reference of the rule (summed over the whole world); str and
    int keys mix on one store; a server-update Trainer over other parameters
    at keys the servers hold (local-update sums) is refused, and so is a
    local-update Trainer on servers that hold an optimizer."""
    import sys

    from launching import run as launch
    from mpirun import SCRIPTS
    launch(2, groups, 1, [sys.executable, str(SCRIPTS / "batch_sizes.py"), "hybrid",
                          str(tmp_path), HYBRID_SECTIONS[groups]], timeout=240)
    ranks = [json.loads((tmp_path / ("rank%d.json" % r)).read_text()) for r in range(2)]
    for r in ranks:
        bad = {k: v for k, v in r["sections"].items() if v["status"] != "OK"}
        assert not bad, (r["rank"], bad)
        assert sorted(r["sections"]) == sorted(HYBRID_SECTIONS[groups].split(","))
    assert ranks[0]["digests"] == ranks[1]["digests"]
    assert len(ranks[0]["digests"]) == 3   # the 3 trained sections

"""Ranks that pass different batch sizes stay bit-identical and follow the
documented rule (docs/store.md, "Batch sizes"), in every mode, on every path
of the Trainer (plan, allreduce_grads + update, several devices, averaging,
fp16 compression), in the Module API and in mxnet_mpi.horovod's
DistributedTrainer: each section's weights equal, bit for bit, a one-process
reference computed in the script (see tests/scripts/batch_sizes.py)."""

import json

import pytest
from mpirun import run_mpi

# Every path in every mode costs too much here: the paths that differ by mode
# (the plan: chained orders by push, funneled fuses, concurrent splits by size)
# run in every mode, the rest once.
SECTIONS = {
    "chained": "trainer,split,two_devices,module,horovod",
    "funneled": "trainer,trainer_float64,average,module",
    "concurrent": "trainer,fp16_compression,module",
}


@pytest.mark.parametrize("mode", sorted(SECTIONS))
def test_different_batch_sizes_keep_ranks_identical(tmp_path, mode):
    run_mpi("batch_sizes.py", 2, mode, str(tmp_path), SECTIONS[mode], timeout=240)
    ranks = [json.loads((tmp_path / ("rank%d.json" % r)).read_text()) for r in range(2)]
    for r in ranks:
        bad = {k: v for k, v in r["sections"].items() if v["status"] != "OK"}
        assert not bad, (r["rank"], bad)
        assert sorted(r["sections"]) == sorted(SECTIONS[mode].split(","))
    assert ranks[0]["digests"] == ranks[1]["digests"]   # bit-identical across ranks
    assert len(ranks[0]["digests"]) == len(SECTIONS[mode].split(","))

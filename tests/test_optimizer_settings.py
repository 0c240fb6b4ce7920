"""Ranks whose optimizers differ (learning rate, optimizer, momentum, weight
decay, a parameter's multiplier, a scheduler or its list of steps or the
values a scheduler of one's own keeps, numpy scalars among them, the
number of parameters one update op takes, the Trainer's rescale_grad,
set_learning_rate on one rank) would drift apart silently, each updating its
own weights: every rank raises at the step the difference appears, naming its
settings, on the Trainer's paths, in the Module API and in mxnet_mpi.horovod;
equal settings train on, bit-identical. A step refused on one rank for a
stale gradient is refused on every rank (tests/scripts/optimizer_settings.py)."""

import pytest
from pool import run_sections

SECTIONS = {
    "funneled": "learning_rate,optimizer,momentum,weight_decay,lr_mult,scheduler,"
                "scheduler_steps,scheduler_peek,numpy_rate,private_scheduler,nested_scheduler,"
                "function_scheduler,scheduler_subclass,"
                "aggregate,nadam_devices,nadam_lr,nadam_states,module_nadam_devices,"
                "rescale_grad,set_learning_rate,same,module,horovod,horovod_optimizer,set_optimizer,"
                "stale_gradient,stale_gradient_horovod,ignore_stale,ignore_stale_update,"
                "ignore_stale_horovod",
    # concurrent splits collectives by size: another carrier of the batch sizes
    "concurrent": "learning_rate,same,ignore_stale",
}


@pytest.mark.parametrize("mode", sorted(SECTIONS))
def test_ranks_with_different_optimizers_are_stopped_and_equal_ones_agree(tmp_path, mode):
    ranks = run_sections("optimizer_settings.py", 2, mode, tmp_path, SECTIONS[mode])
    assert ranks[0]["digests"] == ranks[1]["digests"]
    assert {"same_adam", "same_sgd"} <= set(ranks[0]["digests"])
    if mode == "funneled":
        assert {"scheduler_peek", "nested_scheduler"} <= set(ranks[0]["digests"])

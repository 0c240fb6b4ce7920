"""Arrays that MXNet keeps in a oneDNN layout (conv weights after an
inference forward) go through every collective without a hang and exactly."""

import pytest
from pool import run_pooled


@pytest.mark.parametrize("mode", ["chained", "funneled", "concurrent"])
def test_collectives_on_onednn_layout_arrays(mode):
    proc = run_pooled("onednn_layout.py", 2, env={"MXNET_MPI_MODE": mode}, timeout=120)
    assert proc.stdout.count("ONEDNN_OK") == 2

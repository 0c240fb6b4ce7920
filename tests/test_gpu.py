"""GPU arrays (skipped without a GPU; tools/gpu_check.sh runs them on one):
pushpull/broadcast of GPU arrays in every mode on 2 ranks sharing a GPU, exact
against numpy; a Trainer on the GPU in sync across ranks and equal to one
process on the global batch."""

import re
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mpirun import ROOT, SCRIPTS, mpi_env, run_mpi

pytestmark = pytest.mark.skipif(mx.context.num_gpus() == 0,
                                reason="no GPU on this machine (tools/gpu_check.sh runs these "
                                       "on one)")


@pytest.mark.parametrize("mode", ["chained", "funneled", "concurrent"])
def test_gpu_arrays_exact(mode):
    proc = run_mpi("gpu_run.py", 2, "exact", mode, timeout=300)
    checks = re.findall(r"CHECK (\S+) (ok|FAIL)", proc.stdout)
    assert len(checks) == 2 * (2 * 2 * 3 + 1), proc.stdout
    assert all(r == "ok" for _, r in checks), [c for c in checks if c[1] != "ok"]


def test_gpu_trainer_matches_one_process(tmp_path):
    run_mpi("gpu_run.py", 2, "trainer", str(tmp_path), timeout=600)
    subprocess.run([sys.executable, str(SCRIPTS / "gpu_run.py"), "reference", str(tmp_path),
                    "2"], check=True, env=mpi_env(), cwd=str(ROOT), timeout=600)
    r0, r1 = (dict(np.load(tmp_path / ("rank%d.npz" % r))) for r in (0, 1))
    ref = dict(np.load(tmp_path / "ref.npz"))
    assert r0.keys() == ref.keys()
    for k in ref:
        assert np.array_equal(r0[k], r1[k]), k            # ranks in sync, bit for bit
        # cuDNN sums in another order than the reference's accumulation
        np.testing.assert_allclose(r0[k], ref[k], rtol=1e-3, atol=1e-5, err_msg=k)

"""GPU arrays (skipped without a GPU; tools/gpu_check.sh runs them on one):
pushpull/broadcast of GPU arrays in every mode on 2 ranks sharing a GPU, exact
against numpy; a Trainer on the GPU in sync across ranks and equal to one
process on the global batch.

The exactness tests use only copies between host and GPU (no GPU kernel), so
they also run where MXNet's CUDA build has no kernels for the GPU (its wheels
carry machine code for sm_50-86 and no PTX: nothing runs on Hopper); the
Trainer test needs kernels and says so when it skips."""

import functools
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


@functools.lru_cache(maxsize=None)
def probe() -> dict:
    """{'COPY': line, 'KERNEL': line} from a separate process (a GPU fault there
    cannot take the test process down)."""
    p = subprocess.run([sys.executable, str(SCRIPTS / "gpu_run.py"), "probe"],
                       capture_output=True, text=True, env=mpi_env(), cwd=str(ROOT),
                       timeout=600)
    found = dict(re.findall(r"^(COPY|KERNEL) (.*)$", p.stdout, re.M))
    errors = [ln.strip() for ln in p.stderr.splitlines() if "rror" in ln]
    for what in ("COPY", "KERNEL"):     # the probe died before answering
        found.setdefault(what, "FAIL exit %d: %s" % (p.returncode, errors[-1:] or "no error"))
    return found


def test_gpu_copies_run():
    assert probe().get("COPY") == "ok", probe()


@pytest.mark.parametrize("mode", ["chained", "funneled", "concurrent"])
def test_gpu_arrays_exact(mode):
    proc = run_mpi("gpu_run.py", 2, "exact", mode, timeout=300)
    checks = re.findall(r"CHECK (\S+) (ok|FAIL.*)", proc.stdout)
    counts = [int(c) for c in re.findall(r"CHECKS (\d+)", proc.stdout)]
    assert counts == [2 * 2 * 3 + 1] * 2, proc.stdout
    assert len(checks) == sum(counts), proc.stdout
    assert all(r == "ok" for _, r in checks), [c for c in checks if c[1] != "ok"]


def test_gpu_trainer_matches_one_process(tmp_path):
    kernel = probe().get("KERNEL", "FAIL no answer from the probe")
    if kernel != "ok":
        pytest.skip("MXNet's kernels do not run on this GPU: " + kernel)
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

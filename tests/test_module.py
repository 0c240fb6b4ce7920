"""Module API: Module.fit(kvstore='mpi') keeps ranks identical and matches one
process training on the concatenated batch (gradients averaged over ranks, as
MXNet does for dist_sync in Module)."""

import json
import re

import numpy as np
import pytest
from mpirun import SCRIPTS, run_mpi
from pool import run_pooled

import mxnet_mpi

SCRIPT = str(SCRIPTS / "module_train.py")


@pytest.mark.parametrize("nranks", [2, 3])
def test_module_fit_mpi(tmp_path, nranks):
    proc = run_pooled(SCRIPT, nranks, "--kvstore", "mpi", "--outdir", str(tmp_path / "mpi"))
    assert "kvstore type mpi_%s" % mxnet_mpi.DEFAULT_MODE in proc.stdout
    ranks = [dict(np.load(tmp_path / "mpi" / ("rank%d.npz" % r))) for r in range(nranks)]
    run_pooled(SCRIPT, 1, "--reference", str(nranks), "--outdir", str(tmp_path / "ref"))
    ref = dict(np.load(tmp_path / "ref" / "rank0.npz"))
    assert set(ref) == {"fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"}
    for name in ref:
        for r in range(1, nranks):
            np.testing.assert_array_equal(ranks[r][name], ranks[0][name], err_msg=name)
        np.testing.assert_allclose(ranks[0][name], ref[name], rtol=1e-4, atol=1e-5,
                                   err_msg=name)


@pytest.mark.parametrize("saved,resumed", [(2, 1), (1, 3), (1, 2)])
def test_checkpoint_resumes_on_another_number_of_devices(tmp_path, saved, resumed):
    """Module.save_checkpoint's optimizer states (MXNet numbers them parameter
    x devices + device) loaded on another number of devices per rank gave
    momentum to other parameters (2 -> 1 devices: weights off by 0.1, exit 0;
    with biases, a shape error). Our files are by parameter; MXNet-numbered
    ones are renumbered (1 -> 2: 4 states read as 2 parameters x 2 devices
    too, told apart by their shapes). Either way the resumed run ends as the
    one that never stopped (to rounding: devices split the batch differently)."""
    proc = run_pooled("module_resume.py", 2, str(tmp_path), str(saved), str(resumed),
                      timeout=180)
    rows = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(rows) == 2, proc.stdout[-3000:]
    for row in rows:
        assert row["checkpoint"] < 1e-6 and row["mxnet_numbered"] < 1e-6, row


@pytest.mark.parametrize("case", ["fit_uneven", "fit_switched", "write_other", "sequential"])
def test_bucketing_and_sequential_modules(case):
    """BucketingModule.fit on uneven shards joins at each end of epoch, as
    Module.fit does (it paired a rank's next epoch with the others' last, then
    failed at the end), with every parameter of the default bucket (where
    init_optimizer ran in a bucket that lacks some, those stayed apart); a
    set_params on one rank while a non-default bucket is current is named
    (only the module init_optimizer ran on was watched: the ranks drifted
    apart, exit 0); SequentialModule's modules each have a store
    and cannot join, so uneven data is named at the first end of epoch."""
    # the others abort the job
    run = run_pooled if case in ("fit_uneven", "fit_switched") else run_mpi
    proc = run("bucketing.py", 2, case, timeout=120, check=False,
               env={"MXNET_MPI_STALL_ABORT_S": "60"})
    sums = re.findall(r"rank \d CHECKSUM (\S+)", proc.stdout)
    if case in ("fit_uneven", "fit_switched"):
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert len(sums) == 2 and sums[0] == sums[1], proc.stdout
        # fit's default kvstore is ignored after init_optimizer('mpi'): no
        # warning that each rank trains alone
        assert "trains a model of its own" not in proc.stderr, proc.stderr[-3000:]
        return
    assert proc.returncode != 0 and not sums, proc.stdout[-3000:]
    if case == "write_other":
        assert "1 rank(s) wrote weights or optimizer states outside training (" in proc.stderr
    else:
        assert "rank 0 runs #" in proc.stderr and ("'Module.fit: end of epoch (the modules of a "
                                                  "SequentialModule cannot join") in proc.stderr

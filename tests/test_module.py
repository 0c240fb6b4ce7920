"""Module API: Module.fit(kvstore='mpi') keeps ranks identical and matches one
process training on the concatenated batch (gradients averaged over ranks, as
MXNet does for dist_sync in Module)."""


import numpy as np
import pytest
from mpirun import SCRIPTS
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

"""Module.init_optimizer's rescale_grad with our stores equals MXNet's own for
the store of the same kind, measured on MXNet's real ps-lite: dist_sync (and
so mpi, dist_sync_mpi) divides by batch size x workers, dist_async (and so
dist_async_mpi) by the batch size only. The launched probe has no
`import mxnet_mpi`: it also shows the launcher's runner registering the stores."""

import re
import sys

import launching
import pslite
from mpirun import SCRIPTS

PROBE = str(SCRIPTS / "rescale_probe.py")


def rescales(out: str) -> dict:
    found = {}
    for kind, workers, value in re.findall(r"RESCALE (\S+) (\d+) (\S+)", out):
        found.setdefault((kind, int(workers)), set()).add(float(value))
    return found


def test_module_rescale_grad_matches_mxnets_stores():
    mxnet = {}
    for kind in ("dist_sync", "dist_async"):
        with pslite.parameter_server(2) as env:
            outs = pslite.run_workers(PROBE, 2, [kind], env, timeout=120)
        mxnet.update(rescales("".join(out for _, out, _ in outs)))
    assert mxnet[("dist_sync", 2)] == {1 / 16} and mxnet[("dist_async", 2)] == {1 / 8}, mxnet
    # 2 ranks, 2 groups: dist_async_mpi has 2 workers like the ps-lite run above
    proc = launching.run(2, 2, 1, [sys.executable, PROBE, "mpi", "dist_async_mpi"],
                         timeout=120)
    ours = rescales(proc.stdout)
    assert ours[("dist_async_mpi", 2)] == mxnet[("dist_async", 2)], ours
    mpi = [v for (kind, n), v in ours.items() if kind.startswith("mpi") and n == 2]
    assert mpi == [mxnet[("dist_sync", 2)]], ours

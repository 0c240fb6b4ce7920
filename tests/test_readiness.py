"""Randomised readiness under real mpirun: arrays become ready after random,
per-rank delays and in different orders on different ranks; every
collective must still match its peers and give the exact result, with no
hang (run_mpi's timeout turns a hang into a failure).

The default store 'mpi' runs on 2 ranks with 1 engine CPU worker and on 3
with 2; every other registered mode ('mpi_<mode>') once, with 2 workers."""

from __future__ import annotations

import json

import pytest
from pool import run_pooled

import mxnet_mpi

N_KEYS = 200
# Each mode once, on 2 or 3 ranks; the default one with 1 and 2 engine workers.
RUNS = [("mpi", 2, "1"), ("mpi", 3, "2")]
RUNS += [("mpi_" + m, 2 + i % 2, "2") for i, m in
         enumerate(m for m in mxnet_mpi.MODES if m != mxnet_mpi.DEFAULT_MODE)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("store,np_,nthreads", RUNS,
                         ids=["%s-np%d-workers%s" % r for r in RUNS])
def test_random_readiness(store, np_, nthreads, tmp_path):
    seed = 10 * np_ + int(nthreads)
    proc = run_pooled("readiness.py", np_, str(tmp_path), str(N_KEYS), str(seed), timeout=120,
                   env={"MXNET_CPU_WORKER_NTHREADS": nthreads, "MXMPI_TEST_STORE": store})
    for r in range(np_):
        path = tmp_path / ("rank%d.json" % r)
        assert path.exists(), "rank %d wrote no results\n%s" % (r, proc.stdout[-4000:])
        res = json.loads(path.read_text())
        assert res["size"] == np_ and res["n_keys"] == N_KEYS
        sec = res["sections"]["readiness"]
        assert sec["status"] == "OK", "rank %d: %s\n%s" % (
            r, sec["error"], "\n".join(sec["failures"]))
    # every rank did real delaying work, and not the same work as its peers
    dots = [int(line.split()[4]) for line in proc.stdout.splitlines()
            if line.startswith("rank ") and " dots," in line]
    assert len(dots) == np_ and min(dots) > N_KEYS, proc.stdout
    assert len(set(dots)) > 1, proc.stdout

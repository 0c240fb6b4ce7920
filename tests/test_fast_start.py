"""tests/site/sitecustomize.py, the suite's faster MXNet start-up, changes
nothing that a test observes: the operator wrappers it serves from its cache
are the code MXNet compiles, and the modules it loads lazily work."""

from __future__ import annotations

import json

import pytest
from mpirun import SITE, run_single


def result(stdout: str) -> dict:
    [line] = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


@pytest.mark.timeout(120)
def test_cached_wrappers_are_mxnets_own_code():
    run_single("fast_start.py", timeout=100)    # fills the cache if it was empty
    seen = result(run_single("fast_start.py", timeout=100).stdout)
    assert seen["site"] == str(SITE / "sitecustomize.py")
    assert seen["hits"] > 2000, seen["hits"]    # served from the cache
    assert seen["compared"] > 500 and seen["differ"] == [], seen
    assert seen["lazy_at_start"] == ["requests", "scipy.sparse", "scipy.stats"]
    assert seen["cdf0"] == 0.5 and seen["sum"] == 4.0
    assert seen["csr"] == ["csr", [[0.0, 2.0], [3.0, 0.0]]]

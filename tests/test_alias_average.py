"""`out` aliasing `value` (in place when it is the same memory, a clear error
when it overlaps in part, never a hang) and averaging (the store's switch and
MXNET_MPI_AVERAGE, against the sum path; integers refused), on real mpirun ranks in every mode."""

import re

import pytest
from pool import run_pooled

CHECKS = {"out_is_value", "out_same_memory_view", "overlap_is_error", "exact_after_overlap",
          "average_float32", "average_float64", "average_int_refused", "average_env",
          "trainer_average_vs_sum"}


@pytest.mark.parametrize("mode", ["chained", "funneled", "concurrent"])
def test_alias_and_average(mode):
    proc = run_pooled("alias_average.py", 2, mode, timeout=120)
    results = re.findall(r"CHECK (\S+) (ok|FAIL)(.*)", proc.stdout)
    assert {name for name, _, _ in results} == CHECKS, proc.stdout
    failed = [r for r in results if r[1] != "ok"]
    assert not failed, failed
    assert len(results) == 2 * len(CHECKS)   # every check, on both ranks
    assert proc.stdout.count("done") == 2

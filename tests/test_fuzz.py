"""Hypothesis-driven call sequences against a numpy model (see the script)."""

import pytest
from pool import run_pooled


@pytest.mark.parametrize("mode,nranks", [("chained", 2), ("funneled", 2), ("concurrent", 2),
                                         ("funneled", 1)])
def test_fuzzed_calls_match_model(mode, nranks):
    proc = run_pooled("fuzz_store.py", nranks, mode, "150", timeout=240)
    assert proc.stdout.count("FUZZ_OK") == nranks
    assert "150 examples" in proc.stdout

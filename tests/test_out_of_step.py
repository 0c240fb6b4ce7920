"""Issue: silently wrong sums after a caught error, and errors that reach only
one rank. A rank-local failure (bad `out`, dtype change, an engine op that
failed upstream) takes its place in the sequence as a token: every rank gets an
MPIKVStoreError naming the rank and the problem, and the next collectives are
exact. A failed collective never poisons the next one."""

import json

import pytest
from pool import run_pooled

MODES = ["chained", "funneled", "concurrent"]


@pytest.fixture(scope="module", params=MODES)
def records(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("oos") / "rec"
    run_pooled("out_of_step.py", 2, request.param, str(out), timeout=180)
    return [json.loads((out.parent / ("rec.%d" % r)).read_text()) for r in range(2)]


def test_bad_out_on_one_rank_fails_everywhere_then_exact(records):
    r0, r1 = (rec["bad_out"] for rec in records)
    assert r1["step1"][0] == "MPIKVStoreError" and "out 0 of key 'g'" in r1["step1"][1]
    assert r0["step1"][0] == "MPIKVStoreError", r0["step1"]
    assert "rank 1 could not take part" in r0["step1"][1]
    assert "out 0 of key 'g' has shape (5,)" in r0["step1"][1]
    # the engine's error, printed as "MPIKVStoreError: <message>", holds the type once
    assert r0["step1"][1].startswith("mxnet_mpi: rank 1"), r0["step1"][1]
    assert r0["after"] == [True, True] and r1["after"] == [True, True]


def test_dtype_change_on_one_rank_fails_everywhere_then_exact(records):
    r0, r1 = (rec["dtype_change"] for rec in records)
    assert r1["step1"][0] == "MPIKVStoreError" and "first used with" in r1["step1"][1]
    assert r0["step1"][0] == "MPIKVStoreError" and "rank 1 could not take part" in r0["step1"][1]
    assert "float64" in r0["step1"][1]
    assert r0["after"] == [True, True] and r1["after"] == [True, True]


def test_engine_failure_upstream_is_named_on_the_other_rank(records):
    r0, r1 = (rec["engine_failure"] for rec in records)
    # rank 1 gets MXNet's own error from the failed custom op
    assert r1["step1"][0] == "MXNetError" and "custom" in r1["step1"][1].lower()
    assert r0["step1"][0] == "MPIKVStoreError" and "rank 1 could not take part" in r0["step1"][1]
    assert "skipped" in r0["step1"][1]
    assert r0["after"] == [True, True] and r1["after"] == [True, True]


def test_reduction_set_on_one_rank_is_named_then_exact(records):
    for rec in records:
        r = rec["average_on_one_rank"]
        assert r["step1"][0] == "MPIKVStoreError" and "ranks disagree" in r["step1"][1]
        assert "rank 0 runs #" in r["step1"][1] and "(4 elements); rank 1" in r["step1"][1]
        assert "(4 elements, averaged)" in r["step1"][1], r["step1"][1]
        assert r["after"] == ["ok", True]


def test_failed_collective_does_not_poison_the_next(records):
    for rec in records:
        r = rec["failed_then_valid"]
        assert r["first"][0] == "MPIKVStoreError" and "ranks disagree" in r["first"][1]
        assert r["second"] == ["ok", True] and r["third"] == ["ok", True]
        f = rec["free_functions"]
        assert f["first"][0] == "MPIKVStoreError" and f["second"] == ["ok", True]

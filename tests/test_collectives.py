"""Exact collective results on 1, 2 and 3 real MPI ranks, for every dtype.

One mpirun launch per (store, rank count) runs every section of
scripts/collectives_exact.py (importing MXNet costs seconds per launch);
each section is then reported as its own test. The default store 'mpi' runs
on 1, 2 and 3 ranks, and on 2 ranks with MXNet's synchronous NaiveEngine;
every other registered mode ('mpi_<mode>') on 2 and 3 ranks. The default
store also runs on 3 ranks with every allreduce through the
store's own point-to-point allreduce (MXNET_MPI_P2P_BYTES; across hosts by
default), and with the smallest pre-emption budget (MXNET_MPI_PREEMPT_BYTES:
allreduces of one array above 4 KiB move in pieces, one per cycle).
"""

from __future__ import annotations

import json

import pytest
from pool import run_pooled

import mxnet_mpi

RANK_COUNTS = (1, 2, 3)
# (store, ranks, MXNET_ENGINE_TYPE or "" for MXNet's default, or "p2p")
DEFAULT_RUNS = [("mpi", n, "") for n in RANK_COUNTS]
MODE_RUNS = [("mpi_" + m, n, "") for m in mxnet_mpi.MODES if m != mxnet_mpi.DEFAULT_MODE
             for n in (2, 3)]
ALL_RUNS = DEFAULT_RUNS + [("mpi", 2, "NaiveEngine"), ("mpi", 3, "p2p"),
                           ("mpi", 3, "preempt")] + MODE_RUNS

SECTIONS = (
    "world", "pushpull_inplace", "pushpull_out", "pushpull_out_list", "pushpull_devices",
    "key_lists", "repeat_key", "broadcast", "init_pull", "push_pull", "large",
    "views_contexts_keys", "lowlevel",
    "two_stores", "random_bitwise", "rank_order", "integer_wrap", "np_arrays",
    # 0-d and empty legacy arrays through every copy path; per-device mx.np lists
    "legacy_empty_out_list", "legacy_empty_devices", "legacy_empty_broadcast",
    "legacy_empty_init_pull", "legacy_empty_push_pull", "np_devices",
    "barrier",
    "waits",   # the waiting threads' timer slack, after the others' traffic
)


_runs: dict = {}


def results(store: str, np_: int, engine: str, tmp_path_factory) -> list:
    """Per-rank results of one launch (run once, then cached)."""
    if (store, np_, engine) not in _runs:
        out = tmp_path_factory.mktemp("collectives_%s_np%d%s" % (store, np_, engine))
        env = {"MXMPI_TEST_STORE": store}
        if engine == "p2p":
            env["MXNET_MPI_P2P_BYTES"] = "1"
        elif engine == "preempt":   # funneled: every allreduce above 4 KiB in pieces
            env["MXNET_MPI_PREEMPT_BYTES"] = "4096"
        elif engine:
            env["MXNET_ENGINE_TYPE"] = engine
        proc = run_pooled("collectives_exact.py", np_, str(out), timeout=240, env=env)
        ranks = []
        for r in range(np_):
            path = out / ("rank%d.json" % r)
            assert path.exists(), "rank %d wrote no results\n%s" % (r, proc.stdout[-4000:])
            ranks.append(json.loads(path.read_text()))
        _runs[store, np_, engine] = ranks
    return _runs[store, np_, engine]


def assert_section_ok(store: str, np_: int, engine: str, section: str,
                      tmp_path_factory) -> None:
    ranks = results(store, np_, engine, tmp_path_factory)
    problems = []
    for res in ranks:
        assert res["size"] == np_
        got = res["sections"].get(section)
        assert got is not None, "rank %d did not run section %s" % (res["rank"], section)
        if got["status"] != "OK":
            problems.append("rank %d: %s %s (%d mismatches)" % (
                res["rank"], got["error"] or "", got["failures"][:5], got["n_failures"]))
    assert not problems, "section %s of %s on %d ranks %s:\n%s" % (
        section, store, np_, engine, "\n".join(problems))


def run_id(run) -> str:
    return "%s-np%d" % run[:2] + ("-" + run[2] if run[2] else "")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize("run", ALL_RUNS, ids=run_id)
def test_collective_section(run, section, tmp_path_factory):
    assert_section_ok(*run, section, tmp_path_factory)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("run", ALL_RUNS, ids=run_id)
def test_every_rank_ran_every_section(run, tmp_path_factory):
    ranks = results(*run, tmp_path_factory)
    assert sorted(r["rank"] for r in ranks) == list(range(run[1]))
    wanted = set(SECTIONS)
    for res in ranks:
        assert set(res["sections"]) == wanted
    # the run's setting reached every rank's store
    if run[2] == "p2p":
        assert all(r["p2p_bytes"] == 1 for r in ranks), [r["p2p_bytes"] for r in ranks]
    elif run[2] == "preempt":
        assert all(r["preempt_bytes"] == 4096 for r in ranks), ranks[0]["preempt_bytes"]
    else:   # one host: MPI's own collectives, no point-to-point route
        assert all(r["p2p_bytes"] == 0 for r in ranks), [r["p2p_bytes"] for r in ranks]
    # a section fails or passes alike on every rank: no rank saw other inputs
    for section in wanted:
        statuses = {r["sections"][section]["status"] for r in ranks}
        errors = {r["sections"][section]["error"] for r in ranks}
        assert len(statuses) == 1 and len(errors) == 1, (section, statuses, errors)


@pytest.mark.timeout(300)
def test_point_to_point_sums_fold_in_rank_order_on_four_ranks(tmp_path):
    """On 4 ranks MPI's allreduce folds a tiny array in another order than
    the point-to-point route's rank order (the last bit differs): arrays of
    fewer elements than ranks are folded in rank order too, so an array gets
    the same bits alone or fused (the section's check at 3 ranks cannot see
    it: there MPI's order is the rank order)."""
    run_pooled("collectives_exact.py", 4, str(tmp_path), "rank_order", timeout=240,
               env={"MXMPI_TEST_STORE": "mpi", "MXNET_MPI_P2P_BYTES": "1"})
    for r in range(4):
        got = json.loads((tmp_path / ("rank%d.json" % r)).read_text())
        assert got["p2p_bytes"] == 1, got
        assert got["sections"]["rank_order"]["status"] == "OK", got["sections"]


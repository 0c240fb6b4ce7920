"""mxnet_mpi.ops (allreduce, grouped allreduce, broadcast, allgather with uneven
first dimensions, alltoall with splits, reduce_scatter, fp16 compression) on
real ranks in every mode and on the free functions' stream, exact against
numpy; mismatches across ranks and bad input on one rank are errors on every
rank, and the stream stays exact afterwards."""

import re

import pytest
from pool import run_pooled


def checks(out: str) -> list:
    return re.findall(r"CHECK (\S+) (ok|FAIL)(.*)", out)


@pytest.mark.parametrize("store,np_,p2p", [("free", 3, False), ("chained", 2, False),
                                           ("funneled", 3, False), ("concurrent", 2, False),
                                           ("funneled", 3, True)])
def test_ops_exact(store, np_, p2p):
    """p2p: every allreduce through the stores' point-to-point route (across
    hosts by default), fp16 compression's exchanges included."""
    env = {"MXNET_MPI_P2P_BYTES": "1"} if p2p else None
    proc = run_pooled("ops_exact.py", np_, store, timeout=120, env=env)
    found = checks(proc.stdout)
    expected = 27 + (5 if store != "free" else 0)
    assert len(found) == np_ * expected, proc.stdout
    assert not [c for c in found if c[1] != "ok"], [c for c in found if c[1] != "ok"]
    assert proc.stdout.count("done") == np_
    if store != "free":   # the run's threshold reached every rank's store (one host: off)
        assert re.findall(r"P2P_BYTES (\d+)", proc.stdout) == ["1" if p2p else "0"] * np_


@pytest.mark.parametrize("store,np_", [("chained", 2), ("concurrent", 3)])
def test_mismatches_fail_on_every_rank(store, np_):
    proc = run_pooled("ops_exact.py", np_, store, "mismatch", timeout=120)
    found = checks(proc.stdout)
    assert len(found) == np_ * 7, proc.stdout
    assert not [c for c in found if c[1] != "ok"], [c for c in found if c[1] != "ok"]
    # the rank with bad input raises its reason; its peers name it
    assert "rank %d could not take part" % (np_ - 1) in proc.stdout
    assert "ranks disagree on a collective" in proc.stdout
    # each rank's broadcast root is shown (the descriptions were identical)
    roots = [c[2] for c in found if c[0] == "broadcast_root_differs"]
    assert all("from root 0" in d and "from root %d" % (np_ - 1) in d for d in roots), roots

"""MXNET_MPI_TIMELINE writes a valid Chrome trace per rank, one event per
collective, mergeable with MXNet's profiler output."""

import json

import pytest
from mpirun import run_mpi

from mxnet_mpi.timeline import merge, rank_path


@pytest.mark.parametrize("mode", ["chained", "funneled", "concurrent"])
def test_timeline_one_event_per_collective(tmp_path, mode):
    trace = str(tmp_path / "trace.json")
    prof = str(tmp_path / "mxprof%d.json")
    run_mpi("timeline_run.py", 2, mode, prof, env={"MXNET_MPI_TIMELINE": trace})
    for rank in range(2):
        path = rank_path(trace, rank)
        with open(path) as f:
            data = json.load(f)
        events = data["traceEvents"]
        coll = [e for e in events if e.get("cat") == "collective"]
        # 20 pushpulls + 1 broadcast by the script, in every mode
        assert len(coll) == 21
        assert sum(e["name"].startswith("allreduce key=3 shape=(400,)") for e in coll) == 4
        for e in coll:
            a = e["args"]
            assert e["ph"] == "X" and e["dur"] >= 0 and a["ok"] is True
            assert a["enqueue_us"] <= a["ready_us"] <= a["start_us"] <= a["end_us"]
        assert any(e.get("ph") == "M" and "rank %d" % rank in e["args"]["name"]
                   for e in events)
        merged = tmp_path / ("merged%d.json" % rank)
        merge([path, prof % rank], str(merged))
        with open(merged) as f:
            all_events = json.load(f)["traceEvents"]
        with open(prof % rank) as f:
            theirs = json.load(f)["traceEvents"]
        assert len(all_events) == len(events) + len(theirs)
        # one time axis: MXNet's events and ours overlap in time
        mx_ts = [e["ts"] for e in theirs if "ts" in e]
        assert min(mx_ts) <= min(e["ts"] for e in coll) <= max(mx_ts)

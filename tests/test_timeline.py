"""MXNET_MPI_TIMELINE writes a valid Chrome trace per rank, one event per
collective, mergeable with MXNet's profiler output."""

import json
import re

import pytest
from mpirun import run_mpi

from mxnet_mpi.timeline import merge, rank_path

MODES = ["chained", "funneled", "concurrent"]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """One 2-rank job (the trace is written when MPI is finalised), every mode
    in turn on its own store and keys."""
    tmp = tmp_path_factory.mktemp("timeline")
    trace, prof = str(tmp / "trace.json"), str(tmp / "mxprof%d.json")
    run_mpi("timeline_run.py", 2, ",".join(MODES), prof, env={"MXNET_MPI_TIMELINE": trace})
    return tmp, trace, prof


def key_of(event: dict) -> str:
    m = re.match(r"(?:allreduce|broadcast) key='?(\w+)'?", event["name"])
    assert m, event["name"]
    return m.group(1)


@pytest.mark.parametrize("m,mode", list(enumerate(MODES)))
def test_timeline_one_event_per_collective(traces, m, mode):
    tmp, trace, prof = traces
    mine = {str(10 * m + i) for i in range(5)} | {"b%d" % m}
    for rank in range(2):
        path = rank_path(trace, rank)
        with open(path) as f:
            data = json.load(f)
        events = data["traceEvents"]
        every = [e for e in events if e.get("cat") == "collective"]
        assert len(every) == 21 * len(MODES)
        coll = [e for e in every if key_of(e) in mine]
        # 20 pushpulls + 1 broadcast by the script, in every mode
        assert len(coll) == 21
        assert sum(e["name"].startswith("allreduce key=%d shape=(400,)" % (10 * m + 3))
                   for e in coll) == 4
        assert sum(e["name"].startswith("broadcast key='b%d'" % m) for e in coll) == 1, \
            [e["name"] for e in coll]
        for e in coll:
            a = e["args"]
            assert e["ph"] == "X" and e["dur"] >= 0 and a["ok"] is True
            assert a["enqueue_us"] <= a["ready_us"] <= a["start_us"] <= a["end_us"]
        assert any(e.get("ph") == "M" and "rank %d" % rank in e["args"]["name"]
                   for e in events)
        merged = tmp / ("merged%d.json" % rank)
        merge([path, prof % rank], str(merged))
        with open(merged) as f:
            all_events = json.load(f)["traceEvents"]
        with open(prof % rank) as f:
            theirs = json.load(f)["traceEvents"]
        assert len(all_events) == len(events) + len(theirs)
        # one time axis: MXNet's events and ours overlap in time
        mx_ts = [e["ts"] for e in theirs if "ts" in e]
        assert min(mx_ts) <= min(e["ts"] for e in coll) <= max(mx_ts)


def test_fusion_off_moves_every_allreduce_alone(tmp_path):
    """MXNET_MPI_FUSION_BYTES=0 means no fusion in every mode that fuses
    (concurrent's small lane fused up to MXNET_MPI_SMALL_BYTES anyway): 40
    small allreduces ready together start 40 times. The count sees fusion:
    on the build before, concurrent's started 3 times. (With the default,
    how many share a start depends on timing: not asserted.)"""
    trace = str(tmp_path / "fusion.json")
    proc = run_mpi("fusion_run.py", 2, "funneled,concurrent", env={"MXNET_MPI_TIMELINE": trace})
    assert proc.stdout.count("exact True") == 8, proc.stdout
    with open(rank_path(trace, 0)) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "collective"]
    for mode in ("f", "c"):
        starts = {}
        for fusion in ("1048576", "0"):
            mine = [e for e in events if e["name"].startswith("allreduce")
                    and key_of(e).startswith("%s%sk" % (mode, fusion))]
            assert len(mine) == 40, (mode, fusion, len(mine))
            starts[fusion] = len({e["args"]["start_us"] for e in mine})
        assert starts["0"] == 40, (mode, starts)


def test_rank_path_of_a_file_a_pattern_and_a_directory(tmp_path):
    """A directory (existing, or a path ending in '/') gets one file per rank
    inside it; it used to give '<dir>.rank0.json' beside it."""
    assert rank_path("/x/trace.json", 3) == "/x/trace.rank3.json"
    assert rank_path("/x/t-{rank}.json", 3) == "/x/t-3.json"
    assert rank_path("/x/traces/", 1) == "/x/traces/trace.rank1.json"
    assert rank_path(str(tmp_path), 0) == str(tmp_path / "trace.rank0.json")


def test_a_timeline_that_cannot_be_written_is_said_at_the_start(tmp_path):
    """A timeline path under a file: the job ran to its end and only then
    said it could not write the trace (exit 0). Each rank now warns when MPI
    starts, naming its file and why; training goes on."""
    from mxnet_mpi.timeline import unwritable
    afile = tmp_path / "afile"
    afile.write_text("")
    assert unwritable(str(afile / "trace.rank0.json")) == "%s is not a directory" % afile
    assert unwritable(str(tmp_path)) == "%s is a directory" % tmp_path
    assert unwritable(str(tmp_path / "new" / "deeper" / "t.json")) is None
    assert unwritable(str(afile)) is None
    script = tmp_path / "one_step.py"
    script.write_text("import mxnet as mx\nimport mxnet_mpi  # noqa: F401\n"
                      "kv = mx.kv.create('mpi')\na = mx.nd.ones(3)\nkv.pushpull(0, a)\n"
                      "print('SUM', a.asnumpy().tolist(), flush=True)\n")
    proc = run_mpi(script, 2, env={"MXNET_MPI_TIMELINE": str(afile / "trace.json")})
    assert proc.stdout.count("SUM [2.0, 2.0, 2.0]") == 2, proc.stdout
    for rank in range(2):
        assert "rank %d cannot write its timeline to %s (%s is not a directory)" % (
            rank, afile / ("trace.rank%d.json" % rank), afile) in proc.stderr, proc.stderr

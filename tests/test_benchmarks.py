"""benchmarks/allreduce.py --quick runs every contender and reports every size;
benchmarks/epoch_time.py runs end to end on a tiny configuration; overlap.py's
steady step reads the timeline as its doc says.

Each contender checks one allreduce result before timing (a wrong sum fails
the run), so a complete CSV also means every store summed correctly.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys

from mpirun import MPIRUN, ROOT, mpi_env

QUICK_SIZES = {4 << 10, 64 << 10, 1 << 20}


def horovod_installed() -> bool:
    return importlib.util.find_spec("horovod") is not None


def test_allreduce_quick_csv_complete(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "allreduce.py"), "--quick",
                           "--outdir", str(tmp_path)], env=mpi_env(), cwd=str(ROOT),
                          capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    print(proc.stdout[proc.stdout.find("allreduce of float32"):])
    with open(tmp_path / "allreduce.csv") as f:
        rows = list(csv.DictReader(f))
    stores = {"mpi_chained", "mpi_funneled", "mpi_concurrent", "mpi4py", "dist_sync"}
    if horovod_installed():
        stores.add("horovod")
    got = {(int(r["bytes"]), r["store"]) for r in rows}
    assert got == {(b, s) for b in QUICK_SIZES for s in stores}
    assert len(rows) == len(got)   # one row per (size, store)
    for r in rows:
        assert int(r["ranks"]) == 2 and int(r["reps"]) >= 1
        assert float(r["time_us"]) > 0 and float(r["busbw_GBps"]) > 0
        assert r["vs_mpi4py"] != ""          # every row has the raw-MPI reference
        assert (r["vs_horovod"] != "") == horovod_installed()
    assert (tmp_path / "allreduce.png").stat().st_size > 0
    assert "horovod is not installed" in proc.stdout or horovod_installed()


def test_epoch_time_smoke(tmp_path):
    """benchmarks/epoch_time.py end to end on a tiny configuration: a row per
    (kvstore, ranks) with throughput, projection and scaling efficiency."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "epoch_time.py"),
                           "--ranks", "2", "--stores", "single,mpi_chained,dist_sync",
                           "--steps", "3", "--timing-skip", "1", "--image-size", "32",
                           "--batch", "4", "--classes", "10", "--outdir", str(tmp_path)],
                          env=mpi_env(), cwd=str(ROOT), capture_output=True, text=True,
                          timeout=420)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    print(proc.stdout[proc.stdout.find("resnet18_v1"):])
    assert "PROJECTION" in proc.stdout
    with open(tmp_path / "epoch_time.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["store"], int(r["ranks"])) for r in rows] == [
        ("single", 1), ("mpi_chained", 2), ("dist_sync", 2)]
    for r in rows:
        ips = float(r["images_per_sec"])
        assert ips > 0 and int(r["timed_steps"]) == 2
        assert abs(float(r["projected_imagenet_epoch_h"]) * 3600 * ips - 1281167) < 1
        assert abs(float(r["scaling_efficiency"]) * int(r["ranks"]) * float(rows[0][
            "images_per_sec"]) - ips) < 1e-6 * ips
    assert (tmp_path / "epoch_time.png").stat().st_size > 0


def test_steady_step_is_the_median_gap_between_ends_of_backward_within_each_run(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from overlap import collectives, steady_steps
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    def probe(enqueue_us, ready_us, key="probe"):
        return {"cat": "collective", "name": "allreduce key='%s' shape=(1,)" % key,
                "args": {"enqueue_us": enqueue_us, "ready_us": ready_us}}
    # two timed runs of one config: ends of backward 100 ms apart, then 300
    # (the gap between the runs, 5 s, is no step); another key is no probe
    events = [probe(0, 10_000), probe(1_000, 110_000), probe(2_000, 210_000),
              probe(3_000, 100_000, key="g0"),
              probe(5_000_000, 5_010_000), probe(5_001_000, 5_310_000),
              probe(9_000_000, 9_010_000), probe(9_001_000, 9_050_000)]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    windows = {"funneled": [(0, 3_000), (5_000_000, 5_002_000)],
               "baseline": [(9_000_000, 9_000_500)]}
    got = steady_steps(collectives(str(trace)), windows)
    assert got == {"funneled": 0.1}   # median of 0.1, 0.1, 0.3 s; one probe: none


def test_linkcheck_store_probe_and_transport_reading(tmp_path):
    """linkcheck's store probe (the transport sweep's store rows) on one host:
    the default store's allreduce of a model's gradients, checked, timed, with
    both ranks' CPU/wall; the report's reading of a sweep names the spread of
    the candidates added to btl_tcp_links=4 against that setting alone."""
    out = tmp_path / "store.json"
    proc = subprocess.run([MPIRUN, "-np", "2", "--oversubscribe", sys.executable,
                           str(ROOT / "benchmarks" / "linkcheck.py"), "--store-probe",
                           "mobilenet0.25", "--reps", "2", "--out", str(out)],
                          env=mpi_env(), cwd=str(ROOT), capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    got = json.loads(out.read_text())
    assert got["store_ms"] > 0 and 0 < got["store_cpu_per_wall"] < 2.5
    assert got["arrays"] > 50 and got["store_bytes"] > 500_000
    assert got["p2p_bytes"] == 0   # one host: MPI's own allreduce over shared memory

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import report
    rows = [{"settings": s, "link_gbit": 2.0, "store_vs_wire": v, "store_cpu_per_wall": c}
            for s, v, c in [("defaults", 1.5, 0.3), ("btl_tcp_links=4", 1.2, 0.25),
                            ("links=4, btl_tcp_eager_limit=1 MiB", 1.3, 0.2),
                            ("links=4, ring allreduce", 1.1, 0.4)]]
    assert report.transport_reading(rows) == (
        "With each of the other candidates added to `btl_tcp_links=4`, the store's allreduce "
        "took at 2 Gbit/s 1.10x-1.30x the wire time at 0.20-0.40 of a core "
        "(`btl_tcp_links=4` alone: 1.20x at 0.25).")
    assert report.transport_label("links=4, btl_tcp_eager_limit=1 MiB") == (
        "`btl_tcp_links=4`, `btl_tcp_eager_limit=1 MiB`")

"""What MPI's start costs a job, with and without mxnet_mpi's transport defaults.

Each run is one ``mpirun -np N python startup.py --child`` job: every rank
imports mxnet and mxnet_mpi (the defaults apply at import), then times the
first ``mx.kv.create('mpi')``, which initialises MPI. Runs alternate between
``MXNET_MPI_TRANSPORT_DEFAULTS=0`` and the defaults, so load drifts hit both
alike. Reported per setting and rank count: the median over runs of the
slowest rank's store creation, its CPU time, and the whole job's wall time.

Writes startup_mpi.csv (+ note) in --outdir; prints the table.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from meta import write_meta  # benchmarks/, the script's folder

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SETTINGS = {"defaults off": "0", "mxnet_mpi defaults": "1"}


def child() -> None:
    import resource

    import mxnet as mx

    from mxnet_mpi import transport

    t0, c0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    kv = mx.kv.create("mpi")
    t1, c1 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    cpu = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)
    print("STARTUP " + json.dumps({"rank": kv.rank, "init_s": t1 - t0, "cpu_s": cpu,
                                   "transport": transport.describe()}), flush=True)


def one_job(np_: int, defaults: str) -> dict:
    env = dict(os.environ, MXNET_MPI_TRANSPORT_DEFAULTS=defaults, OMP_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if defaults == "0":   # what this process's own import of mxnet_mpi may have set
        for name in ("OMPI_MCA_btl", "OMPI_MCA_btl_tcp_links"):
            env.pop(name, None)
    mpirun = str(Path(sys.executable).parent / "mpirun")
    cmd = [mpirun, "-np", str(np_), "--oversubscribe", sys.executable, __file__, "--child"]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True,
                          timeout=300)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit("job failed (%d):\n%s\n%s" % (proc.returncode, proc.stdout[-3000:],
                                                       proc.stderr[-3000:]))
    ranks = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
             if line.startswith("STARTUP ")]
    assert len(ranks) == np_, proc.stdout
    return {"init_s": max(r["init_s"] for r in ranks), "cpu_s": max(r["cpu_s"] for r in ranks),
            "job_s": wall, "transport": ranks[0]["transport"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ranks", default="1,2", help="rank counts (comma-separated)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="2 rounds")
    p.add_argument("--outdir", default=str(HERE / "results"))
    args = p.parse_args()
    if args.child:
        child()
        return
    rounds = 2 if args.quick else args.rounds
    ranks = [int(n) for n in args.ranks.split(",")]
    got: dict = {(s, n): [] for s in SETTINGS for n in ranks}
    for _ in range(rounds):
        for n in ranks:
            for name, value in SETTINGS.items():
                got[name, n].append(one_job(n, value))
    rows = []
    for (name, n), runs in got.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("init_s", "cpu_s", "job_s")}
        rows.append({"settings": name, "transport": runs[0]["transport"], "ranks": n,
                     "rounds": len(runs), "init_ms": round(med["init_s"] * 1e3, 1),
                     "init_cpu_ms": round(med["cpu_s"] * 1e3, 1),
                     "job_s": round(med["job_s"], 2)})
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / "startup_mpi.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    write_meta(path, rounds=rounds, ranks=args.ranks)
    print("%-20s %-55s %5s %10s %12s %8s" % ("settings", "transport", "ranks", "init ms",
                                            "init CPU ms", "job s"))
    for r in rows:
        print("%-20s %-55s %5d %10.1f %12.1f %8.2f" % (
            r["settings"], r["transport"], r["ranks"], r["init_ms"], r["init_cpu_ms"],
            r["job_s"]))
    print("wrote", path)


if __name__ == "__main__":
    main()

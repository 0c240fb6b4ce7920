"""Allreduce time and bus bandwidth: our modes vs raw MPI, ps-lite and Horovod.

    .venv/bin/python benchmarks/allreduce.py [--np 2] [--quick]

Run without mpirun, it launches one job per contender, prints a table and
writes benchmarks/results/allreduce.csv and allreduce.png. Float32 messages
from 4 KB to 256 MB (--quick: 4 KB, 64 KB and 1 MB, few repetitions):

  mpi_<mode>   our store's in-place kv.pushpull(key, x) (what Trainer issues),
               one mpirun job for the three modes; `reps` calls queued, then
               mx.nd.waitall()
  mpi4py       raw MPI: comm.Allreduce(MPI.IN_PLACE, x) on a numpy buffer, in
               its own mpirun job (the reference)
  dist_sync    MXNet's parameter server (ps-lite): kv.push(key, x) then
               kv.pull(key, out=x); a scheduler, one server and --np workers
               started with DMLC_* variables, not under mpirun
  horovod      Horovod's in-place hvd.allreduce_(x, op=hvd.Sum) under mpirun,
               if horovod is importable (benchmarks/setup_horovod.sh); its
               cycle time is HOROVOD_CYCLE_TIME (ms, default 1)

Every contender does the same thing, x <- sum over ranks of x, in place. It
first checks one sum (x = rank + 1 everywhere), so a wrong answer fails the
run, then times repeated sums of x = 0 (no overflow). In place on purpose:
MXNet 1.9.1's dist kvstore on CPU aliases its send buffer to the pushed
array, so kv.pull(key, out=y) after kv.push(key, x) also overwrites x and the
next push sends the previous sum.

time = wall time per collective on rank 0, after a barrier; bus bandwidth =
2(n-1)/n * bytes / time (NCCL's convention: the bytes each link carries in a
ring allreduce). `vs_mpi4py` and `vs_horovod` are time ratios (the row's
time divided by theirs: < 1 is faster than them).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from meta import write_meta  # benchmarks/, the script's folder

from mxnet_mpi.launch import parameter_server

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODES = ("chained", "concurrent", "funneled")
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20,
         256 << 20]
QUICK_SIZES = [4 << 10, 64 << 10, 1 << 20]


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2, help="ranks (workers for dist_sync)")
    ap.add_argument("--quick", action="store_true", help="3 small sizes, few repetitions")
    ap.add_argument("--sizes", help="comma-separated byte counts (overrides the default list)")
    ap.add_argument("--stores", default="ours,mpi4py,dist_sync,horovod",
                    help="contenders to run (horovod is skipped when not installed)")
    ap.add_argument("--outdir", default=str(HERE / "results"))
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per job")
    ap.add_argument("--worker", help=argparse.SUPPRESS)       # set by the driver
    ap.add_argument("--worker-json", help=argparse.SUPPRESS)
    return ap.parse_args()


def plan(args) -> list:
    """[(bytes, warmup, reps)]: enough repetitions for small messages, few for big ones."""
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else \
        (QUICK_SIZES if args.quick else SIZES)
    out = []
    for b in sizes:
        if args.quick:
            out.append((b, 1, 5))
        else:
            out.append((b, 2 if b < (64 << 20) else 1,
                        max(5, min(200, int((512 << 20) / b)))))
    return out


# ----------------------------------------------------------------- workers
def _check(name: str, got, expect: float, nbytes: int) -> None:
    import numpy as np
    if not np.all(got == expect):
        raise SystemExit("%s: wrong allreduce result at %d bytes: expected %s, got %s"
                         % (name, nbytes, expect, np.unique(got)[:5]))


def worker_ours(args) -> dict:
    import mxnet as mx

    import mxnet_mpi
    rank, size = mxnet_mpi.rank(), mxnet_mpi.size()
    results = {}
    for mode in MODES:
        kv = mx.kv.create("mpi_" + mode)   # created when its turn comes
        rows = []
        for nbytes, warmup, reps in plan(args):
            n, key = nbytes // 4, "ar%d" % nbytes
            x = mx.nd.full((n,), rank + 1.0)
            kv.pushpull(key, x)
            _check("mpi_" + mode, x.asnumpy(), size * (size + 1) / 2, nbytes)
            x = mx.nd.zeros((n,))
            for _ in range(warmup):
                kv.pushpull(key, x)
            kv.pushpull("barrier", mx.nd.zeros((1,)))
            mx.nd.waitall()
            t0 = time.perf_counter()
            for _ in range(reps):
                kv.pushpull(key, x)
            mx.nd.waitall()
            rows.append({"bytes": nbytes, "reps": reps,
                         "time_s": (time.perf_counter() - t0) / reps})
        results["mpi_" + mode] = rows
    return {"rank": rank, "ranks": size, "results": results}


def worker_mpi4py(args) -> dict:
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rows = []
    for nbytes, warmup, reps in plan(args):
        x = np.full(nbytes // 4, comm.rank + 1.0, dtype=np.float32)
        comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        _check("mpi4py", x, comm.size * (comm.size + 1) / 2, nbytes)
        x[:] = 0
        for _ in range(warmup):
            comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        rows.append({"bytes": nbytes, "reps": reps, "time_s": (time.perf_counter() - t0) / reps})
    return {"rank": comm.rank, "ranks": comm.size, "results": {"mpi4py": rows}}


def worker_horovod(args) -> dict:
    import horovod.mxnet as hvd
    import mxnet as mx
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    rows = []
    for nbytes, warmup, reps in plan(args):
        n, name = nbytes // 4, "ar%d" % nbytes
        x = mx.nd.full((n,), rank + 1.0)
        hvd.allreduce_(x, op=hvd.Sum, name=name)
        _check("horovod", x.asnumpy(), size * (size + 1) / 2, nbytes)
        x = mx.nd.zeros((n,))
        for _ in range(warmup):
            hvd.allreduce_(x, op=hvd.Sum, name=name)
        hvd.allreduce_(mx.nd.zeros((1,)), op=hvd.Sum, name="barrier")
        mx.nd.waitall()
        t0 = time.perf_counter()
        for _ in range(reps):
            hvd.allreduce_(x, op=hvd.Sum, name=name)
        mx.nd.waitall()
        rows.append({"bytes": nbytes, "reps": reps, "time_s": (time.perf_counter() - t0) / reps})
    return {"rank": rank, "ranks": size, "results": {"horovod": rows},
            "cycle_time_ms": os.environ.get("HOROVOD_CYCLE_TIME", "1 (the default)")}


def worker_dist_sync(args) -> dict:
    import mxnet as mx
    kv = mx.kv.create("dist_sync")
    rank, size = kv.rank, kv.num_workers
    rows = []
    for i, (nbytes, warmup, reps) in enumerate(plan(args)):
        n = nbytes // 4
        kv.init(i, mx.nd.zeros((n,)))
        x = mx.nd.full((n,), rank + 1.0)
        kv.push(i, x)
        kv.pull(i, out=x)
        _check("dist_sync", x.asnumpy(), size * (size + 1) / 2, nbytes)
        x = mx.nd.zeros((n,))
        for _ in range(warmup):
            kv.push(i, x)
            kv.pull(i, out=x)
        mx.nd.waitall()
        kv._barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            kv.push(i, x)
            kv.pull(i, out=x)
        mx.nd.waitall()
        rows.append({"bytes": nbytes, "reps": reps, "time_s": (time.perf_counter() - t0) / reps})
    return {"rank": rank, "ranks": size, "results": {"dist_sync": rows}}


WORKERS = {"ours": worker_ours, "mpi4py": worker_mpi4py, "horovod": worker_horovod,
           "dist_sync": worker_dist_sync}


def worker(args) -> None:
    res = WORKERS[args.worker](args)
    if res["rank"] == 0:
        with open(args.worker_json, "w") as f:
            json.dump(res, f)


# ----------------------------------------------------------------- driver
def base_env() -> dict:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def worker_args(args, kind: str, out_json: Path) -> list:
    extra = ["--quick"] if args.quick else []
    if args.sizes:
        extra += ["--sizes", args.sizes]
    return [sys.executable, __file__, "--worker", kind, "--worker-json", str(out_json), *extra]


def run_group(cmds: list, env_list: list, timeout: float) -> None:
    """Run processes together; kill them all (own process groups) on failure/timeout."""
    procs = [subprocess.Popen(c, env=e, cwd=str(ROOT), start_new_session=True)
             for c, e in zip(cmds, env_list)]
    try:
        deadline = time.time() + timeout
        for p in procs:
            rc = p.wait(timeout=max(1, deadline - time.time()))
            if rc != 0:
                raise SystemExit("%s exited %d" % (" ".join(p.args[:6]), rc))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def run_mpi_job(args, kind: str, out_json: Path) -> None:
    mpirun = str(Path(sys.executable).parent / "mpirun")
    cmd = [mpirun, "-np", str(args.np), "--oversubscribe", *worker_args(args, kind, out_json)]
    print("running:", " ".join(cmd), flush=True)
    run_group([cmd], [base_env()], args.timeout)


def run_dist_sync(args, out_json: Path) -> None:
    print("running: ps-lite scheduler + 1 server + %d dist_sync workers" % args.np, flush=True)
    with parameter_server(args.np, env=base_env(), cwd=str(ROOT)) as env:
        cmd = worker_args(args, "dist_sync", out_json)
        run_group([cmd] * args.np, [env] * args.np, args.timeout)


def horovod_available() -> bool:
    return importlib.util.find_spec("horovod") is not None and \
        importlib.util.find_spec("horovod.mxnet") is not None


def drive(args) -> None:
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    wanted = args.stores.split(",")
    measured, meta = {}, {"ranks": args.np}
    for kind in ("ours", "mpi4py", "dist_sync", "horovod"):
        if kind not in wanted:
            continue
        if kind == "horovod" and not horovod_available():
            print("horovod is not installed: no horovod rows (benchmarks/setup_horovod.sh)",
                  flush=True)
            continue
        out_json = outdir / ("allreduce_%s.json" % kind)
        if out_json.exists():
            out_json.unlink()
        if kind == "dist_sync":
            run_dist_sync(args, out_json)
        else:
            run_mpi_job(args, kind, out_json)
        res = json.loads(out_json.read_text())
        measured.update(res["results"])
        if "cycle_time_ms" in res:
            meta["horovod_cycle_time_ms"] = res["cycle_time_ms"]
    rows = make_rows(measured, args.np)
    write_outputs(rows, outdir, meta, args)


def make_rows(measured: dict, n: int) -> list:
    ref = {r["bytes"]: r["time_s"] for r in measured.get("mpi4py", [])}
    hvd = {r["bytes"]: r["time_s"] for r in measured.get("horovod", [])}
    rows = []
    for store, results in measured.items():
        for r in results:
            t, b = r["time_s"], r["bytes"]
            rows.append({
                "store": store, "bytes": b, "ranks": n, "reps": r["reps"],
                "time_us": t * 1e6,
                "busbw_GBps": 2 * (n - 1) / n * b / t / 1e9,
                "vs_mpi4py": t / ref[b] if b in ref else "",
                "vs_horovod": t / hvd[b] if b in hvd else "",
            })
    order = ["mpi_" + m for m in MODES] + ["mpi4py", "horovod", "dist_sync"]
    rows.sort(key=lambda r: (r["bytes"], order.index(r["store"])
                             if r["store"] in order else len(order)))
    return rows


def human(nbytes: int) -> str:
    for unit, div in (("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= div:
            return "%d %s" % (nbytes // div, unit)
    return "%d B" % nbytes


def write_outputs(rows: list, outdir: Path, meta: dict, args) -> None:
    with open(outdir / "allreduce.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    write_meta(outdir / "allreduce.csv", quick=args.quick)
    fmt = "%-9s %-15s %12s %11s %10s %11s"
    print("\nallreduce of float32, %d ranks on %d cores%s; time per collective on rank 0"
          % (meta["ranks"], os.cpu_count() or 0,
             "" if "horovod_cycle_time_ms" not in meta
             else "; HOROVOD_CYCLE_TIME=%s ms" % meta["horovod_cycle_time_ms"]))
    print(fmt % ("size", "store", "time (us)", "busbw GB/s", "vs mpi4py", "vs horovod"))
    for r in rows:
        print(fmt % (human(r["bytes"]), r["store"], "%.1f" % r["time_us"],
                     "%.3f" % r["busbw_GBps"],
                     "" if r["vs_mpi4py"] == "" else "%.2fx" % r["vs_mpi4py"],
                     "" if r["vs_horovod"] == "" else "%.2fx" % r["vs_horovod"]))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for store in sorted({r["store"] for r in rows}):
        mine = [r for r in rows if r["store"] == store]
        xs = [r["bytes"] for r in mine]
        style = "-o" if store.startswith("mpi_") else "--s"
        ax1.plot(xs, [r["time_us"] for r in mine], style, label=store, markersize=4)
        ax2.plot(xs, [r["busbw_GBps"] for r in mine], style, label=store, markersize=4)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    ax1.set_yscale("log")
    ax1.set_ylabel("time per allreduce (us, lower is better)")
    ax2.set_ylabel("bus bandwidth (GB/s, higher is better)")
    ax1.legend(fontsize=8)
    fig.suptitle("allreduce, %d ranks%s" % (meta["ranks"], "" if "horovod_cycle_time_ms"
                 not in meta else " (Horovod cycle %s ms)" % meta["horovod_cycle_time_ms"]))
    fig.tight_layout()
    fig.savefig(outdir / "allreduce.png", dpi=110)
    plt.close(fig)
    print("\nwrote %s and %s" % (outdir / "allreduce.csv", outdir / "allreduce.png"))


if __name__ == "__main__":
    a = parse()
    if a.worker:
        worker(a)
    else:
        drive(a)

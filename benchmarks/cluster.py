"""Overlap and scaling on a cluster in a box: 2 hosts x 1 rank over shaped links.

    .venv/bin/python benchmarks/cluster.py [--quick] [--outdir benchmarks/results]

Needs root (network namespaces, see mxnet_mpi/testing/netns.py). Three
"hosts" share one bridge: ranks on hosts 0 and 1, the ps-lite scheduler and
server on host 2; every host's link is shaped with tbf to the same rate, so a
transfer takes wall time without taking CPU (unlike loopback).

1. Calibrate on an unshaped link: compute time per step and gradient bytes.
2. Pick link rates so that communication is about 0.5x, 1x and 2x compute:
   rate = grad_bits / (k x compute) for k in 0.5, 1, 2 (a 2-rank ring
   allreduce moves the gradient bytes once each way over each link).
3. Per rate, on a gluoncv model (resnet18_v1 with --quick, resnet50_v1b
   otherwise), the rows of benchmarks/overlap.py's worker, run by the cluster's
   mpirun: compute only; comm only (the default mode's allreduce of the
   gradients, no compute); no overlap (backward, wait, then allreduce); each
   mode (``mpi`` = the default mode, ``mpi_<mode>`` the others); ``mpi fp16``
   (the default mode with fp16 gradient compression: half the bytes on the
   wire, its comm-only time in the note); Horovod 0.28.1
   DistributedTrainer when importable (else a skipped row; it runs with oneDNN
   off, which it needs, and its note gives its own compute time); ps-lite
   ``dist_sync`` with its server on host 2.

Writes cluster.csv (link_gbit, store, ms_per_step, compute_ms, comm_ms,
bound_overlap_ms = max(compute, comm), bound_serial_ms = compute + comm,
vs_bound = ms_per_step / bound_overlap_ms, vs_no_overlap) and cluster.png.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

MODES = ("chained", "funneled", "concurrent")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="resnet18_v1, fewer steps (< 5 min)")
    ap.add_argument("--model", help="gluoncv model (default resnet18_v1 quick, resnet50_v1b)")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="per rank")
    ap.add_argument("--steps", type=int, help="timed steps per row (default 4 quick, 8)")
    ap.add_argument("--ratios", default="0.5,1,2", help="target comm/compute ratios")
    ap.add_argument("--rates", help="link rates in Gbit/s (skips the calibration choice)")
    ap.add_argument("--chunk-bytes", type=int,
                    help="MXNET_MPI_CHUNK_BYTES for our stores (default: the product's)")
    ap.add_argument("--outdir", default=str(HERE / "results"))
    ap.add_argument("--worker", choices=("pslite", "horovod"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.model = args.model or ("resnet18_v1" if args.quick else "resnet50_v1b")
    args.steps = args.steps or (2 if args.quick else 8)
    args.warmup = 1 if args.quick else 2
    return args


# ----------------------------------------------------------------- peer workers
def peer_worker(args: argparse.Namespace) -> None:
    """Time Trainer steps with ps-lite dist_sync or Horovod's DistributedTrainer."""
    import mxnet as mx
    from gluoncv.model_zoo import get_model
    from mxnet import autograd, gluon

    net = get_model(args.model, classes=100)
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.random.uniform(shape=(args.batch, 3, args.image_size, args.image_size))
    y = mx.nd.array([i % 100 for i in range(args.batch)])
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    net(x).wait_to_read()
    opt = {"learning_rate": 1e-3}

    def timed(trainer) -> float:
        def step():
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(args.batch)

        for _ in range(2 if args.steps > 3 else 1):
            step()
            mx.nd.waitall()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        mx.nd.waitall()
        return (time.perf_counter() - t0) / args.steps

    out = {}
    if args.worker == "horovod":
        import horovod.mxnet as hvd
        hvd.init()
        rank = hvd.rank()
        # Horovod runs with oneDNN off (see horovod_run): its own compute-only time
        out["compute"] = timed(gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=None))
        hvd.broadcast_parameters(net.collect_params(), root_rank=0)
        trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", opt)
    else:
        kv = mx.kv.create("dist_sync")
        rank = kv.rank
        trainer = gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=kv)
    out["step"] = timed(trainer)
    if rank == 0:
        Path(args.worker_json).write_text(json.dumps(out))


# ----------------------------------------------------------------- driver
def overlap_run(cluster, args: argparse.Namespace, out_json: Path, steps: int,
                warmup: int) -> dict:
    """benchmarks/overlap.py's worker on hosts 0 and 1 (one rank each)."""
    cmd = cluster.mpirun(2, [sys.executable, str(HERE / "overlap.py"), "--model", args.model,
                             "--image-size", str(args.image_size), "--batch", str(args.batch),
                             "--steps", str(steps), "--warmup", str(warmup),
                             "--worker-json", str(out_json), "--fp16"], per_host=1)
    subprocess.run(cmd, check=True, env=job_env(cluster, args.chunk_bytes), cwd=str(ROOT),
                   timeout=600)
    return json.loads(out_json.read_text())


def job_env(cluster, chunk_bytes: int | None = None) -> dict:
    env = cluster.env()
    if chunk_bytes:
        env["MXNET_MPI_CHUNK_BYTES"] = str(chunk_bytes)
    env.update(OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def pslite_run(cluster, args: argparse.Namespace, out_json: Path) -> dict:
    """dist_sync: scheduler and server on host 2, one worker on each of hosts 0, 1."""
    from mxnet_mpi.launch import free_port

    env = job_env(cluster)
    dmlc = {"DMLC_PS_ROOT_URI": cluster.addrs[2], "DMLC_PS_ROOT_PORT": str(free_port()),
            "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2", "PS_VERBOSE": "0"}
    procs, workers = [], []
    try:
        for host, role in ((2, "scheduler"), (2, "server")):
            procs.append(subprocess.Popen(
                cluster.exec_cmd(host, [sys.executable, "-c", "import mxnet"]),
                env={**env, **dmlc, "DMLC_ROLE": role, "DMLC_NODE_HOST": cluster.addrs[host]},
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        workers += [subprocess.Popen(
            cluster.exec_cmd(h, [sys.executable, __file__, "--worker", "pslite",
                                 "--worker-json", str(out_json), "--model", args.model,
                                 "--image-size", str(args.image_size), "--batch",
                                 str(args.batch), "--steps", str(args.steps)]),
            env={**env, **dmlc, "DMLC_ROLE": "worker", "DMLC_NODE_HOST": cluster.addrs[h]},
            cwd=str(ROOT)) for h in (0, 1)]
        for w in workers:
            if w.wait(timeout=600) != 0:
                raise RuntimeError("dist_sync worker failed")
        return json.loads(out_json.read_text())
    finally:
        for p in procs + workers:
            if p.poll() is None:
                p.kill()
                p.wait()


def horovod_run(cluster, args: argparse.Namespace, out_json: Path) -> dict | None:
    """Horovod's DistributedTrainer on hosts 0 and 1 ({'step', 'compute'} in
    seconds), or None if Horovod is not installed."""
    probe = subprocess.run([sys.executable, "-c", "import horovod.mxnet"], capture_output=True)
    if probe.returncode != 0:
        return None
    cmd = cluster.mpirun(2, [sys.executable, __file__, "--worker", "horovod", "--worker-json",
                             str(out_json), "--model", args.model, "--image-size",
                             str(args.image_size), "--batch", str(args.batch),
                             "--steps", str(args.steps)], per_host=1)
    # Horovod 0.28.1 cannot reduce arrays in oneDNN layouts (MXNetError "We can't
    # generate TBlob for MKLDNN data"): it runs with oneDNN off, so its row's
    # note gives its own compute-only time in that setting.
    env = dict(job_env(cluster), MXNET_MKLDNN_ENABLED="0")
    subprocess.run(cmd, check=True, env=env, cwd=str(ROOT), timeout=600)
    return json.loads(out_json.read_text())


def choose_rates(grad_bytes: int, compute_s: float, ratios: list) -> list:
    """Link rates (Gbit/s, 2 significant digits) at which a 2-rank allreduce of
    `grad_bytes` takes `ratio` x `compute_s`."""
    out = []
    for k in ratios:
        gbit = grad_bytes * 8 / (k * compute_s) / 1e9
        out.append(float("%.2g" % gbit))
    return out


def drive(args: argparse.Namespace) -> None:
    from mxnet_mpi.modes import DEFAULT_MODE
    from mxnet_mpi.testing import netns

    why = netns.unavailable()
    if why:
        print("benchmarks/cluster.py: skipped, no netns cluster here: " + why)
        return
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    rows = []
    with netns.NetnsCluster(3) as cluster:
        if args.rates:
            rates = [float(r) for r in args.rates.split(",")]
            calib = None
        else:
            calib = overlap_run(cluster, args, outdir / "cluster_calib.json", steps=2, warmup=1)
            compute = calib["times"]["compute"]
            rates = choose_rates(calib["grad_bytes"], compute,
                                 [float(r) for r in args.ratios.split(",")])
            print("calibration (unshaped link): compute %.0f ms/step, %.1f MB of gradients; "
                  "link rates for comm/compute = %s: %s Gbit/s"
                  % (compute * 1e3, calib["grad_bytes"] / 2**20, args.ratios, rates), flush=True)
        for rate in rates:
            for h in range(cluster.n):
                cluster.shape(h, rate_gbit=rate)
            res = overlap_run(cluster, args, outdir / ("cluster_%g.json" % rate),
                              steps=args.steps, warmup=args.warmup)
            t = res["times"]
            default = DEFAULT_MODE
            compute, comm = t["compute"], t["comm_" + default]

            def row(store, secs, skipped=False, rate=rate, compute=compute, comm=comm,
                    res=res, note=""):
                rows.append({"link_gbit": rate, "store": store,
                             "ms_per_step": None if skipped else secs * 1e3,
                             "compute_ms": compute * 1e3, "comm_ms": comm * 1e3,
                             "grad_MB": res["grad_bytes"] / 2**20,
                             "chunk_bytes": args.chunk_bytes or "default", "note": note})
            row("compute only", compute)
            row("comm only", comm)
            row("no overlap", t["baseline"])
            row("mpi", t[default])
            for m in MODES:
                if m != default:
                    row("mpi_" + m, t[m])
            row("mpi fp16", t["fp16"],
                note="compression fp16: %.1f MB on the wire, comm only %.0f ms"
                % (res["grad_bytes"] / 2 / 2**20, t["comm_fp16"] * 1e3))
            hv = horovod_run(cluster, args, outdir / ("cluster_hvd_%g.json" % rate))
            if hv is None:
                row("horovod", None, skipped=True, note="not installed")
            else:
                row("horovod", hv["step"], note="oneDNN off; its compute-only: %.0f ms"
                    % (hv["compute"] * 1e3))
            ps = pslite_run(cluster, args, outdir / ("cluster_ps_%g.json" % rate))
            row("dist_sync", ps["step"], note="server on host 2")
            print("link %g Gbit/s done (%.0f s so far)" % (rate, time.time() - t_start),
                  flush=True)
    write_outputs(rows, outdir, args, calib)
    print("total %.0f s" % (time.time() - t_start))


def write_outputs(rows: list, outdir: Path, args: argparse.Namespace, calib: dict | None
                  ) -> None:
    for r in rows:
        step, c, m = r["ms_per_step"], r["compute_ms"], r["comm_ms"]
        r["bound_overlap_ms"] = max(c, m)
        r["bound_serial_ms"] = c + m
        r["vs_bound"] = None if step is None else step / max(c, m)
        base = next(x["ms_per_step"] for x in rows
                    if x["link_gbit"] == r["link_gbit"] and x["store"] == "no overlap")
        r["vs_no_overlap"] = None if step is None else base / step
    with open(outdir / "cluster.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print("\n%s, 2 hosts x 1 rank, batch %d/rank, %dx%d images, %.1f MB of gradients%s"
          % (args.model, args.batch, args.image_size, args.image_size, rows[0]["grad_MB"],
             "" if calib is None else ", calibration compute %.0f ms"
             % (calib["times"]["compute"] * 1e3)))
    print("%9s %-13s %9s %9s %9s %12s %11s %9s %13s  %s" % (
        "link Gb/s", "store", "ms/step", "compute", "comm", "max(c,comm)", "c+comm",
        "vs max", "no-overlap/x", "note"))
    for r in rows:
        step = "skipped" if r["ms_per_step"] is None else "%.0f" % r["ms_per_step"]
        vs = "" if r["vs_bound"] is None else "%.2f" % r["vs_bound"]
        sp = "" if r["vs_no_overlap"] is None else "%.2f" % r["vs_no_overlap"]
        print("%9g %-13s %9s %9.0f %9.0f %12.0f %11.0f %9s %13s  %s" % (
            r["link_gbit"], r["store"], step, r["compute_ms"], r["comm_ms"],
            r["bound_overlap_ms"], r["bound_serial_ms"], vs, sp, r["note"]))
    plot(rows, outdir, args)
    print("\nwrote %s and %s" % (outdir / "cluster.csv", outdir / "cluster.png"))


def plot(rows: list, outdir: Path, args: argparse.Namespace) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({r["link_gbit"] for r in rows})
    fig, ax = plt.subplots(figsize=(8, 5))
    first = [next(r for r in rows if r["link_gbit"] == g) for g in rates]
    ax.plot(rates, [r["bound_overlap_ms"] for r in first], "k-", lw=2,
            label="max(compute, comm): perfect overlap")
    ax.plot(rates, [r["bound_serial_ms"] for r in first], "k--", lw=2,
            label="compute + comm: no overlap")
    stores = [s for s in dict.fromkeys(r["store"] for r in rows)
              if s not in ("compute only", "comm only")]
    for s in stores:
        pts = [(r["link_gbit"], r["ms_per_step"]) for r in rows
               if r["store"] == s and r["ms_per_step"] is not None]
        if pts:
            ax.plot(*zip(*pts), "o-", label=s)
    ax.set_xscale("log")
    ax.set_xlabel("link rate per host (Gbit/s, tbf-shaped veth)")
    ax.set_ylabel("ms per step (lower is better)")
    ax.set_title("%s, 2 hosts x 1 rank: step time vs the overlap bounds" % args.model)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(outdir / "cluster.png", dpi=110)


if __name__ == "__main__":
    a = parse()
    if a.worker:
        peer_worker(a)
    else:
        drive(a)

"""Training throughput, scaling efficiency and projected ImageNet epoch time per kvstore.

    .venv/bin/python benchmarks/epoch_time.py [--ranks 1,2,4] [--model resnet18_v1]

Runs examples/train_imagenet.py --synthetic for every (kvstore, ranks) and
reads the images/s from its RESULT line (steady state: the first
--timing-skip steps are left out). Prints a table and writes
benchmarks/results/epoch_time.csv and epoch_time.png.

  single       one process, no kvstore (--kvstore none): the 1-rank baseline
  mpi_<mode>   our stores, under mpirun
  dist_sync    MXNet's parameter server: a scheduler, one server and N workers
  horovod      Horovod's DistributedTrainer under mpirun, when installed

images/s counts all ranks' images. Scaling efficiency = images/s on N ranks /
(N x images/s of `single`). The ImageNet epoch time is a PROJECTION:
1,281,167 images divided by the measured images/s of this model, image size
and batch on synthetic data, not a measured epoch. Each rank runs with
OMP_NUM_THREADS=1 (--omp-threads); more ranks than cores are oversubscribed
(on a 2-core machine, 4 ranks share 2 cores and cannot scale).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from meta import write_meta  # benchmarks/, the script's folder

from mxnet_mpi.launch import parameter_server

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRAIN = ROOT / "examples" / "train_imagenet.py"
IMAGENET_TRAIN_IMAGES = 1281167
STORES = ("single", "mpi_chained", "mpi_funneled", "mpi_concurrent", "dist_sync", "horovod")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--stores", default=",".join(STORES),
                    help="horovod is skipped when not installed")
    ap.add_argument("--model", default="resnet18_v1", help="gluoncv model_zoo name")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16, help="per rank")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=20, help="steps per run")
    ap.add_argument("--timing-skip", type=int, default=4, help="first steps not timed")
    ap.add_argument("--omp-threads", type=int, default=1, help="OMP_NUM_THREADS per rank")
    ap.add_argument("--train-args", default="",
                    help="extra arguments for train_imagenet.py, e.g. '--devices 2'")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    ap.add_argument("--outdir", default=str(HERE / "results"))
    return ap.parse_args()


def env_for(args, extra: dict | None = None) -> dict:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS=str(args.omp_threads))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def train_args(args, kvstore: str) -> list:
    return [str(TRAIN), "--synthetic", "--kvstore", kvstore, "--model", args.model,
            "--image-size", str(args.image_size), "--batch-size", str(args.batch),
            "--classes", str(args.classes), "--epochs", "1", "--max-steps", str(args.steps),
            "--timing-skip", str(args.timing_skip), "--no-val", "--quiet",
            *shlex.split(args.train_args)]


def run(cmds: list, envs: list, timeout: float) -> str:
    """Run processes together; return rank 0's RESULT line. Kill all on any failure."""
    procs = [subprocess.Popen(c, env=e, cwd=str(ROOT), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for c, e in zip(cmds, envs)]
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outs.append(out)
            if p.returncode != 0:
                raise SystemExit("%s exited %d:\n%s" % (" ".join(p.args[:8]), p.returncode,
                                                        out[-3000:]))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for out in outs:
        for line in out.splitlines():
            if line.startswith("RESULT "):
                return line[len("RESULT "):]
    raise SystemExit("no RESULT line in:\n" + "\n".join(o[-2000:] for o in outs))


def measure(args, store: str, n: int) -> dict:
    py = sys.executable
    mpirun = str(Path(py).parent / "mpirun")
    if store == "single":
        out = run([[py, *train_args(args, "none")]], [env_for(args)], args.timeout)
    elif store == "dist_sync":
        with parameter_server(n, env=env_for(args), cwd=str(ROOT)) as env:
            out = run([[py, *train_args(args, "dist_sync")]] * n, [env] * n, args.timeout)
    else:
        kv = "horovod" if store == "horovod" else store
        out = run([[mpirun, "-np", str(n), "--oversubscribe", py, *train_args(args, kv)]],
                  [env_for(args)], args.timeout)
    return json.loads(out)


def main() -> None:
    args = parse()
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    ranks = [int(r) for r in args.ranks.split(",")]
    stores = [s for s in args.stores.split(",") if s]
    if "horovod" in stores and importlib.util.find_spec("horovod") is None:
        print("horovod is not installed: no horovod rows (benchmarks/setup_horovod.sh)")
        stores.remove("horovod")
    cores = os.cpu_count() or 1
    rows = []
    for store in stores:
        for n in ([1] if store == "single" else ranks):
            print("running %s on %d rank(s)%s ..." % (store, n, " (oversubscribed)"
                                                      if n > cores else ""), flush=True)
            res = measure(args, store, n)
            rows.append({"store": store, "ranks": n, "images_per_sec": res["images_per_sec"],
                         "timed_steps": res["timed_steps"],
                         "projected_imagenet_epoch_h":
                             IMAGENET_TRAIN_IMAGES / res["images_per_sec"] / 3600,
                         "oversubscribed": n > cores})
    base = next((r["images_per_sec"] for r in rows if r["store"] == "single"), None)
    for r in rows:
        r["scaling_efficiency"] = r["images_per_sec"] / (r["ranks"] * base) if base else ""
    write_outputs(rows, outdir, args, cores)


def write_outputs(rows: list, outdir: Path, args, cores: int) -> None:
    with open(outdir / "epoch_time.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    write_meta(outdir / "epoch_time.csv")
    print("\n%s, %dx%d synthetic images, batch %d per rank, %d steps (first %d untimed), "
          "OMP_NUM_THREADS=%d, %d cores%s"
          % (args.model, args.image_size, args.image_size, args.batch, args.steps,
             args.timing_skip, args.omp_threads, cores,
             "; * = more ranks than cores (oversubscribed)"
             if any(r["oversubscribed"] for r in rows) else ""))
    print("ImageNet epoch = PROJECTION: %d images / measured images/s, not a measured epoch"
          % IMAGENET_TRAIN_IMAGES)
    fmt = "%-15s %6s %10s %22s %11s"
    print(fmt % ("kvstore", "ranks", "images/s", "projected epoch (h)", "efficiency"))
    for r in rows:
        print(fmt % (r["store"], "%d%s" % (r["ranks"], "*" if r["oversubscribed"] else ""),
                     "%.1f" % r["images_per_sec"], "%.1f" % r["projected_imagenet_epoch_h"],
                     "" if r["scaling_efficiency"] == "" else "%.2f" % r["scaling_efficiency"]))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stores = list(dict.fromkeys(r["store"] for r in rows))
    ranks = sorted({r["ranks"] for r in rows})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(ranks)
    for i, n in enumerate(ranks):
        vals = [next((r["images_per_sec"] for r in rows
                      if r["store"] == s and r["ranks"] == n), 0) for s in stores]
        ax1.bar([k + i * width for k in range(len(stores))], vals, width,
                label="%d rank%s%s" % (n, "s" if n > 1 else "", " (oversub.)"
                                       if n > cores else ""))
    ax1.set_xticks([k + width * (len(ranks) - 1) / 2 for k in range(len(stores))])
    ax1.set_xticklabels(stores, rotation=20, ha="right")
    ax1.set_ylabel("images/s, all ranks (higher is better)")
    ax1.legend(fontsize=8)
    for s in stores:
        pts = [(r["ranks"], r["scaling_efficiency"]) for r in rows
               if r["store"] == s and r["scaling_efficiency"] != ""]
        if s != "single" and pts:
            ax2.plot(*zip(*pts), "-o", label=s)
    ax2.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax2.set_xticks(ranks)
    ax2.set_xlabel("ranks (more than %d oversubscribe this machine)" % cores)
    ax2.set_ylabel("scaling efficiency vs one process")
    ax2.legend(fontsize=8)
    fig.suptitle("%s, %dx%d synthetic, batch %d/rank: throughput and scaling"
                 % (args.model, args.image_size, args.image_size, args.batch))
    fig.tight_layout()
    fig.savefig(outdir / "epoch_time.png", dpi=110)
    plt.close(fig)
    print("\nwrote %s and %s" % (outdir / "epoch_time.csv", outdir / "epoch_time.png"))


if __name__ == "__main__":
    main()

"""A PROJECTION (not a measurement) of ResNet-50 data-parallel training at scale.

    .venv/bin/python benchmarks/projection.py [--csv benchmarks/results/cluster.csv]

1. Fit to the cluster-in-a-box runs (benchmarks/cluster.py, 2 hosts x 1 rank):
   - allreduce:  t_comm = a + bytes x 8 / (e x rate)   (a fixed cost per step a,
     bandwidth efficiency e of the shaped link, least squares over the "comm
     only" rows; a 2-rank ring moves the gradient bytes once over each link);
   - overlap:    t_step = max(t_c, t_m) + tau x min(t_c, t_m)   (tau = the
     share of the smaller of compute and communication that is not hidden,
     fitted on the default store ``mpi``'s rows);
   and print the model against every measured row (the check).
2. Project for n GPUs (n = 8..256, `--gpus-per-node` per node joined by
   NVLink, nodes by `--link-gbit` links) with the fitted e (capped at 1) and
   tau (capped at 1); the per-step fixed cost a of this box is NOT carried over
   (on 2 time-sliced cores it is CPU scheduling, not the network): instead each
   of `--calls` collectives per step pays `--latency-us` per latency term.
   Hierarchical allreduce = intra-node reduce-scatter/allgather over NVLink +
   an inter-node allreduce (ring: 2(N-1) latency terms; Rabenseifner:
   2 log2 N; both move 2(N-1)/N x bytes over each node's link); report
   images/s, scaling efficiency and the ImageNet-1K epoch time.

Inputs and their defaults are printed with the table. Writes projection.csv
and projection.png; measured and projected rows are never mixed.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from meta import describe, write_meta  # benchmarks/, the script's folder

HERE = Path(__file__).resolve().parent
IMAGENET_TRAIN = 1_281_167
RESNET50_PARAMS = 25_557_032


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(HERE / "results" / "cluster.csv"))
    ap.add_argument("--outdir", default=str(HERE / "results"))
    ap.add_argument("--gpu-ips", type=float, default=1400.0,
                    help="images/s of one GPU alone (default 1400: about NVIDIA's published "
                         "MXNet ResNet-50 v1.5 mixed-precision training rate on one V100)")
    ap.add_argument("--batch", type=int, default=256, help="images per GPU per step")
    ap.add_argument("--link-gbit", type=float, default=100.0, help="inter-node link, Gbit/s")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--nvlink-gbyte", type=float, default=130.0,
                    help="intra-node bus bandwidth per GPU, GB/s (NVLink V100 DGX-1: ~130)")
    ap.add_argument("--grad-bytes", type=float, default=RESNET50_PARAMS * 4,
                    help="gradient bytes per step (default: ResNet-50 fp32)")
    ap.add_argument("--latency-us", type=float, default=10.0,
                    help="per-message latency between nodes, microseconds (MPI over a "
                         "100 Gbit/s fabric: a few to ~20)")
    ap.add_argument("--calls", type=int, default=161 + 98,
                    help="collectives per step (default: ResNet-50's 161 parameter arrays "
                         "plus its 102 MB cut into 1 MB chunks)")
    ap.add_argument("--algo", choices=("ring", "rabenseifner"), default="rabenseifner")
    ap.add_argument("--gpus", default="8,16,32,64,128,256")
    return ap.parse_args()


def load(path: str) -> list:
    with open(path) as f:
        return [dict(r) for r in csv.DictReader(f)]


def fit_comm(rows: list) -> tuple:
    """(a seconds, e) from comm-only rows: t = a + x / e, x = bits / rate."""
    pts = [(float(r["grad_MB"]) * 2**20 * 8 / (float(r["link_gbit"]) * 1e9),
            float(r["ms_per_step"]) / 1e3) for r in rows if r["store"] == "comm only"]
    if len(pts) < 2:
        (x, t), = pts
        return 0.0, x / t
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    mt = sum(t for _, t in pts) / n
    slope = sum((x - mx) * (t - mt) for x, t in pts) / sum((x - mx) ** 2 for x, _ in pts)
    a = max(0.0, mt - slope * mx)
    return a, 1.0 / slope


def fit_tau(rows: list, store: str = "mpi") -> float:
    """Least-squares tau in step = max(c, m) + tau x min(c, m)."""
    num = den = 0.0
    for r in rows:
        if r["store"] != store or not r["ms_per_step"]:
            continue
        c, m, s = float(r["compute_ms"]), float(r["comm_ms"]), float(r["ms_per_step"])
        lo = min(c, m)
        num += (s - max(c, m)) * lo
        den += lo * lo
    return max(0.0, num / den) if den else 0.0


def step_time(compute: float, comm: float, tau: float) -> float:
    return max(compute, comm) + tau * min(compute, comm)


def allreduce_time(n: int, args: argparse.Namespace, e: float) -> float:
    """Hierarchical allreduce of the gradients on n GPUs (seconds)."""
    g = min(n, args.gpus_per_node)
    nodes = max(1, n // args.gpus_per_node)
    m = args.grad_bytes
    intra = 2 * (g - 1) / g * m / (args.nvlink_gbyte * 1e9) if g > 1 else 0.0
    if nodes == 1:
        return intra
    # each node's GPUs split the inter-node traffic of their 1/g share, but share
    # the node's link: the node moves 2(N-1)/N x m over it either way
    lat = 2 * (nodes - 1) if args.algo == "ring" else 2 * math.ceil(math.log2(nodes))
    inter = (lat * args.calls * args.latency_us * 1e-6
             + 2 * (nodes - 1) / nodes * m * 8 / (e * args.link_gbit * 1e9))
    return intra + inter


def main() -> None:
    args = parse()
    rows = load(args.csv)
    a, e = fit_comm(rows)
    tau = fit_tau(rows)
    e_proj, tau_proj = min(e, 1.0), min(tau, 1.0)
    print("Fit to %s (measured, 2 hosts x 1 rank):" % args.csv)
    print("  allreduce: fixed cost per step a = %.0f ms, link efficiency e = %.2f; overlap: "
          "tau = %.2f "
          "(share of min(compute, comm) not hidden, store 'mpi')" % (a * 1e3, e, tau))
    print("\nCheck of the model against the measured rows:")
    print("%9s %-11s %10s %10s %7s" % ("link Gb/s", "row", "measured", "model", "error"))
    check = []
    for r in rows:
        rate, mb = float(r["link_gbit"]), float(r["grad_MB"])
        comm_model = a + mb * 2**20 * 8 / (e * rate * 1e9)
        if r["store"] == "comm only":
            pred = comm_model * 1e3
        elif r["store"] == "mpi":
            pred = step_time(float(r["compute_ms"]), comm_model * 1e3, tau)
        else:
            continue
        meas = float(r["ms_per_step"])
        check.append({"link_gbit": rate, "row": r["store"], "measured_ms": round(meas),
                      "model_ms": round(pred), "error_pct": round(100 * (pred - meas) / meas)})
        print("%9g %-11s %8.0f ms %7.0f ms %+6.0f%%" % (rate, r["store"], meas, pred,
                                                        100 * (pred - meas) / meas))

    compute = args.batch / args.gpu_ips
    out = []
    for n in [int(x) for x in args.gpus.split(",")]:
        comm = allreduce_time(n, args, e_proj)
        step = step_time(compute, comm, tau_proj)
        ips = n * args.batch / step
        out.append({"gpus": n, "compute_ms": compute * 1e3, "allreduce_ms": comm * 1e3,
                    "step_ms": step * 1e3, "images_per_s": ips,
                    "scaling_efficiency": ips / (n * args.gpu_ips),
                    "epoch_s": IMAGENET_TRAIN / ips})
    print("\nPROJECTION (model, not measured): ResNet-50, %d images/GPU/step, %.0f images/s "
          "per GPU alone, %.0f MB of gradients, %d GPUs/node on %.0f GB/s NVLink, %.0f Gbit/s "
          "between nodes, %s allreduce, %d collectives/step at %g us per latency term; "
          "e = %.2f, tau = %.2f (fitted, capped at 1)"
          % (args.batch, args.gpu_ips, args.grad_bytes / 1e6, args.gpus_per_node,
             args.nvlink_gbyte, args.link_gbit, args.algo, args.calls, args.latency_us,
             e_proj, tau_proj))
    print("%6s %11s %13s %9s %10s %11s %10s" % ("GPUs", "compute ms", "allreduce ms",
                                                "step ms", "images/s", "efficiency",
                                                "epoch s"))
    for p in out:
        print("%6d %11.0f %13.1f %9.0f %10.0f %10.0f%% %10.1f" % (
            p["gpus"], p["compute_ms"], p["allreduce_ms"], p["step_ms"], p["images_per_s"],
            100 * p["scaling_efficiency"], p["epoch_s"]))
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    with open(outdir / "projection.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(out[0]))
        w.writeheader()
        w.writerows(out)
    write_meta(outdir / "projection.csv", input=describe(args.csv),
               inputs={k: v for k, v in vars(args).items() if k not in ("csv", "outdir")},
               fit={"a_ms": round(a * 1e3, 1), "e": round(e, 3), "tau": round(tau, 3)},
               check=check)
    plot(out, outdir, args)
    print("\nwrote %s and %s" % (outdir / "projection.csv", outdir / "projection.png"))


def plot(out: list, outdir: Path, args: argparse.Namespace) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    gpus = [p["gpus"] for p in out]
    ax.plot(gpus, [p["images_per_s"] for p in out], "o-", label="projected")
    ax.plot(gpus, [n * args.gpu_ips for n in gpus], "k--", label="linear scaling")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("images/s")
    ax.set_title("PROJECTION: ResNet-50, %.0f img/s/GPU, %.0f Gbit/s links"
                 % (args.gpu_ips, args.link_gbit))
    ax.legend()
    fig.tight_layout()
    fig.savefig(outdir / "projection.png", dpi=110)


if __name__ == "__main__":
    main()

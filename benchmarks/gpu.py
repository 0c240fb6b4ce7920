"""GPU figures (needs a GPU; tools/gpu_check.sh runs it there).

    python benchmarks/gpu.py [--outdir DIR] [--quick]

1. allreduce (`pushpull`, default mode) per call of GPU arrays against host
   arrays of the same size, 2 ranks sharing GPU 0: GPU arrays staged in
   4 MiB chunks (the default, pipelined) and in one chunk, and the staging
   copies alone (device -> pinned host -> device, no MPI). Only copies touch
   the GPU here, so this runs even where MXNet's kernels cannot.
2. images/s of examples/train_imagenet.py --synthetic (resnet50_v1b) on 1 rank
   and on 2 ranks sharing the GPU, and the share of a 2-rank step that staging
   its gradients takes at the rates of 1; only where MXNet's GPU kernels run
   on this GPU (its CUDA wheels have none for Hopper), else the row says why.
Prints a table and writes gpu.csv into --outdir (default benchmarks/results/).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from meta import write_meta  # benchmarks/, the script's folder

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIZES = [4 << 10, 256 << 10, 4 << 20, 64 << 20]
ONE_CHUNK = 1 << 40


def _median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def worker(args) -> None:
    import mxnet as mx
    import numpy as np

    import mxnet_mpi
    kv = mx.kv.create("mpi")
    reps = 5 if args.quick else 20
    dev = mx.gpu(0) if args.ctx == "gpu" else mx.cpu_pinned(0)
    res = {}
    for nbytes in SIZES:
        host = np.ones(nbytes // 4, np.float32)
        for where in ("gpu", "cpu"):
            x = mx.nd.array(host, ctx=dev if where == "gpu" else mx.cpu())
            key = "%s-%d" % (where, nbytes)
            kv.pushpull(key, x)
            x.wait_to_read()
            sync = mx.nd.ones((1,))
            kv.pushpull("sync-" + key, sync)   # lines the ranks up before timing
            sync.wait_to_read()

            def call(x=x, key=key):
                kv.pushpull(key, x)
                x.wait_to_read()
            res[key] = _median_ms(call, reps)
        g = mx.nd.array(host, ctx=dev)
        pinned = mx.nd.empty(g.shape, ctx=mx.cpu_pinned(0))

        def copies(g=g, pinned=pinned):
            g.copyto(pinned)
            pinned.copyto(g)
            g.wait_to_read()
        copies()
        res["copies-%d" % nbytes] = _median_ms(copies, reps)
    if mxnet_mpi.rank() == 0:
        Path(args.worker_json).write_text(json.dumps(res))


def env(extra: dict | None = None) -> dict:
    e = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(extra or {})
    return e


def kernels_run() -> str:
    """'ok', or why MXNet's GPU kernels do not run here (in a separate process)."""
    code = ("import mxnet as mx\n"
            "a = mx.nd.ones((64, 64), ctx=mx.gpu(0))\n"
            "print('SUM', mx.nd.dot(a, a).sum().asscalar())\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(),
                       timeout=600)
    if "SUM 262144" in p.stdout:
        return "ok"
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if "ErrStr" in ln or "rror:" in ln]
    return (lines[-1] if lines else "exit %d" % p.returncode).strip()[:300]


def images_per_s(np_: int, steps: int) -> float:
    cmd = [sys.executable, str(ROOT / "examples" / "train_imagenet.py"), "--synthetic",
           "--model", "resnet50_v1b", "--batch-size", "32", "--max-steps", str(steps),
           "--no-val", "--quiet", "--epochs", "1"]
    if np_ > 1:
        cmd = [str(Path(sys.executable).parent / "mpirun"), "-np", str(np_), "--oversubscribe",
               *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=str(ROOT),
                         timeout=1200).stdout
    m = re.search(r"THROUGHPUT ([\d.]+) images/s", out)
    return float(m.group(1)) if m else float("nan")


def run_workers(out: Path, chunk: int, args) -> dict:
    tmp = out / (".gpu_worker_%d.json" % chunk)
    subprocess.run([str(Path(sys.executable).parent / "mpirun"), "-np", "2", "--oversubscribe",
                    sys.executable, __file__, "--worker-json", str(tmp)]
                   + (["--quick"] if args.quick else []) + ["--ctx", args.ctx],
                   check=True, env=env({"MXNET_MPI_STAGE_CHUNK_BYTES": str(chunk)}),
                   cwd=str(ROOT), timeout=1200)
    times = json.loads(tmp.read_text())
    tmp.unlink()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--outdir", default=str(HERE / "results"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker-json", help=argparse.SUPPRESS)
    # cpu_pinned: a smoke run of this script without a GPU (numbers meaningless)
    ap.add_argument("--ctx", choices=["gpu", "cpu_pinned"], default="gpu",
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_json:
        worker(args)
        return
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    chunked = run_workers(out, 4 << 20, args)
    whole = run_workers(out, ONE_CHUNK, args)
    rows = []
    print("2 ranks sharing GPU 0, mode %s, median ms per pushpull"
          % os.environ.get("MXNET_MPI_MODE", "default"))
    print("%10s %9s %14s %14s %12s %9s" % ("bytes", "host", "gpu 4MiB-chunks", "gpu 1 chunk",
                                            "copies only", "gpu/host"))
    for nbytes in SIZES:
        c = chunked["cpu-%d" % nbytes]
        g, g1 = chunked["gpu-%d" % nbytes], whole["gpu-%d" % nbytes]
        cp = chunked["copies-%d" % nbytes]
        print("%10d %9.3f %14.3f %14.3f %12.3f %8.2fx" % (nbytes, c, g, g1, cp, g / c))
        rows.append({"what": "allreduce_ms", "bytes": nbytes, "host": round(c, 4),
                     "gpu_chunked": round(g, 4), "gpu_one_chunk": round(g1, 4),
                     "copies_only": round(cp, 4), "note": ""})
    kern = kernels_run() if args.ctx == "gpu" else "not a GPU run (--ctx cpu_pinned)"
    # resnet50_v1b: 25.5 M parameters, ~102 MB of float32 gradients per step
    grad_bytes = 25.5e6 * 4
    per_byte = (chunked["gpu-%d" % SIZES[-1]] - chunked["cpu-%d" % SIZES[-1]]) / SIZES[-1]
    print("staging cost at 64 MB: %.3f ms per MB over host arrays; resnet50_v1b's 102 MB "
          "of gradients: ~%.1f ms per step" % (per_byte * (1 << 20), per_byte * grad_bytes))
    if kern == "ok":
        steps = 10 if args.quick else 30
        one, two = images_per_s(1, steps), images_per_s(2, steps)
        step_ms = 2 * 32 / two * 1e3 if two == two else float("nan")
        share = per_byte * grad_bytes / step_ms if step_ms == step_ms else float("nan")
        print("resnet50_v1b synthetic, batch 32/rank: 1 rank %.1f images/s, 2 ranks sharing "
              "the GPU %.1f images/s; staging ~%.0f%% of a %.0f ms step"
              % (one, two, 100 * share, step_ms))
        rows += [{"what": "images_per_s_1_rank", "gpu_chunked": one},
                 {"what": "images_per_s_2_ranks", "gpu_chunked": two},
                 {"what": "staging_share_of_step", "gpu_chunked": round(share, 4)}]
    else:
        print("images/s not measured: MXNet's GPU kernels do not run here: " + kern)
        rows.append({"what": "images_per_s", "note": "not measured: kernels do not run: "
                     + kern})
    rows.append({"what": "staging_ms_per_step_resnet50_v1b",
                 "gpu_chunked": round(per_byte * grad_bytes, 3)})
    with open(out / "gpu.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["what", "bytes", "host", "gpu_chunked",
                                          "gpu_one_chunk", "copies_only", "note"])
        w.writeheader()
        w.writerows(rows)
    write_meta(out / "gpu.csv", quick=args.quick)
    print("wrote", out / "gpu.csv")


if __name__ == "__main__":
    main()

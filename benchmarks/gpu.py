"""GPU figures (needs a GPU; tools/gpu_check.sh runs it there).

    python benchmarks/gpu.py [--outdir DIR] [--quick]

1. allreduce per call of GPU arrays against host arrays of the same size
   (2 ranks sharing GPU 0, default mode): the difference is the staging cost
   (device -> pinned host -> device copies, pipelined in chunks);
2. images/s of examples/train_imagenet.py --synthetic (resnet50_v1b) on 1 rank
   and on 2 ranks sharing the GPU, and the share of a 2-rank step that
   staging its gradients would take at the rates measured in 1.
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIZES = [4 << 20, 64 << 20]


def worker(args) -> None:
    import mxnet as mx

    import mxnet_mpi
    kv = mx.kv.create("mpi")
    res = {}
    for nbytes in SIZES:
        for where in ("gpu", "cpu"):
            ctx = mx.gpu(0) if where == "gpu" else mx.cpu()
            x = mx.nd.ones((nbytes // 4,), ctx=ctx)
            kv.pushpull("%s-%d" % (where, nbytes), x)
            x.wait_to_read()
            reps = 5 if args.quick else 20
            t = time.perf_counter()
            for _ in range(reps):
                kv.pushpull("%s-%d" % (where, nbytes), x)
            x.wait_to_read()
            res["%s-%d" % (where, nbytes)] = (time.perf_counter() - t) / reps * 1e3
    if mxnet_mpi.rank() == 0:
        Path(args.worker_json).write_text(json.dumps(res))


def env() -> dict:
    e = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    return e


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--outdir", default=str(HERE / "results"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker-json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_json:
        worker(args)
        return
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".gpu_worker.json"
    subprocess.run([str(Path(sys.executable).parent / "mpirun"), "-np", "2", "--oversubscribe",
                    sys.executable, __file__, "--worker-json", str(tmp)]
                   + (["--quick"] if args.quick else []),
                   check=True, env=env(), cwd=str(ROOT), timeout=1200)
    times = json.loads(tmp.read_text())
    tmp.unlink()
    rows = []
    print("%10s %12s %12s %10s" % ("bytes", "gpu ms", "host ms", "staging ms"))
    for nbytes in SIZES:
        g, c = times["gpu-%d" % nbytes], times["cpu-%d" % nbytes]
        print("%10d %12.2f %12.2f %10.2f" % (nbytes, g, c, g - c))
        rows.append({"what": "allreduce_ms", "bytes": nbytes, "gpu": round(g, 3),
                     "host": round(c, 3)})
    steps = 10 if args.quick else 30
    one, two = images_per_s(1, steps), images_per_s(2, steps)
    # resnet50_v1b: 25.5 M parameters, ~102 MB of float32 gradients per step
    grad_bytes = 25.5e6 * 4
    per_byte = (times["gpu-%d" % SIZES[-1]] - times["cpu-%d" % SIZES[-1]]) / SIZES[-1]
    step_ms = 2 * 32 / two * 1e3 if two == two else float("nan")
    share = per_byte * grad_bytes / step_ms if step_ms == step_ms else float("nan")
    print("resnet50_v1b synthetic, batch 32/rank: 1 rank %.1f images/s, 2 ranks sharing the "
          "GPU %.1f images/s; staging ~%.1f ms of a %.0f ms step (%.0f%%)"
          % (one, two, per_byte * grad_bytes, step_ms, 100 * share))
    rows += [{"what": "images_per_s_1_rank", "bytes": "", "gpu": one, "host": ""},
             {"what": "images_per_s_2_ranks", "bytes": "", "gpu": two, "host": ""},
             {"what": "staging_share_of_step", "bytes": "", "gpu": round(share, 4), "host": ""}]
    with open(out / "gpu.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["what", "bytes", "gpu", "host"])
        w.writeheader()
        w.writerows(rows)
    print("wrote", out / "gpu.csv")


if __name__ == "__main__":
    main()

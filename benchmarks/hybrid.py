"""Who should talk to the parameter servers: the group leader, or every rank for a
shard of the keys? Times a push/pull step of dense keys through the hybrid stores
(and pure MPI for reference), each job started by ``python -m mxnet_mpi.launch``.

    .venv/bin/python benchmarks/hybrid.py [-n 4] [--groups 2] [--servers 2]
        [--keys 8] [--elems 262144] [--steps 20] [--repeat 3] [--out results/hybrid.json]

Prints a table: one row per (store, route), the time of one step (push every key,
then pull every key, SGD on the servers or, for 'mpi', on every rank) on world
rank 0: the median over --repeat jobs of each job's median step, and the fastest
step of all. Route 'sharded' needs
dist_async_mpi (see mxnet_mpi/hybrid.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [  # (label, kvstore, route, use servers)
    ("mpi (no servers)", "mpi", "leader", False),
    ("dist_sync_mpi / leader", "dist_sync_mpi", "leader", True),
    ("dist_async_mpi / leader", "dist_async_mpi", "leader", True),
    ("dist_async_mpi / sharded", "dist_async_mpi", "sharded", True),
]


def worker(args: argparse.Namespace) -> None:
    """One rank: init keys, set an SGD optimizer, time push+pull steps."""
    import mxnet as mx
    import numpy as np

    import mxnet_mpi

    kv = mx.kv.create(args.kvstore)
    keys = list(range(args.keys))
    weights = [mx.nd.zeros((args.elems,)) for _ in keys]
    grads = [mx.nd.ones((args.elems,)) * (mxnet_mpi.rank() + 1) for _ in keys]
    kv.init(keys, weights)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=1e-6))
    times = []
    for step in range(args.warmup + args.steps):
        mx.nd.waitall()
        t0 = time.perf_counter()
        # last key first, as Trainer does; pushes first, then pulls
        for k in reversed(keys):
            kv.push(k, grads[k], priority=-k)
        for k in reversed(keys):
            kv.pull(k, out=weights[k], priority=-k)
        mx.nd.waitall()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    if mxnet_mpi.rank() == 0:
        print("RESULT " + json.dumps({"median_ms": 1e3 * float(np.median(times)),
                                      "min_ms": 1e3 * float(np.min(times))}), flush=True)


def run_config(args, kvstore: str, route: str, servers: bool) -> dict:
    cmd = [sys.executable, "-m", "mxnet_mpi.launch", "-n", str(args.n), "--groups",
           str(args.groups), "--servers", str(args.servers if servers else 0), "--route", route,
           "--", sys.executable, str(Path(__file__).resolve()), "--worker", "--kvstore", kvstore,
           "--keys", str(args.keys), "--elems", str(args.elems), "--steps", str(args.steps),
           "--warmup", str(args.warmup)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT),
                          timeout=600)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "RESULT " in ln]
    if proc.returncode != 0 or not lines:
        raise RuntimeError("%s/%s failed (%d):\n%s" % (kvstore, route, proc.returncode,
                                                       (proc.stdout + proc.stderr)[-4000:]))
    return json.loads(lines[-1].split("RESULT ", 1)[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--kvstore", default="dist_sync_mpi", help=argparse.SUPPRESS)
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--keys", type=int, default=8)
    ap.add_argument("--elems", type=int, default=1 << 18, help="float32 elements per key")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3, help="jobs per configuration")
    ap.add_argument("--out", help="also write the rows as JSON here")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    mb = args.keys * args.elems * 4 / 2 ** 20
    print("%d ranks in %d groups, %d server(s); %d keys x %d float32 = %.1f MiB per step"
          % (args.n, args.groups, args.servers, args.keys, args.elems, mb))
    print("%-28s %12s %12s" % ("store / route", "median ms", "min ms"))
    print("-" * 54)
    rows = []
    for label, kvstore, route, servers in CONFIGS:
        runs = [run_config(args, kvstore, route, servers) for _ in range(args.repeat)]
        res = {"median_ms": float(sorted(r["median_ms"] for r in runs)[len(runs) // 2]),
               "min_ms": min(r["min_ms"] for r in runs), "runs": runs}
        rows.append({"config": label, **res})
        print("%-28s %12.1f %12.1f" % (label, res["median_ms"], res["min_ms"]), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"n": args.n, "groups": args.groups,
                                              "servers": args.servers, "keys": args.keys,
                                              "elems": args.elems, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

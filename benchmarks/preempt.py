"""Overlap across steps: the funneled store with pre-emption on and off, side by side.

    .venv/bin/python benchmarks/preempt.py [--quick] [--rates 1,0.5 | --shm]
                                           [--budgets 0,1M,4M] [--outdir DIR]

Trains a gluoncv model (resnet18_v1, batch 8 per rank, 64x64 images) on 2
ranks, by default one on each of 2 hosts of the cluster in a box
(mxnet_mpi/testing/netns.py, needs root; a core of its own per host, links
shaped to each rate), with ``--shm`` on 2 ranks of this machine. In one
process per link, every configuration runs in turn, round after round, so
load changes hit them alike:

  compute      forward + backward + update, no communication (also with the
               --segments copies: "compute, N-op segments")
  comm         the default store's allreduce of the gradients alone
  budget B     Trainer(kvstore=mpi_funneled) with MXNET_MPI_PREEMPT_BYTES=B
               (0: pre-emption off, cycles run all they agreed on)
  B, N-op segments
               the default budget on a copy of the model whose forward and
               backward passes run in MXNet engine segments of up to N ops,
               with SGD updating 4 parameters per op (--segments; at 15 these
               are MXNet's own defaults; the other configs run with the
               process's: in an MPI job, mxnet_mpi's 1 op and 1 parameter)

Steps follow each other with no wait in between, as in training: the next
forward is pushed while gradients still move, and its first layer can start
once that layer's weight is updated. Two probes per step (tiny collectives on
another store, read from the timeline) mark when the first layer's gradient
is made (the end of backward) and when its weight is updated (the next forward
can start). Per configuration (rank 0's timeline):

  comm_after_backward   share of the gradients' MPI time that runs after the
                        last backward op (pieces of pre-empted allreduces
                        counted as they ran, fused ones once)
  comm_after_forward    share that runs after the next forward could start,
                        i.e. beside the next step's forward
  backward_to_forward_ms  from the end of backward to the first layer's
                        updated weight (the next forward's first op may run)

Writes preempt.csv (+ .meta.json) and preempt.png in --outdir.
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
sys.path.insert(0, str(HERE))

from meta import engine_settings, write_meta  # noqa: E402


def size_arg(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(float(text.rstrip("KM")) * mult)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one link, fewer rounds (~3 min)")
    ap.add_argument("--model", default="resnet18_v1")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="per rank")
    ap.add_argument("--rates", help="link rates in Gbit/s (default 1,0.5; --quick 0.5)")
    ap.add_argument("--shm", action="store_true", help="2 ranks on this machine instead")
    ap.add_argument("--budgets", default="0,1M,4M",
                    help="MXNET_MPI_PREEMPT_BYTES values compared (0: off)")
    ap.add_argument("--segments", default="15",
                    help="MXNet segment sizes (ops, forward and backward; with SGD's 4 "
                         "parameters per update) also run at the default budget "
                         "(comma-separated; empty: none)")
    ap.add_argument("--rounds", type=int, help="rounds of every config (default 4, quick 3)")
    ap.add_argument("--steps", type=int, default=3, help="steps per config per round")
    ap.add_argument("--outdir", default=str(HERE / "results"))
    ap.add_argument("--worker-json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.rounds = args.rounds or (3 if args.quick else 4)
    if args.rates is None:
        args.rates = "0.5" if args.quick else "1,0.5"
    return args


def training_free(config: str) -> bool:
    """A config with no training store: compute only (any segments) or comm only."""
    return config == "comm" or config.startswith("compute")


def budget_name(b: int) -> str:
    if b == 0:
        return "off"
    return "%d MiB" % (b >> 20) if b % (1 << 20) == 0 else "%d KiB" % (b >> 10)


# ----------------------------------------------------------------- worker side
def worker(args: argparse.Namespace) -> None:
    import mxnet as mx
    from mxnet import gluon
    from workload import gluoncv_workload

    import mxnet_mpi
    from _mxnet_mpi_autoload import backward_segment_ops, forward_segment_ops
    from mxnet_mpi import settings, timeline

    rank = mxnet_mpi.rank()
    timeline.start()
    work = gluoncv_workload(args.model, args.batch, args.image_size)
    net, params = work.net, work.params
    opt = {"learning_rate": 1e-3}

    probe_kv = mx.kv.create("mpi_concurrent")   # no chain: ready when its input is
    first = params[0]
    outs = {"fwd": mx.nd.zeros(first.shape), "bwd": mx.nd.zeros(first.shape)}

    def probe(tag: str, arr) -> None:
        probe_kv.pushpull(tag, arr, out=outs[tag])

    trainers = {"compute": gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=None)}
    for b in [size_arg(s) for s in args.budgets.split(",")]:
        os.environ["MXNET_MPI_PREEMPT_BYTES"] = str(b)   # read when the store is made
        kv = mx.kv.create("mpi_funneled")
        assert kv.stream.options()["preempt_bytes"] == b
        trainers[budget_name(b)] = gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=kv)
    os.environ.pop("MXNET_MPI_PREEMPT_BYTES")
    # the segments MXNet took as its defaults when it loaded here
    segments = {name: (forward_segment_ops(), backward_segment_ops()) for name in trainers}
    works = {}   # configs on a copy of the model with other segments and update groups

    def mxnet_sgd():
        sgd = mx.optimizer.SGD(**opt)
        sgd.aggregate_num = 4   # MXNet's default group (MXNET_OPTIMIZER_AGGREGATION_SIZE)
        return sgd

    default_budget = settings.BY_NAME["MXNET_MPI_PREEMPT_BYTES"].default
    for n in [int(x) for x in args.segments.split(",") if x.strip()]:
        name = "%s, %d-op segments" % (budget_name(default_budget), n)
        works[name] = gluoncv_workload(args.model, args.batch, args.image_size,
                                       forward_bulk_size=n, backward_bulk_size=n)
        trainers[name] = gluon.Trainer(works[name].net.collect_params(), mxnet_sgd(),
                                       kvstore=mx.kv.create("mpi_funneled"))
        alone = "compute, %d-op segments" % n
        works[alone] = works[name]
        trainers[alone] = gluon.Trainer(works[name].net.collect_params(), mxnet_sgd(),
                                        kvstore=None)
        segments[name] = segments[alone] = (n, n)
    # parameters per update op, as each trainer's optimizer has it
    groups = {name: max(1, t._optimizer.aggregate_num) for name, t in trainers.items()}
    comm_kv = mx.kv.create("mpi")

    def train_step(trainer, w) -> None:
        probe("fwd", w.params[0].data())   # ready once the first layer's weight is updated
        w.forward_backward()
        probe("bwd", w.params[0].grad())   # ready once backward made the first layer's gradient
        trainer.step(args.batch)

    def comm_step() -> None:
        for i in reversed(range(len(params))):
            comm_kv.pushpull("g%d" % i, params[i].grad(), priority=-i)

    configs = {name: (lambda t=t, w=works[name] if name in works else work: train_step(t, w))
               for name, t in trainers.items()}
    configs["comm"] = comm_step
    wall = {n: 0.0 for n in configs}
    cpu = {n: 0.0 for n in configs}
    windows = {n: [] for n in configs}
    for fn in configs.values():               # warm-up, and every store's first step
        fn()
        mx.nd.waitall()
    for _ in range(args.rounds):
        for name, fn in configs.items():
            comm_kv.pushpull("barrier", mx.nd.zeros((1,)))
            mx.nd.waitall()
            t0, w0, c0 = time.perf_counter(), time.time() * 1e6, time.process_time()
            for _ in range(args.steps):
                fn()                          # no wait between steps
            mx.nd.waitall()
            wall[name] += time.perf_counter() - t0
            cpu[name] += time.process_time() - c0
            windows[name].append((w0, time.time() * 1e6))
    n = args.rounds * args.steps
    trace = timeline.dump(args.worker_json + ".trace.json", rank)
    if rank == 0:
        stats = {name: analyse(trace, ws) for name, ws in windows.items()}
        Path(args.worker_json).write_text(json.dumps({
            "ms_per_step": {k: v * 1e3 / n for k, v in wall.items()},
            "cpu_per_wall": {k: cpu[k] / wall[k] for k in wall},
            "stats": stats, "steps": n, "segments": segments, "update_group": groups,
            "default_budget": default_budget,
            "grad_bytes": sum(p.grad().size * 4 for p in params)}))


def union(intervals: list) -> list:
    out = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def after(spans: list, t: float) -> float:
    return sum(max(0.0, hi - max(lo, t)) for lo, hi in spans)


def analyse(trace: str, windows: list) -> dict:
    """Per step of a training config (see the module doc), summed over steps."""
    with open(trace) as f:
        events = [dict(e["args"], name=e["name"]) for e in json.load(f)["traceEvents"]
                  if e.get("cat") == "collective"]
    busy = late_b = late_f = 0.0
    gaps = []
    for w0, w1 in windows:
        evs = sorted((e for e in events if w0 <= e["enqueue_us"] <= w1),
                     key=lambda e: e["enqueue_us"])
        fwd = [e for e in evs if "key='fwd'" in e["name"]]
        bwd = [e for e in evs if "key='bwd'" in e["name"]]
        for k, b in enumerate(bwd):
            nxt = fwd[k + 1] if k + 1 < len(fwd) else None
            hi = nxt["enqueue_us"] if nxt else w1
            grads = [e for e in evs if b["enqueue_us"] <= e["enqueue_us"] <= hi
                     and "key='fwd'" not in e["name"] and "key='bwd'" not in e["name"]]
            if not grads:
                return {}
            spans = union([tuple(p) for e in grads
                           for p in (e.get("pieces_us") or [(e["start_us"], e["end_us"])])])
            total = sum(h - lo for lo, h in spans)
            busy += total
            late_b += after(spans, b["ready_us"])
            if nxt:   # the last step of a round has no next forward in its window
                late_f += after(spans, nxt["ready_us"])
                gaps.append((nxt["ready_us"] - b["ready_us"]) / 1e3)
    return {"comm_after_backward": late_b / busy if busy else None,
            "comm_after_forward": late_f / busy if busy else None,
            "backward_to_forward_ms": sum(gaps) / len(gaps) if gaps else None}


# ----------------------------------------------------------------- driver side
def worker_cmd(args: argparse.Namespace, out_json: Path) -> list:
    return [sys.executable, str(Path(__file__).resolve()), "--model", args.model,
            "--image-size", str(args.image_size), "--batch", str(args.batch),
            "--budgets", args.budgets, "--segments", args.segments, "--rounds",
            str(args.rounds), "--steps",
            str(args.steps), "--worker-json", str(out_json)]


def rows_of(res: dict, link: str, args: argparse.Namespace) -> list:
    ms = res["ms_per_step"]
    off = ms.get("off")
    rows = []
    for name, secs in ms.items():
        s = res["stats"].get(name) or {}
        rows.append({"link": link, "config": name, "ms_per_step": secs,
                     "vs_off": off / secs if off and not training_free(name) else None,
                     "comm_after_backward": s.get("comm_after_backward"),
                     "comm_after_forward": s.get("comm_after_forward"),
                     "backward_to_forward_ms": s.get("backward_to_forward_ms"),
                     "cpu_per_wall": res["cpu_per_wall"][name],
                     "bwd_segment_ops": (res["segments"].get(name) or [None, None])[1],
                     "fwd_segment_ops": (res["segments"].get(name) or [None, None])[0],
                     "update_group": res["update_group"].get(name),
                     "compute_ms": ms["compute"], "comm_ms": ms["comm"],
                     "grad_MB": res["grad_bytes"] / 2**20, "steps": res["steps"]})
    return rows


def drive(args: argparse.Namespace) -> None:
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows, facts = [], {"model": args.model, "batch": args.batch, "budgets": args.budgets,
                       "rounds": args.rounds, "steps_per_round": args.steps}
    t_start = time.time()
    if args.shm:
        out = outdir / "preempt_shm.json"
        mpirun = str(Path(sys.executable).parent / "mpirun")
        subprocess.run([mpirun, "-np", "2", "--oversubscribe", *worker_cmd(args, out)],
                       check=True, env=env, cwd=str(ROOT), timeout=1200)
        res = json.loads(out.read_text())
        rows += rows_of(res, "shm", args)
        facts["binding"] = "2 ranks on one machine, Open MPI's default binding"
    else:
        from mxnet_mpi.testing import netns
        why = netns.unavailable()
        if why:
            print("benchmarks/preempt.py: no netns cluster here (%s); use --shm" % why)
            return
        with netns.NetnsCluster(2, cpus=netns.own_cores(2)) as cluster:
            facts["binding"] = cluster.binding()
            for rate in [float(r) for r in args.rates.split(",")]:
                for h in range(cluster.n):
                    cluster.shape(h, rate_gbit=rate)
                out = outdir / ("preempt_%g.json" % rate)
                cmd = cluster.mpirun(2, worker_cmd(args, out), per_host=1)
                subprocess.run(cmd, check=True, env=cluster.env(env), cwd=str(ROOT),
                               timeout=1200)
                res = json.loads(out.read_text())
                rows += rows_of(res, "%g Gbit/s" % rate, args)
                print("link %g Gbit/s done (%.0f s)" % (rate, time.time() - t_start), flush=True)
    facts["seconds"] = round(time.time() - t_start)
    facts["default_budget"] = budget_name(res["default_budget"])
    fwd, bwd = res["segments"]["compute"]
    facts["engine"] = (engine_settings(fwd, bwd, res["update_group"]["compute"])
                       + " where the config names no segments")
    write_outputs(rows, outdir, facts)


def write_outputs(rows: list, outdir: Path, facts: dict) -> None:
    path = outdir / "preempt.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    write_meta(path, **facts)

    def pct(v):
        return "" if v is None else "%.0f%%" % (100 * v)

    print("\n%-12s %-22s %8s %7s %14s %13s %14s %8s" % (
        "link", "config", "ms/step", "vs off", "comm after bwd", "comm after fwd",
        "bwd->fwd ms", "CPU/wall"))
    for r in rows:
        print("%-12s %-22s %8.0f %7s %14s %13s %14s %8.2f" % (
            r["link"], r["config"], r["ms_per_step"],
            "" if r["vs_off"] is None else "%.2f" % r["vs_off"],
            pct(r["comm_after_backward"]), pct(r["comm_after_forward"]),
            "" if r["backward_to_forward_ms"] is None else "%.0f" % r["backward_to_forward_ms"],
            r["cpu_per_wall"]))
    plot(rows, outdir)
    print("\nwrote %s and %s" % (path, outdir / "preempt.png"))


def plot(rows: list, outdir: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    links = list(dict.fromkeys(r["link"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / len(links)
    for i, link in enumerate(links):
        got = {r["config"]: r for r in rows if r["link"] == link}
        xs = [k + i * width for k in range(len(configs))]
        a1.bar(xs, [got[c]["ms_per_step"] if c in got else 0 for c in configs], width,
               label=link)
        train = [c for c in configs if not training_free(c)]
        a2.bar([k + i * width for k in range(len(train))],
               [got[c]["backward_to_forward_ms"] or 0 for c in train], width, label=link)
    a1.set_xticks([k + 0.4 - width / 2 for k in range(len(configs))], configs)
    a1.set_ylabel("ms per step, no wait between steps (lower is better)")
    a1.set_title("step time")
    train = [c for c in configs if not training_free(c)]
    a2.set_xticks([k + 0.4 - width / 2 for k in range(len(train))],
                  [c.replace(", ", "\n") if "segments" in c else "budget " + c
                   for c in train])
    a2.set_ylabel("ms from end of backward to next forward")
    a2.set_title("first layer's weight updated after backward")
    for a in (a1, a2):
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(outdir / "preempt.png", dpi=110)


if __name__ == "__main__":
    a = parse()
    if a.worker_json:
        worker(a)
    else:
        drive(a)

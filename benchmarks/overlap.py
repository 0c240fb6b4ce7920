"""Measure how much gradient communication each mode hides behind backprop.

    .venv/bin/python benchmarks/overlap.py [--model resnet18_v1] [--np 2]

Run without mpirun, it launches itself under mpirun once per transport
(Open MPI's shared memory, then TCP on loopback: --mca btl tcp,self), prints a
table and writes benchmarks/results/overlap.csv and overlap.png. Per step,
on a real gluoncv model:

  compute       forward + backward + update, no communication
  comm_<mode>   allreduce of the same gradient arrays in <mode>, no compute
  baseline      wait for backward to finish, then allreduce (the default
                mode's store), then update
  <mode>        Trainer(kvstore=mpi_<mode>): allreduce overlaps backprop

overlap fraction of a mode = (t_baseline - t_mode) / t_comm_<mode>: 0 means
nothing hidden, 1 means all communication hidden behind compute.

comm during backprop (from the timeline, MXNET_MPI_TIMELINE's recorder): the
share of the step's MPI time that ran before the step's last gradient was
ready, i.e. while backprop was still running. It shows whether the schedule
overlaps, whatever the hardware makes of it (on a machine whose cores are all
busy computing, overlapped communication still competes with compute).

steady step (the worker JSON's "steady", for cluster.py): the median time
between two consecutive steps' ends of backward in one timed run; unlike the
run's mean step it leaves out the pipeline filling at the run's start (its
first step has no earlier communication to overlap).
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
MODES = ("chained", "funneled", "concurrent")
TRANSPORTS = {"shm": [], "tcp": ["--mca", "btl", "tcp,self"]}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18_v1", help="gluoncv model_zoo name")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="per rank")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per configuration")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds in which every configuration runs in turn (each figure: the "
                         "median over rounds)")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--outdir", default=str(HERE / "results"))
    ap.add_argument("--worker-json", help=argparse.SUPPRESS)  # set by the driver
    # set by benchmarks/cluster.py: rows of the default store with fp16 compression
    ap.add_argument("--fp16", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args()


# ----------------------------------------------------------------- worker side
def worker(args: argparse.Namespace) -> None:
    import mxnet as mx
    from mxnet import gluon
    from workload import gluoncv_workload

    import mxnet_mpi
    from mxnet_mpi import timeline
    from mxnet_mpi.modes import DEFAULT_MODE

    rank = mxnet_mpi.rank()
    timeline.start()
    windows = {}
    work = gluoncv_workload(args.model, args.batch, args.image_size)
    net, params = work.net, work.params
    stores = {m: mx.kv.create("mpi_" + m) for m in MODES}

    probe_kv = mx.kv.create("mpi_concurrent")  # no global chain: ready = input ready
    probe_out = {}

    def fwd_bwd(probe: bool = False):
        work.forward_backward()
        if probe:
            # Reads the first layer's gradient, the last one backprop makes:
            # its "ready" time in the timeline marks the end of backprop.
            g0 = params[0].grad()
            out = probe_out.setdefault("o", mx.nd.zeros(g0.shape))
            probe_kv.pushpull("probe", g0, out=out)

    local = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1e-3}, kvstore=None)
    fwd_bwd()
    mx.nd.waitall()
    grads = [p.grad() for p in params]

    def allreduce_grads(kv) -> None:
        for i in reversed(range(len(grads))):
            kv.pushpull("g%d" % i, grads[i], priority=-i)

    def baseline():
        fwd_bwd(probe=True)
        mx.nd.waitall()  # backward done before any communication starts
        # the default mode's store, whose overlap the targets are about: with
        # another store the difference would mix two stores' allreduce times
        for i in reversed(range(len(grads))):
            stores[DEFAULT_MODE].pushpull("g%d" % i, params[i].grad(), priority=-i)
        local.step(args.batch)

    def train(kv, **trainer_args):
        tr = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1e-3}, kvstore=kv,
                           **trainer_args)
        return lambda: (fwd_bwd(True), tr.step(args.batch))

    # every configuration, in the order each round times them
    configs = {"compute": lambda: (fwd_bwd(), local.step(args.batch))}
    for m in MODES:
        configs["comm_" + m] = lambda kv=stores[m]: allreduce_grads(kv)
    configs["baseline"] = baseline
    for m in MODES:
        configs[m] = train(stores[m])
    if args.fp16:
        # the default store with fp16 on the wire: allreduce alone, then training
        kv16 = mx.kv.create("mpi")
        kv16.set_gradient_compression({"type": "fp16"})
        configs["comm_fp16"] = lambda: allreduce_grads(kv16)
        configs["fp16"] = train("mpi", compression_params={"type": "fp16"})

    per_step = {name: [] for name in configs}   # each round's mean step time
    wall_cpu = {name: [0.0, 0.0] for name in configs}
    for fn in configs.values():                 # warm-up: every store's first steps
        for _ in range(args.warmup):
            fn()
            mx.nd.waitall()
    for _ in range(args.rounds):
        for name, fn in configs.items():
            stores["chained"].pushpull("barrier", mx.nd.zeros((1,)))
            mx.nd.waitall()
            t0, w0, c0 = time.perf_counter(), time.time() * 1e6, time.process_time()
            for _ in range(args.steps):
                fn()
            mx.nd.waitall()
            wall = time.perf_counter() - t0
            per_step[name].append(wall / args.steps)
            wall_cpu[name][0] += wall
            wall_cpu[name][1] += time.process_time() - c0
            windows.setdefault(name, []).append((w0, time.time() * 1e6))
    # the median over rounds of each round's step time
    results = {name: statistics.median(v) for name, v in per_step.items()}
    cpu = {name: c / w for name, (w, c) in wall_cpu.items()}

    # Every rank's CPU/wall per configuration (a sum of one-hot vectors)
    names = list(cpu)
    size = mxnet_mpi.size()
    mine = mx.nd.zeros((len(names) * size,))
    for i, n in enumerate(names):
        mine[i * size + rank] = cpu[n]
    stores["chained"].pushpull("cpu", mine)
    vals = mine.asnumpy().tolist()
    cpu_all = {n: vals[i * size:(i + 1) * size] for i, n in enumerate(names)}
    nbytes = sum(p.grad().size * 4 for p in params)
    trace = timeline.dump(args.worker_json + ".trace.json", rank)
    events = collectives(trace)
    hidden = comm_during_backprop(events, windows)
    steady = steady_steps(events, windows)
    if rank == 0:
        with open(args.worker_json, "w") as f:
            json.dump({"times": results, "hidden": hidden, "steady": steady,
                       "grad_bytes": nbytes,
                       "cpu_per_wall": cpu_all,
                       "nparams": len(params)}, f)


def collectives(trace: str) -> list:
    """The collectives of a timeline file: each event's args and its name."""
    with open(trace) as f:
        return [dict(e["args"], name=e["name"]) for e in json.load(f)["traceEvents"]
                if e.get("cat") == "collective"]


def steady_steps(events: list, windows: dict) -> dict:
    """Per timed configuration with probes: the median of the times (s)
    between consecutive ends of backward (the probe collective, one per
    training step, is ready when backward made the first layer's gradient)
    within each timed run."""
    probes = [e for e in events if "key='probe'" in e["name"]]
    out = {}
    for config, spans in windows.items():
        gaps = []
        for w0, w1 in spans:
            ready = sorted(p["ready_us"] for p in probes if w0 <= p["enqueue_us"] <= w1)
            gaps += [(b - a) / 1e6 for a, b in zip(ready, ready[1:])]
        if gaps:
            out[config] = statistics.median(gaps)
    return out


def comm_during_backprop(events: list, windows: dict) -> dict:
    """Per timed configuration: the share of MPI time spent while backprop was
    still running, i.e. between the push of the step's collectives and the
    moment the last gradient was ready (the probe collective's ready time)."""
    out = {}
    for config, spans in windows.items():
        evs = [e for e in events if any(w0 <= e["enqueue_us"] <= w1 for w0, w1 in spans)]
        probes = sorted((e for e in evs if "key='probe'" in e["name"]),
                        key=lambda e: e["enqueue_us"])
        if not probes:
            continue
        busy = hidden = 0.0
        for e in evs:
            if "key='probe'" in e["name"] or e["enqueue_us"] < probes[0]["enqueue_us"]:
                continue
            step = [p for p in probes if p["enqueue_us"] <= e["enqueue_us"]][-1]
            lo, hi = step["enqueue_us"], step["ready_us"]
            busy += e["end_us"] - e["start_us"]
            hidden += max(0.0, min(e["end_us"], hi) - max(e["start_us"], lo))
        out[config] = hidden / busy if busy else None
    return out


# ----------------------------------------------------------------- driver side
def drive(args: argparse.Namespace) -> None:
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    mpirun = str(Path(sys.executable).parent / "mpirun")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    rows = []
    for transport in args.transports.split(","):
        out_json = outdir / ("overlap_%s.json" % transport)
        cmd = [mpirun, "-np", str(args.np), "--oversubscribe", *TRANSPORTS[transport],
               sys.executable, __file__, "--model", args.model, "--image-size",
               str(args.image_size), "--batch", str(args.batch), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--rounds", str(args.rounds),
               "--worker-json", str(out_json)]
        print("running:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env=env)
        res = json.loads(out_json.read_text())
        t = res["times"]
        for name, secs in t.items():
            mode = name if name in MODES else None
            frac = ((t["baseline"] - secs) / t["comm_" + mode]) if mode else None
            rows.append({"transport": transport, "config": name, "ms_per_step": secs * 1e3,
                         "overlap_fraction": frac,
                         "comm_during_backprop": res["hidden"].get(name),
                         "grad_MB": res["grad_bytes"] / 2**20})
    write_outputs(rows, outdir, args)


def write_outputs(rows: list, outdir: Path, args: argparse.Namespace) -> None:
    with open(outdir / "overlap.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    write_meta(outdir / "overlap.csv", rounds=args.rounds,
               model="%s (gluoncv), %d ranks, batch %d per rank, %dx%d images; per "
               "configuration the median over %d round(s) of %d timed steps"
               % (args.model, args.np, args.batch, args.image_size, args.image_size,
                  args.rounds, args.steps))
    print("\n%s, %d ranks, batch %d/rank, %dx%d images, %.1f MB of gradients"
          % (args.model, args.np, args.batch, args.image_size, args.image_size,
             rows[0]["grad_MB"]))
    print("%-9s %-16s %9s %17s %21s" % ("transport", "config", "ms/step", "overlap fraction",
                                          "comm during backprop"))
    for r in rows:
        frac = "" if r["overlap_fraction"] is None else "%.2f" % r["overlap_fraction"]
        hid = "" if r["comm_during_backprop"] is None else "%.0f%%" % (
            100 * r["comm_during_backprop"])
        print("%-9s %-16s %9.1f %17s %21s" % (r["transport"], r["config"], r["ms_per_step"],
                                              frac, hid))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    transports = sorted({r["transport"] for r in rows}, key=list(TRANSPORTS).index)
    configs = [r["config"] for r in rows if r["transport"] == transports[0]]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(transports)
    for i, tr in enumerate(transports):
        vals = [next(r["ms_per_step"] for r in rows if r["transport"] == tr and r["config"] == c)
                for c in configs]
        ax.bar([k + i * width for k in range(len(configs))], vals, width, label=tr)
    ax.set_xticks([k + width * (len(transports) - 1) / 2 for k in range(len(configs))])
    ax.set_xticklabels(configs, rotation=30, ha="right")
    ax.set_ylabel("ms per step (lower is better)")
    ax.set_title("%s, %d ranks: compute, communication and their overlap" % (args.model, args.np))
    ax.legend(title="transport")
    fig.tight_layout()
    fig.savefig(outdir / "overlap.png", dpi=110)
    print("\nwrote %s and %s" % (outdir / "overlap.csv", outdir / "overlap.png"))


if __name__ == "__main__":
    a = parse()
    if a.worker_json:
        worker(a)
    else:
        drive(a)

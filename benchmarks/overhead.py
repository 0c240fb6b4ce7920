"""Per-collective cost: our stores against MXNet's own engine op and raw MPI.

    .venv/bin/python benchmarks/overhead.py [--np 2] [--quick] [--outdir DIR]

Run without mpirun: it launches its own jobs, prints tables and writes
overhead.csv and overhead.png into --outdir (default benchmarks/results/).

calls     time per call of a dependent chain of in-place kv.pushpull(0, x) per
          mode, at 4 KB, 256 KB, 4 MB and 64 MB, interleaved in the same job
          with MXNet's own engine op on the same array (x += 1, a dependent
          chain) and raw MPI (mpi4py comm.Allreduce(MPI.IN_PLACE, numpy)); the
          median of 5 rounds. Targets (issue 10): 4 KB at most 2x (engine op +
          raw MPI) in every mode; 4 MB and 64 MB at most 1.10x raw MPI in the
          default mode.
trainer   Python-thread time of one Trainer gradient reduction (what
          trainer.step issues) for resnet50_v1b's 161 gradients: the prebuilt
          plan (one native call) against the per-key path (one pushpull per
          gradient, as the stores did before), in the same job.
step      wall time per training step (forward, backward, trainer.step; no
          read of the loss, so Python may run ahead, and for the MLP also a
          loop that reads its loss every step) with the batch-size rule
          (trainer.step: the sum of the ranks' batch sizes rides on the last
          layer's gradients and Python waits for it before pushing the
          updates) against the step without it (each rank divides by its own
          batch size: rescale_grad set locally, the plan pushed without the
          batch sizes), in one job: each round runs both back to back (order
          alternating), the ratio is the median of the rounds' ratios (robust
          to load that changes between rounds); a small MLP (Python-bound, the
          worst case for a wait) in every mode and resnet18_v1 in the default
          mode.
fusion    one step's allreduce of resnet50_v1b's gradients (no compute): time
          and collectives with fusion (default) and without
          (MXNET_MPI_FUSION_BYTES=0), over shared memory and over TCP.
idle      CPU used by a process holding an idle store for --idle-s seconds
          (/proc accounting), per mode, against a process without mxnet_mpi;
          and a compute loop's time with an idle store against without.

On this 2-core machine loopback "communication" is CPU work competing with
compute; compare rows of one run, not across runs.
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

from meta import write_meta  # benchmarks/, the script's folder

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODES = ("chained", "funneled", "concurrent")
SIZES = [4 << 10, 256 << 10, 4 << 20, 64 << 20]


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, no 64 MB")
    ap.add_argument("--parts", default="calls,trainer,step,fusion,idle")
    ap.add_argument("--idle-s", type=float, default=10.0)
    ap.add_argument("--outdir", default=str(HERE / "results"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-json", help=argparse.SUPPRESS)
    return ap.parse_args()


# ---------------------------------------------------------------- workers (under mpirun)
def _median(xs: list) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def _time_sizes(comm, MPI, mx, np, stores: dict, nbytes: int, quick: bool) -> dict:
    """Median per-call times (us) at one size: engine op, raw MPI, each store."""
    n = nbytes // 4
    reps = int(max(3, min(400, 2e8 // nbytes)))
    if quick:
        reps = max(3, reps // 4)
    x = mx.nd.zeros((n,))
    buf = np.zeros(n, np.float32)
    for kv in stores.values():
        kv.pushpull(nbytes, x)  # first use: layout recorded, call prebuilt
    x.wait_to_read()

    def engine() -> None:
        for _ in range(reps):
            x.__iadd__(0)
        x.wait_to_read()

    def raw() -> None:
        for _ in range(reps):
            comm.Allreduce(MPI.IN_PLACE, buf)

    def ours(kv) -> None:
        for _ in range(reps):
            kv.pushpull(nbytes, x)
        x.wait_to_read()

    def timed(fn, *a) -> float:
        comm.Barrier()
        t = time.perf_counter()
        fn(*a)
        return (time.perf_counter() - t) / reps

    times: dict = {k: [] for k in ("engine", "mpi4py", *stores)}
    for _ in range(3 if quick else 5):
        times["engine"].append(timed(engine))
        times["mpi4py"].append(timed(raw))
        for m, kv in stores.items():
            times[m].append(timed(ours, kv))
    assert float(x.asnumpy().max()) == 0.0   # zeros summed stay zeros: nothing was lost
    return {k: _median(v) * 1e6 for k, v in times.items()}


def worker_calls(args) -> dict:
    import mxnet as mx
    import numpy as np
    from mpi4py import MPI

    import mxnet_mpi
    stores = {m: mx.kv.create("mpi_" + m) for m in MODES}
    comm = MPI.COMM_WORLD
    sizes = SIZES[:3] if args.quick else SIZES
    out = {str(nb): _time_sizes(comm, MPI, mx, np, stores, nb, args.quick) for nb in sizes}
    mxnet_mpi.finalize()
    return out


def _resnet50_trainer(mx, store: str):
    from gluoncv.model_zoo import get_model
    net = get_model("resnet50_v1b", classes=1000)
    net.initialize(mx.init.Xavier())
    x = mx.nd.random.uniform(shape=(1, 3, 32, 32))
    with mx.autograd.record():
        loss = net(x).sum()
    loss.backward()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.0},
                               kvstore=store)
    mx.nd.waitall()
    return net, trainer


def worker_trainer(args) -> dict:
    import mxnet as mx
    from mpi4py import MPI

    import mxnet_mpi
    comm = MPI.COMM_WORLD
    net, trainer = _resnet50_trainer(mx, "mpi")
    params = trainer._params
    live = [i for i in range(len(params)) if params[i].grad_req != "null"]
    reps = 5 if args.quick else 20
    plan, perkey = [], []
    trainer.allreduce_grads()   # creates the store (Trainer does it lazily)
    mx.nd.waitall()
    kv = trainer._kvstore
    for _ in range(reps):
        comm.Barrier()
        t = time.perf_counter()
        trainer.allreduce_grads()
        plan.append(time.perf_counter() - t)
        mx.nd.waitall()
        comm.Barrier()
        t = time.perf_counter()
        for i in reversed(live):   # the per-key path: one pushpull per gradient
            kv._reduce([(i, params[i].list_grad(), None)], lambda k: -k)
        perkey.append(time.perf_counter() - t)
        mx.nd.waitall()
    res = {"gradients": len(live), "plan_ms": _median(plan) * 1e3,
           "per_key_ms": _median(perkey) * 1e3, "mode": kv.mode}
    mxnet_mpi.finalize()
    return res


def _step_model(mx, which: str):
    """(net, input shape, classes) for the step part."""
    if which.startswith("mlp"):
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Dense(256, activation="relu"),
                mx.gluon.nn.Dense(256, activation="relu"), mx.gluon.nn.Dense(10))
        return net, (32, 64), 10
    from gluoncv.model_zoo import get_model
    return get_model("resnet18_v1", classes=10), (8, 3, 32, 32), 10


def _time_steps(mx, comm, which: str, mode: str, quick: bool) -> dict:
    """Median ms per step with and without the batch-size rule, and the median
    of the per-round ratios (each round times both, back to back)."""
    net, shape, classes = _step_model(mx, which)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": 0.01, "momentum": 0.9}, kvstore="mpi_" + mode)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    x = mx.nd.random.uniform(shape=shape)
    y = mx.nd.array([i % classes for i in range(shape[0])])
    b = shape[0]

    def with_rule():
        trainer.step(b)

    def without_rule():   # each rank divides by its own batch size
        trainer._optimizer.rescale_grad = trainer._scale / b
        trainer._allreduce_grads()
        trainer._update()

    def run(step_fn, n: int) -> float:
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(n):
            with mx.autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            step_fn()
            if which == "mlp+read":
                loss.mean().asscalar()   # as metric and logging code does
        mx.nd.waitall()
        return (time.perf_counter() - t) / n

    n = 20 if which.startswith("mlp") else 3
    run(with_rule, 3)
    run(without_rule, 3)
    times: dict = {"rule": [], "no_rule": []}
    order = (("rule", with_rule), ("no_rule", without_rule))
    for r in range(5 if quick else 21):
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            times[name].append(run(fn, n))
    ratios = [a / b for a, b in zip(times["rule"], times["no_rule"])]
    out = {k: _median(v) * 1e3 for k, v in times.items()}
    out["ratio"] = _median(ratios)
    return out


def worker_step(args) -> dict:
    import mxnet as mx
    from mpi4py import MPI

    import mxnet_mpi
    mode = args.worker.split(":")[1]
    models = ("mlp", "mlp+read") + (("resnet18_v1",) if mode == modes_default() else ())
    out = {which: _time_steps(mx, MPI.COMM_WORLD, which, mode, args.quick) for which in models}
    mxnet_mpi.finalize()
    return out


def modes_default() -> str:
    import mxnet_mpi.modes as modes_mod
    return modes_mod.DEFAULT_MODE


def worker_fusion(args) -> dict:
    import mxnet as mx
    from mpi4py import MPI

    import mxnet_mpi
    comm = MPI.COMM_WORLD
    net, trainer = _resnet50_trainer(mx, "mpi_" + args.worker.split(":")[1])
    reps = 3 if args.quick else 10
    times = []
    trainer.allreduce_grads()
    mx.nd.waitall()
    issued0 = trainer._kvstore.stream.info()[0]
    for _ in range(reps):
        comm.Barrier()
        t = time.perf_counter()
        trainer.allreduce_grads()
        mx.nd.waitall()
        times.append(time.perf_counter() - t)
    calls = (trainer._kvstore.stream.info()[0] - issued0) // reps
    mxnet_mpi.finalize()
    return {"step_comm_ms": _median(times) * 1e3, "collectives": calls}


def worker_idle(args) -> dict:
    kind = args.worker.split(":")[1]
    import mxnet as mx
    store = None
    if kind != "none":
        import mxnet_mpi  # noqa: F401
        store = mx.kv.create("mpi_" + kind)
        a = mx.nd.ones((1000,))
        store.pushpull(0, a)
        a.wait_to_read()
    t0 = os.times()
    time.sleep(args.idle_s)
    t1 = os.times()
    cpu = (t1.user - t0.user) + (t1.system - t0.system)
    # a compute loop with the idle store alive (or without one)
    a = mx.nd.random.uniform(shape=(384, 384))
    a.wait_to_read()
    t = time.perf_counter()
    for _ in range(30 if args.quick else 120):
        b = mx.nd.dot(a, a)
        b.wait_to_read()
    compute = time.perf_counter() - t
    return {"cpu_pct": 100.0 * cpu / args.idle_s, "compute_s": compute}


WORKERS = {"calls": worker_calls, "trainer": worker_trainer, "step": worker_step,
           "fusion": worker_fusion, "idle": worker_idle}


# ---------------------------------------------------------------- driver
def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMP_NUM_THREADS": "1",
                "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")})
    env.update(extra or {})
    return env


def run_job(args, worker: str, np_: int, extra_env: dict | None = None, mpi: bool = True):
    out = Path(args.outdir) / (".overhead_%s.json" % worker.replace(":", "_"))
    cmd = [sys.executable, __file__, "--worker", worker, "--worker-json", str(out),
           "--idle-s", str(args.idle_s)] + (["--quick"] if args.quick else [])
    if mpi:
        mpirun = str(Path(sys.executable).parent / "mpirun")
        cmd = [mpirun, "-np", str(np_), "--oversubscribe"] + cmd
    subprocess.run(cmd, check=True, env=_env(extra_env), cwd=str(ROOT), timeout=1800)
    data = json.loads(out.read_text())
    out.unlink()
    return data


def worker_main(args) -> None:
    name = args.worker.split(":")[0]
    res = WORKERS[name](args)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    if rank == 0:
        Path(args.worker_json).write_text(json.dumps(res))


def main() -> None:
    args = parse()
    if args.worker:
        worker_main(args)
        return
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    rows = []
    import mxnet_mpi.modes as modes_mod
    default = modes_mod.DEFAULT_MODE
    if "calls" in parts:
        res = run_job(args, "calls", args.np)
        print("\nper call (us, median of rounds, %d ranks, shared memory)" % args.np)
        print("%10s %9s %9s %9s %9s %9s   %s" % ("bytes", "engine", "mpi4py", *MODES, "checks"))
        for nbytes, r in res.items():
            budget = 2 * (r["engine"] + r["mpi4py"])
            checks = []
            if int(nbytes) == 4 << 10:
                checks = ["%s %s" % (m, "ok" if r[m] <= budget else "OVER %.2fx" % (r[m] / budget))
                          for m in MODES]
            elif int(nbytes) >= 4 << 20:
                ratio = r[default] / r["mpi4py"]
                checks = ["%s %.2fx raw %s" % (default, ratio, "ok" if ratio <= 1.10 else "OVER")]
            print("%10s %9.1f %9.1f %9.1f %9.1f %9.1f   %s" % (
                nbytes, r["engine"], r["mpi4py"], *[r[m] for m in MODES], "; ".join(checks)))
            for k, v in r.items():
                rows.append({"part": "calls", "bytes": nbytes, "what": k, "value": round(v, 2),
                             "unit": "us"})
    described = {}   # what the trainer and fusion parts ran, for the note
    if "trainer" in parts:
        r = run_job(args, "trainer", args.np)
        described["trainer"] = ("resnet50_v1b, %d gradient arrays, kvstore='mpi' (the default "
                                "mode: %s)" % (r["gradients"], r["mode"]))
        print("\nTrainer gradient reduction, Python-thread time, resnet50_v1b (%d gradients, "
              "mode %s)" % (r["gradients"], r["mode"]))
        print("  prebuilt plan (one native call): %.2f ms; one pushpull per gradient: %.2f ms "
              "(%.0fx)" % (r["plan_ms"], r["per_key_ms"], r["per_key_ms"] / r["plan_ms"]))
        rows += [{"part": "trainer", "bytes": "", "what": "plan", "value": round(r["plan_ms"], 3),
                  "unit": "ms"},
                 {"part": "trainer", "bytes": "", "what": "per_key",
                  "value": round(r["per_key_ms"], 3), "unit": "ms"}]
    if "step" in parts:
        print("\ntraining step wall time (ms, median of rounds, %d ranks, equal batch sizes): "
              "batch-size rule vs each rank dividing by its own" % args.np)
        print("(ratio: the median of the rounds' ratios, each round timing both)")
        print("%-12s %-12s %10s %10s %8s" % ("model", "mode", "rule", "no rule", "ratio"))
        for mode in MODES:
            res = run_job(args, "step:" + mode, args.np)
            for which, r in res.items():
                print("%-12s %-12s %10.2f %10.2f %7.3fx" % (which, mode, r["rule"],
                                                           r["no_rule"], r["ratio"]))
                rows += [{"part": "step", "bytes": which, "what": "%s %s" % (mode, k),
                          "value": round(v, 3), "unit": "x" if k == "ratio" else "ms"}
                         for k, v in r.items()]
    if "fusion" in parts:
        print("\nresnet50_v1b gradient allreduce per step (no compute), %d ranks" % args.np)
        print("%-10s %-12s %-10s %12s %12s" % ("transport", "mode", "fusion", "ms/step",
                                               "collectives"))
        for transport, env in (("shm", {}), ("tcp", {"OMPI_MCA_btl": "self,tcp"})):
            for mode in MODES:
                for fusion in ("on", "off"):
                    extra = dict(env)
                    if fusion == "off":
                        extra["MXNET_MPI_FUSION_BYTES"] = "0"
                    r = run_job(args, "fusion:" + mode, args.np, extra)
                    print("%-10s %-12s %-10s %12.1f %12d" % (transport, mode, fusion,
                                                             r["step_comm_ms"], r["collectives"]))
                    rows.append({"part": "fusion", "bytes": transport,
                                 "what": "%s fusion %s" % (mode, fusion),
                                 "value": round(r["step_comm_ms"], 2), "unit": "ms"})
    if "idle" in parts:
        print("\nidle store: CPU over %.0f s, and a compute loop's time" % args.idle_s)
        base = run_job(args, "idle:none", 1, mpi=False)
        print("  no mxnet_mpi: %.2f%% of a core, compute %.3f s" % (base["cpu_pct"],
                                                                    base["compute_s"]))
        rows.append({"part": "idle", "bytes": "", "what": "none cpu_pct",
                     "value": round(base["cpu_pct"], 3), "unit": "%"})
        for mode in MODES:
            r = run_job(args, "idle:" + mode, args.np)
            ok = "ok" if r["cpu_pct"] < 1.0 else "OVER 1%"
            print("  %-10s: %.2f%% of a core (%s), compute %.3f s (%.2fx no store)" % (
                mode, r["cpu_pct"], ok, r["compute_s"], r["compute_s"] / base["compute_s"]))
            rows.append({"part": "idle", "bytes": "", "what": mode + " cpu_pct",
                         "value": round(r["cpu_pct"], 3), "unit": "%"})
            rows.append({"part": "idle", "bytes": "", "what": mode + " compute_vs_none",
                         "value": round(r["compute_s"] / base["compute_s"], 3), "unit": "x"})
    with open(outdir / "overhead.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["part", "bytes", "what", "value", "unit"])
        w.writeheader()
        w.writerows(rows)
    if "fusion" in parts:
        described["fusion"] = "resnet50_v1b"
    write_meta(outdir / "overhead.csv", quick=args.quick, parts=described)
    plot(rows, outdir / "overhead.png")
    print("\nwrote %s and %s" % (outdir / "overhead.csv", outdir / "overhead.png"))


def plot(rows: list, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    calls = [r for r in rows if r["part"] == "calls"]
    if not calls:
        return
    sizes = sorted({int(r["bytes"]) for r in calls})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for what in ("engine", "mpi4py", *MODES):
        ys = [next(r["value"] for r in calls if int(r["bytes"]) == s and r["what"] == what)
              for s in sizes]
        ax.plot(sizes, ys, marker="o", label=what)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per call")
    ax.set_ylabel("microseconds per call")
    ax.set_title("pushpull per call vs MXNet's engine op and raw MPI")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()

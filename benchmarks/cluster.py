"""Overlap and scaling on a cluster in a box: N hosts x 1 rank over shaped links.

    .venv/bin/python benchmarks/cluster.py [--quick] [--hosts 2] [--outdir benchmarks/results]

Needs root (network namespaces, see mxnet_mpi/testing/netns.py). N + 1
"hosts" share one bridge: one rank on each of hosts 0..N-1, the ps-lite
scheduler and server on host N; every host's link is shaped with tbf to the
same rate, so a transfer takes wall time without taking CPU (unlike loopback).
Each rank host runs on cores of its own (``--bind cores``, the default: a
cpuset per host, Open MPI's binding off), as separate machines would; the
compute-only row's CPU time / wall time shows whether each rank had a core.

0. Before the rows of each link: the link check (benchmarks/linkcheck.py),
   printed and written to linkcheck.csv: a plain TCP stream's rate and round
   trip, a plain TCP exchange of the gradients' bytes each way with its CPU
   time / wall time (the kernel's share of any store's CPU while it
   communicates), an MPI round trip, a raw MPI allreduce of the gradients
   against the wire time, with Open MPI's defaults and with mxnet_mpi's.

1. Calibrate on an unshaped link: compute time per step and gradient bytes.
2. Pick link rates so that communication is about 0.5x, 1x and 2x compute:
   rate = grad_bits / (k x compute) for k in 0.5, 1, 2 (a 2-rank ring
   allreduce moves the gradient bytes once each way over each link).
3. Per rate, on a gluoncv model (resnet18_v1 with --quick, resnet50_v1b
   otherwise), the rows of benchmarks/overlap.py's worker, run by the cluster's
   mpirun in ``--rounds`` alternating rounds (each figure the median):
   compute only; comm only (the default mode's allreduce of the gradients, no
   compute); no overlap (backward, wait, then the default mode's allreduce); each
   mode (``mpi`` = the default mode, ``mpi_<mode>`` the others); ``mpi fp16``
   (the default mode with fp16 gradient compression: half the bytes on the
   wire, its comm-only time in the note); with Horovod 0.28.1 importable,
   rows with equal compute, all with oneDNN off (which Horovod needs), timed by
   this file's worker under the same mpirun, binding, cpusets and Open MPI
   settings: ``mpi oneDNN off`` (our default store), ``horovod`` (its
   DistributedTrainer, its own settings at their defaults) and ``horovod
   yield`` (the same with Open MPI's yield_when_idle, a sensitivity row), each
   with its own compute-only and comm-only times, its CPU while communicating
   and its library threads' CPU during compute (the own_* and
   lib_cpu_in_compute columns; without Horovod, skipped rows), the three in
   ``--rounds`` alternating rounds, medians (a Horovod round that crashes or
   hangs is left out and named in the row's note; our store's never is);
   ps-lite
   ``dist_sync`` with its server on host N, and with more than 2 hosts (or
   ``--server-per-host``) ``dist_sync 1/host``: one server on each worker's
   host.

Writes cluster.csv (link_gbit, store, ms_per_step, compute_ms, comm_ms,
grad_MB, hosts, wire_ms = the ring's time on the wire, cpu_per_wall = a
rank's CPU time / wall time in that row (mean over ranks), bound_overlap_ms =
max(compute, comm), bound_serial_ms = compute + comm, vs_bound = ms_per_step /
bound_overlap_ms, vs_no_overlap, steady_ms = a training row's median time
between two consecutive steps' ends of backward, from rank 0's timeline: the
step once the pipeline is full, which the mean over a few timed steps
overstates by the filling at each timed run's start), cluster.png,
linkcheck.csv and cluster.json
(the run's conditions: machine, date, binding, load average, transport
settings, MXNet's engine settings). Every row runs with the engine segments
and update groups that mxnet_mpi gives a rank of an MPI job (dist_sync's
workers too).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from linkcheck import check_link, print_check, wire_ms  # noqa: E402
from meta import code_version, command_line, engine_settings  # noqa: E402

from _mxnet_mpi_autoload import (  # noqa: E402
    AGGREGATION_VAR,
    backward_segment_ops,
    engine_defaults,
    forward_segment_ops,
)

MODES = ("chained", "funneled", "concurrent")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="resnet18_v1, fewer steps (< 5 min)")
    ap.add_argument("--model", help="gluoncv model (default resnet18_v1 quick, resnet50_v1b)")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="per rank")
    ap.add_argument("--steps", type=int, help="timed steps per row and round (default 2 quick, 8)")
    ap.add_argument("--ratios", default="0.5,1,2", help="target comm/compute ratios")
    ap.add_argument("--rates", help="link rates in Gbit/s (skips the calibration choice)")
    ap.add_argument("--chunk-bytes", type=int,
                    help="MXNET_MPI_CHUNK_BYTES for our stores (default: the product's)")
    ap.add_argument("--hosts", type=int, default=2, help="hosts with one rank each")
    ap.add_argument("--bind", choices=("cores", "none"), default="cores",
                    help="cores: a cpuset per rank host (default); none: share all cores")
    ap.add_argument("--rounds", type=int, default=2,
                    help="rounds in which the rows of one process (overlap.py's) and the "
                         "equal-compute rows run in turn; each figure: the median over them")
    ap.add_argument("--no-linkcheck", action="store_true", help="skip the link check")
    ap.add_argument("--server-per-host", action="store_true",
                    help="also dist_sync with one server per host (always with > 2 hosts)")
    ap.add_argument("--outdir", default=str(HERE / "results"))
    ap.add_argument("--worker", choices=("pslite", "horovod", "mpi"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.model = args.model or ("resnet18_v1" if args.quick else "resnet50_v1b")
    args.steps = args.steps or (2 if args.quick else 8)
    args.warmup = 1 if args.quick else 2
    return args


# ----------------------------------------------------------------- peer workers
def peer_worker(args: argparse.Namespace) -> None:
    """Time Trainer steps with ps-lite dist_sync, Horovod's DistributedTrainer or
    (as Horovod's equal-compute partner) our default store."""
    import mxnet as mx
    from mxnet import gluon
    from workload import gluoncv_workload  # benchmarks/, the script's folder

    work = gluoncv_workload(args.model, args.batch, args.image_size)
    net = work.net
    opt = {"learning_rate": 1e-3}

    cpu = {}

    def timed(name: str, step) -> float:
        for _ in range(2 if args.steps > 3 else 1):
            step()
            mx.nd.waitall()
        t0, c0, th0 = time.perf_counter(), time.process_time(), thread_cpu()
        for _ in range(args.steps):
            step()
        mx.nd.waitall()
        wall = time.perf_counter() - t0
        th1 = thread_cpu()
        cpu[name] = (time.process_time() - c0) / wall
        # CPU of the threads the communication library started (its init below)
        cpu[name + "_lib"] = sum(th1.get(t, 0) - th0.get(t, 0) for t in th1
                                 if t not in before) / wall
        return wall / args.steps

    def train(trainer):
        def step():
            work.forward_backward()
            trainer.step(args.batch)
        return step

    before = set(thread_cpu())   # this process's threads before the library starts
    out = {}
    local = gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=None)
    if args.worker == "horovod":
        import horovod.mxnet as hvd
        hvd.init()
        rank = hvd.rank()
        # Horovod runs with oneDNN off (see equal_compute_run): its own compute-only time
        out["compute"] = timed("compute", train(local))
        hvd.broadcast_parameters(net.collect_params(), root_rank=0)
        trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", opt)
    elif args.worker == "mpi":
        import mxnet_mpi
        rank = mxnet_mpi.rank()
        # the store starts before the compute-only loop, as Horovod's hvd.init() does
        trainer = gluon.Trainer(net.collect_params(), "sgd", opt, kvstore="mpi")
        trainer._init_kvstore()
        out["compute"] = timed("compute", train(local))
    else:
        kv = mx.kv.create("dist_sync")
        rank = kv.rank
        trainer = gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=kv)
    out["step"] = timed("step", train(trainer))
    if args.worker in ("horovod", "mpi"):
        # comm only: the Trainer's allreduce of the gradients (the last backward's), no compute
        out["comm"] = timed("comm", trainer.allreduce_grads)
    out["cpu_per_wall"] = cpu
    if rank == 0:
        Path(args.worker_json).write_text(json.dumps(out))


def thread_cpu() -> dict:
    """CPU seconds of each of this process's threads, by thread id (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:   # the thread ended meanwhile
            continue
        out[task.name] = (int(fields[11]) + int(fields[12])) / tick   # utime + stime
    return out


# ----------------------------------------------------------------- driver
def overlap_run(cluster, args: argparse.Namespace, out_json: Path, steps: int,
                warmup: int, rounds: int = 1) -> dict:
    """benchmarks/overlap.py's worker on hosts 0..N-1 (one rank each): its
    configurations in `rounds` alternating rounds."""
    cmd = cluster.mpirun(args.hosts, [sys.executable, str(HERE / "overlap.py"), "--model",
                                      args.model,
                             "--image-size", str(args.image_size), "--batch", str(args.batch),
                             "--steps", str(steps), "--warmup", str(warmup),
                             "--rounds", str(rounds),
                             "--worker-json", str(out_json), "--fp16"], per_host=1)
    subprocess.run(cmd, check=True, env=job_env(cluster, args.chunk_bytes), cwd=str(ROOT),
                   timeout=600)
    return json.loads(out_json.read_text())


def job_env(cluster, chunk_bytes: int | None = None) -> dict:
    env = cluster.env()
    if chunk_bytes:
        env["MXNET_MPI_CHUNK_BYTES"] = str(chunk_bytes)
    # MXNet's segments and update groups as mxnet_mpi sets them in a rank of an MPI job,
    # for every row alike (dist_sync's workers are no MPI job); the caller's wins
    env.update(engine_defaults(dict(env, OMPI_COMM_WORLD_SIZE="2")))
    env.update(OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def pslite_run(cluster, args: argparse.Namespace, out_json: Path,
               server_per_host: bool = False) -> dict:
    """dist_sync: one worker on each of hosts 0..N-1; the scheduler on host N,
    and one server on host N or (`server_per_host`) one on each worker's host."""
    from mxnet_mpi.launch import free_port

    env = job_env(cluster)
    ps = args.hosts
    servers = list(range(args.hosts)) if server_per_host else [ps]
    dmlc = {"DMLC_PS_ROOT_URI": cluster.addrs[ps], "DMLC_PS_ROOT_PORT": str(free_port()),
            "DMLC_NUM_SERVER": str(len(servers)), "DMLC_NUM_WORKER": str(args.hosts),
            "PS_VERBOSE": "0"}
    procs, workers = [], []
    try:
        for host, role in [(ps, "scheduler")] + [(h, "server") for h in servers]:
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
            cwd=str(ROOT)) for h in range(args.hosts)]
        for w in workers:
            if w.wait(timeout=600) != 0:
                raise RuntimeError("dist_sync worker failed")
        return json.loads(out_json.read_text())
    finally:
        for p in procs + workers:
            if p.poll() is None:
                p.kill()
                p.wait()


# The rows with equal compute (oneDNN off): (store, worker, extra environment).
# "horovod" runs at Horovod's and our transport defaults; "horovod yield" adds
# Open MPI's yield_when_idle, which stops its threads polling the core that
# computes (not a default of Horovod's: a sensitivity row, not the comparison).
EQUAL_COMPUTE = (("mpi oneDNN off", "mpi", {}), ("horovod", "horovod", {}),
                 ("horovod yield", "horovod", {"OMPI_MCA_mpi_yield_when_idle": "1"}))
# Columns filled for those rows only, measured in the row's own process:
# own_compute_ms / own_comm_ms (compute only, and the Trainer's allreduce of the
# gradients alone), own_comm_cpu_per_wall (CPU time / wall time while comm only),
# lib_cpu_in_compute (CPU of the threads the library started, in cores, during
# compute only: Horovod's background thread, our store's threads, MPI's).
OWN_COLUMNS = ("own_compute_ms", "own_comm_ms", "own_comm_cpu_per_wall", "lib_cpu_in_compute")


def horovod_installed() -> str | None:
    """Horovod's version where horovod.mxnet imports, else None."""
    probe = subprocess.run([sys.executable, "-c", "import horovod.mxnet, horovod; "
                            "print(horovod.__version__)"], capture_output=True, text=True)
    if probe.returncode != 0:
        return None
    return probe.stdout.strip() or "?"


#: Seconds a Horovod or partner run may take (about 10-40 s when it works).
PEER_TIMEOUT_S = 300


def equal_compute_run(cluster, args: argparse.Namespace, out_json: Path, kind: str,
                      extra_env: dict | None = None) -> dict:
    """Horovod's DistributedTrainer (`kind` "horovod") or our default store
    (`kind` "mpi") on hosts 0 and 1, by this file's own worker with one timing
    loop, oneDNN off and the same Open MPI settings for both:
    {'step', 'compute'} in seconds, or for Horovod's worker {'failed': why}
    when it crashed or hung."""
    from mxnet_mpi import transport

    cmd = cluster.mpirun(args.hosts, [sys.executable, __file__, "--worker", kind,
                                      "--worker-json",
                             str(out_json), "--model", args.model, "--image-size",
                             str(args.image_size), "--batch", str(args.batch),
                             "--steps", str(args.steps)], per_host=1)
    # Horovod 0.28.1 cannot reduce arrays in oneDNN layouts (MXNetError "We can't
    # generate TBlob for MKLDNN data"): it runs with oneDNN off, and so does its
    # partner row. Our transport defaults go into the environment explicitly, so
    # Horovod's MPI starts with them too (not only through `import mxnet_mpi`).
    env = dict(job_env(cluster), MXNET_MKLDNN_ENABLED="0", MXNET_STORAGE_FALLBACK_LOG_VERBOSE="0")
    transport.apply(env)
    env.update(extra_env or {})
    out_json.unlink(missing_ok=True)
    try:
        subprocess.run(cmd, check=True, env=env, cwd=str(ROOT), timeout=PEER_TIMEOUT_S)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        if kind == "mpi":
            raise   # our own store failing is a defect, never a missing row
        # Horovod's worker crashed or hung (seen once: a segfault, then a hang
        # of its peer): this round is lost, the run goes on without its ranks
        for h in range(args.hosts):
            cluster.kill_host(h)
        return {"failed": ("timed out after %d s" % PEER_TIMEOUT_S
                           if isinstance(exc, subprocess.TimeoutExpired)
                           else "exit %d" % exc.returncode)}
    return json.loads(out_json.read_text())


def median_run(runs: list) -> dict:
    """equal_compute_run's results over rounds: the median of every figure."""
    def med(values):
        if isinstance(values[0], dict):
            return {k: med([v[k] for v in values]) for k in values[0]}
        return statistics.median(values)
    return med(runs)


def choose_rates(grad_bytes: int, compute_s: float, ratios: list, hosts: int = 2) -> list:
    """Link rates (Gbit/s, 2 significant digits) at which a ring allreduce of
    `grad_bytes` over `hosts` ranks takes `ratio` x `compute_s` on the wire."""
    out = []
    for k in ratios:
        gbit = wire_ms(grad_bytes, 1.0, hosts) / 1e3 / (k * compute_s)
        out.append(float("%.2g" % gbit))
    return out


def loadavg() -> str:
    """This machine's 1-minute load average, as text."""
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def mean(xs: list) -> float | None:
    return sum(xs) / len(xs) if xs else None


def drive(args: argparse.Namespace) -> None:
    from mxnet_mpi import transport
    from mxnet_mpi.modes import DEFAULT_MODE
    from mxnet_mpi.testing import netns

    why = netns.unavailable()
    if why:
        print("benchmarks/cluster.py: skipped, no netns cluster here: " + why)
        return
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    code = code_version()   # of what runs, before any edit meanwhile
    rows, checks, loads = [], [], [loadavg()]
    horovod = horovod_installed()
    cpus = netns.own_cores(args.hosts) + [None] if args.bind == "cores" else None
    with netns.NetnsCluster(args.hosts + 1, cpus=cpus) as cluster:
        binding = cluster.binding()
        env = job_env(cluster)
        engine = engine_settings(forward_segment_ops(env), backward_segment_ops(env),
                                 env.get(AGGREGATION_VAR, "4"))
        print("binding: %s; transport: %s; MXNet %s; load average %s"
              % (binding, transport.describe(cluster.env()), engine, loads[0]), flush=True)
        grad_bytes = None
        if args.rates:
            rates = [float(r) for r in args.rates.split(",")]
            calib = None
        else:
            calib = overlap_run(cluster, args, outdir / "cluster_calib.json", steps=2, warmup=1)
            compute = calib["times"]["compute"]
            grad_bytes = calib["grad_bytes"]
            rates = choose_rates(grad_bytes, compute,
                                 [float(r) for r in args.ratios.split(",")], args.hosts)
            print("calibration (unshaped link): compute %.0f ms/step (CPU/wall per rank %s), "
                  "%.1f MB of gradients; link rates for comm/compute = %s: %s Gbit/s"
                  % (compute * 1e3, fmt_cpu(calib, "compute"), grad_bytes / 2**20,
                     args.ratios, rates), flush=True)

        def link_check(rate: float, nbytes: int) -> None:
            if args.no_linkcheck:
                return
            row = check_link(cluster, rate, nbytes, outdir)
            row["load"] = loadavg()
            print_check(row)
            checks.append(row)

        for rate in rates:
            for h in range(cluster.n):
                cluster.shape(h, rate_gbit=rate)
            if grad_bytes:
                link_check(rate, grad_bytes)
            loads.append(loadavg())
            res = overlap_run(cluster, args, outdir / ("cluster_%g.json" % rate),
                              steps=args.steps, warmup=args.warmup, rounds=args.rounds)
            if not grad_bytes:
                grad_bytes = res["grad_bytes"]
                link_check(rate, grad_bytes)
            t = res["times"]
            default = DEFAULT_MODE
            compute, comm = t["compute"], t["comm_" + default]
            wire = wire_ms(res["grad_bytes"], rate, args.hosts)

            def row(store, secs, skipped=False, rate=rate, compute=compute, comm=comm,
                    res=res, note="", cpu=None, wire=wire, cpu_value=None, own=None):
                steady = res.get("steady", {}).get(cpu) if cpu else None
                rows.append({"link_gbit": rate, "store": store,
                             "ms_per_step": None if skipped else secs * 1e3,
                             "compute_ms": compute * 1e3, "comm_ms": comm * 1e3,
                             "grad_MB": res["grad_bytes"] / 2**20, "hosts": args.hosts,
                             "wire_ms": wire,
                             "cpu_per_wall": cpu_value if cpu_value is not None
                             else mean(res.get("cpu_per_wall", {}).get(cpu, [])),
                             "chunk_bytes": args.chunk_bytes or "default",
                             **{k: (own or {}).get(k) for k in OWN_COLUMNS},
                             "steady_ms": None if steady is None else steady * 1e3,
                             "note": note})
            row("compute only", compute, cpu="compute",
                note="CPU/wall per rank %s; %s; load average %s"
                % (fmt_cpu(res, "compute"), binding, loads[-1]))
            row("comm only", comm, cpu="comm_" + default,
                note="default mode (%s); %.2fx the wire time" % (default, comm * 1e3 / wire))
            row("no overlap", t["baseline"], cpu="baseline",
                note="backward, then the default mode's (%s) allreduce" % default)
            row("mpi", t[default], cpu=default)
            for m in MODES:
                if m != default:
                    row("mpi_" + m, t[m], cpu=m)
            row("mpi fp16", t["fp16"], cpu="fp16",
                note="compression fp16: %.1f MB on the wire, comm only %.0f ms"
                % (res["grad_bytes"] / 2 / 2**20, t["comm_fp16"] * 1e3))
            if not horovod:
                for store, _kind, _env in EQUAL_COMPUTE:
                    row(store, None, skipped=True, note="Horovod not installed")
            else:
                # in alternating rounds, so that load changes hit all three alike
                runs = {store: [] for store, _kind, _env in EQUAL_COMPUTE}
                for _ in range(args.rounds):
                    for store, kind, extra in EQUAL_COMPUTE:
                        runs[store].append(equal_compute_run(
                            cluster, args, outdir / ("cluster_%s_%g.json" % (kind, rate)),
                            kind, extra))
                for store, _kind, extra in EQUAL_COMPUTE:
                    done = [r for r in runs[store] if "failed" not in r]
                    failed = "".join("; round %d failed (%s)" % (i + 1, r["failed"])
                                     for i, r in enumerate(runs[store]) if "failed" in r)
                    if not done:
                        row(store, None, skipped=True, note="every round failed" + failed)
                        continue
                    eq = median_run(done)
                    c = eq["cpu_per_wall"]
                    row(store, eq["step"], cpu_value=c["step"],
                        own={"own_compute_ms": eq["compute"] * 1e3,
                             "own_comm_ms": eq["comm"] * 1e3,
                             "own_comm_cpu_per_wall": c["comm"],
                             "lib_cpu_in_compute": c["compute_lib"]},
                        note="oneDNN off (equal compute with Horovod)%s; medians of %d "
                        "alternating rounds (steps %s ms); in its own process: "
                        "compute only %.0f ms (the library's threads %.2f of a core meanwhile), "
                        "comm only %.0f ms (CPU/wall %.2f)%s"
                        % ("".join(", %s=%s" % kv for kv in extra.items()), len(done),
                           "/".join("%.0f" % (r["step"] * 1e3) for r in done),
                           eq["compute"] * 1e3, c["compute_lib"], eq["comm"] * 1e3, c["comm"],
                           failed))
            ps = pslite_run(cluster, args, outdir / ("cluster_ps_%g.json" % rate))
            row("dist_sync", ps["step"], note="server on host %d" % args.hosts)
            if args.hosts > 2 or args.server_per_host:
                ps = pslite_run(cluster, args, outdir / ("cluster_ps_%g.json" % rate), True)
                row("dist_sync 1/host", ps["step"], note="one server on each worker's host")
            print("link %g Gbit/s done (%.0f s so far)" % (rate, time.time() - t_start),
                  flush=True)
    loads.append(loadavg())
    meta = {"note": "%s; %d hosts x 1 rank; %s; transport %s; MXNet %s; %d alternating "
                    "rounds per process, medians; machine %s (%d cores, shared with other "
                    "work); load average %s"
                    % (time.strftime("%Y-%m-%d", time.gmtime(t_start)), args.hosts, binding,
                       transport.describe(), engine, args.rounds, platform.node(),
                       os.cpu_count(), "-".join(loads)),
            "rounds": args.rounds,
            "engine": engine + ", every row",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
            "machine": "%s, %d cores" % (platform.node(), os.cpu_count()),
            "binding": binding, "load_average": loads, "transport": transport.describe(),
            "horovod": horovod and "%s, its own settings (HOROVOD_CYCLE_TIME, fusion "
                       "threshold) at their defaults; under the cluster's mpirun, not horovodrun"
                       % horovod,
            "model": args.model, "hosts": args.hosts, "batch": args.batch,
            "image_size": args.image_size, "steps": args.steps, "quick": args.quick,
            "seconds": round(time.time() - t_start), "code": code, "command": command_line()}
    (outdir / "cluster.json").write_text(json.dumps(meta, indent=1) + "\n")
    if checks:
        with open(outdir / "linkcheck.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(checks[0]))
            w.writeheader()
            w.writerows(checks)
        for c in checks:
            print_check(c)
    write_outputs(rows, outdir, args, calib)
    print("total %.0f s" % (time.time() - t_start))


def fmt_cpu(res: dict, name: str) -> str:
    vals = res.get("cpu_per_wall", {}).get(name)
    return "/".join("%.2f" % v for v in vals) if vals else "?"


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
    print("\n%s, %d hosts x 1 rank, batch %d/rank, %dx%d images, %.1f MB of gradients%s"
          % (args.model, args.hosts, args.batch, args.image_size, args.image_size,
             rows[0]["grad_MB"],
             "" if calib is None else ", calibration compute %.0f ms"
             % (calib["times"]["compute"] * 1e3)))
    print("%9s %-13s %9s %9s %9s %7s %12s %11s %9s %13s %8s  %s" % (
        "link Gb/s", "store", "ms/step", "compute", "comm", "wire", "max(c,comm)", "c+comm",
        "vs max", "no-overlap/x", "CPU/wall", "note"))
    for r in rows:
        step = "skipped" if r["ms_per_step"] is None else "%.0f" % r["ms_per_step"]
        vs = "" if r["vs_bound"] is None else "%.2f" % r["vs_bound"]
        sp = "" if r["vs_no_overlap"] is None else "%.2f" % r["vs_no_overlap"]
        cpu = "" if r["cpu_per_wall"] is None else "%.2f" % r["cpu_per_wall"]
        print("%9g %-13s %9s %9.0f %9.0f %7.0f %12.0f %11.0f %9s %13s %8s  %s" % (
            r["link_gbit"], r["store"], step, r["compute_ms"], r["comm_ms"], r["wire_ms"],
            r["bound_overlap_ms"], r["bound_serial_ms"], vs, sp, cpu, r["note"]))
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
    ax.set_title("%s, %d hosts x 1 rank: step time vs the overlap bounds"
                 % (args.model, args.hosts))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(outdir / "cluster.png", dpi=110)


if __name__ == "__main__":
    a = parse()
    if a.worker:
        peer_worker(a)
    else:
        drive(a)

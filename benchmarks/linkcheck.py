"""What a cluster-in-a-box link carries, before any store is measured.

    from benchmarks.linkcheck import check_link
    row = check_link(cluster, rate_gbit, grad_bytes)      # inside benchmarks/cluster.py

Between hosts 0 and 1 of a NetnsCluster (mxnet_mpi/testing/netns.py), with the
link shaped to `rate_gbit`:

- a plain TCP stream's rate (100 MiB, or what takes about 1 s at the rate);
- a plain TCP round trip (1 byte, TCP_NODELAY, median of 200);
- a plain TCP exchange of the gradient size in both directions at once (what
  each rank of a 2-rank allreduce sends and receives), from and into buffers
  of that size, with each side's CPU time / wall time: the kernel's TCP work
  on this link, the floor under any store's CPU while it communicates;
- an MPI round trip (mpi4py, 8 bytes, half of it reported as Open MPI reports
  latency, median of 200), quiet and while a busy process shares each
  rank's cores (as backprop does during training), and a raw in-place ``MPI_Allreduce`` of the
  gradient size against the ring's wire time (2(p-1)/p x bytes x 8 / rate),
  with its CPU time / wall time, each with Open MPI's own defaults and with
  mxnet_mpi's transport defaults (mxnet_mpi/transport.py).

If the TCP stream stays below 85% of the shaped rate, the emulation cannot
carry the rate and no store figure on that link means anything: the check
says so.

    sudo .venv/bin/python benchmarks/linkcheck.py --sweep [--rate 1,3.8] [--outdir DIR]

compares the candidate Open MPI transport settings one by one at each rate:
the raw allreduce, the MPI round trip, and the default store's allreduce of a
model's gradients (what the stores move across hosts), each with its CPU time
(transport.csv; docs/across-hosts.md shows it through benchmarks/report.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PORT = 52777
MIN_TCP_SHARE = 0.85


def wire_ms(nbytes: float, rate_gbit: float, ranks: int = 2) -> float:
    """A ring allreduce's time on the wire: each link carries 2(p-1)/p x bytes."""
    return 2 * (ranks - 1) / ranks * nbytes * 8 / (rate_gbit * 1e9) * 1e3


# ----------------------------------------------------------------- in the namespaces
def serve(port: int) -> None:
    """One connection at a time: 's' + 8-byte size: read that many bytes and
    answer the seconds it took (first byte to last); 'p' + 4-byte count: echo
    that many single bytes; 'x' + 8-byte size: exchange (below)."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(1)
    print("ready", flush=True)
    for _ in range(3):
        conn, _ = ls.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        kind = conn.recv(1)
        if kind == b"x":
            n = int.from_bytes(_recv_exact(conn, 8), "little")
            conn.sendall(json.dumps(exchange(conn, n)).encode())
        elif kind == b"s":
            left = int.from_bytes(_recv_exact(conn, 8), "little")
            t0 = None
            while left > 0:
                chunk = conn.recv(min(left, 1 << 20))
                if not chunk:
                    break
                t0 = t0 or time.perf_counter()
                left -= len(chunk)
            conn.sendall(json.dumps(time.perf_counter() - t0).encode())
        else:
            n = int.from_bytes(_recv_exact(conn, 4), "little")
            for _ in range(n):
                conn.sendall(_recv_exact(conn, 1))
        conn.close()


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return buf


def exchange(conn: socket.socket, n: int) -> dict:
    """Send and receive `n` bytes at once on `conn` (the peer does the same),
    from and into buffers of `n` bytes; {"ms", "cpu_per_wall"} of this side."""
    import threading

    # written once before the clock starts, as a store's reused buffers are:
    # first-touch page faults are not the network's work
    out, into = memoryview(bytearray(b"\1") * n), memoryview(bytearray(b"\2") * n)
    conn.sendall(b"g")
    _recv_exact(conn, 1)   # both sides start together
    t0, c0 = time.perf_counter(), time.process_time()

    def send() -> None:
        for at in range(0, n, 1 << 20):
            conn.sendall(out[at:at + (1 << 20)])
    sender = threading.Thread(target=send)
    sender.start()
    got = 0
    while got < n:
        k = conn.recv_into(into[got:], n - got)
        if not k:
            raise ConnectionError("peer closed")
        got += k
    sender.join()
    wall = time.perf_counter() - t0
    return {"ms": wall * 1e3, "cpu_per_wall": (time.process_time() - c0) / wall}


def client(addr: str, port: int, nbytes: int, pings: int, xbytes: int) -> None:
    """Stream `nbytes`, ping `pings` times, exchange `xbytes` each way; prints
    {"gbit", "rtt_us", "xchg_ms", "xchg_cpu_per_wall"} (the exchange: the
    slower side's time, both sides' mean CPU/wall)."""
    c = socket.create_connection((addr, port))
    c.sendall(b"s" + nbytes.to_bytes(8, "little"))
    block = b"\0" * (1 << 20)
    left = nbytes
    while left > 0:
        c.sendall(block[:min(left, len(block))])
        left -= min(left, len(block))
    secs = json.loads(c.recv(64))
    c.close()
    c = socket.create_connection((addr, port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.sendall(b"p" + pings.to_bytes(4, "little"))
    rtts = []
    for _ in range(pings):
        t0 = time.perf_counter()
        c.sendall(b"x")
        _recv_exact(c, 1)
        rtts.append(time.perf_counter() - t0)
    c.close()
    c = socket.create_connection((addr, port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.sendall(b"x" + xbytes.to_bytes(8, "little"))
    mine = exchange(c, xbytes)
    answer = b""
    while chunk := c.recv(256):   # the server answers, then closes
        answer += chunk
    theirs = json.loads(answer)
    c.close()
    print(json.dumps({"gbit": nbytes * 8 / secs / 1e9, "rtt_us": statistics.median(rtts) * 1e6,
                      "xchg_ms": max(mine["ms"], theirs["ms"]),
                      "xchg_cpu_per_wall": (mine["cpu_per_wall"] + theirs["cpu_per_wall"]) / 2}))


def mpi_probe(nbytes: int, reps: int, out: str) -> None:
    """Under mpirun, one rank per host: MPI half round trip and a raw
    in-place allreduce of `nbytes` (float32), with CPU time / wall time."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    msg = np.zeros(8, dtype=np.uint8)

    def half_rtt() -> float:
        times = []
        for i in range(220):
            comm.Barrier() if i % 50 == 0 else None
            t0 = time.perf_counter()
            if rank == 0:
                comm.Send(msg, dest=1)
                comm.Recv(msg, source=1)
            elif rank == 1:
                comm.Recv(msg, source=0)
                comm.Send(msg, dest=0)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[20:]) / 2

    quiet = half_rtt()
    # The same while a process computes on each host's cores (as backprop does
    # while gradients move): a rank that polls shares its core with it.
    busy = os.fork()
    if busy == 0:
        while True:
            pass
    try:
        loaded = half_rtt()
    finally:
        os.kill(busy, signal.SIGKILL)
        os.waitpid(busy, 0)
    buf = np.ones(nbytes // 4, dtype=np.float32)
    comm.Allreduce(MPI.IN_PLACE, buf)   # warm-up (connections, registrations)
    comm.Barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(reps):
        comm.Allreduce(MPI.IN_PLACE, buf)
    wall = time.perf_counter() - t0
    cpu = (time.process_time() - c0) / wall
    cpus = comm.gather(cpu)
    if rank == 0:
        Path(out).write_text(json.dumps({"half_rtt_us": quiet * 1e6,
                                         "half_rtt_busy_us": loaded * 1e6,
                                         "allreduce_ms": wall / reps * 1e3,
                                         "cpu_per_wall": sum(cpus) / len(cpus)}))


# ----------------------------------------------------------------- driver
def store_probe(model: str, reps: int, out: str) -> None:
    """Under mpirun, one rank per host: the default store's allreduce of
    `model`'s gradients (gluoncv, every array pushpulled in backprop's order with
    its priority, as benchmarks/overlap.py's comm-only row does), ms per
    allreduce of them all and CPU time / wall time."""
    import mxnet as mx
    from gluoncv.model_zoo import get_model

    import mxnet_mpi

    net = get_model(model, classes=100)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, 64, 64))).wait_to_read()   # shapes known
    grads = [mx.nd.ones(p.shape) for p in net.collect_params().values()
             if p.grad_req != "null"]
    kv = mx.kv.create("mpi")

    def allreduce() -> None:
        for i in reversed(range(len(grads))):
            kv.pushpull("g%d" % i, grads[i], priority=-i)
        mx.nd.waitall()

    allreduce()   # warm-up (connections, plans)
    # every array was ones on every rank: a wrong sum fails the run, not a figure
    wrong = [i for i, g in enumerate(grads) if (g != mxnet_mpi.size()).sum().asscalar()]
    if wrong:
        raise SystemExit("store probe: the allreduce of gradient %d is not the sum of the "
                         "ranks' ones" % wrong[0])
    kv.pushpull("barrier", mx.nd.zeros((1,)))
    mx.nd.waitall()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(reps):
        allreduce()
    wall = time.perf_counter() - t0
    cpu = mx.nd.zeros((mxnet_mpi.size(),))
    cpu[mxnet_mpi.rank()] = (time.process_time() - c0) / wall
    kv.pushpull("cpu", cpu)
    cpus = cpu.asnumpy().tolist()
    if mxnet_mpi.rank() == 0:
        Path(out).write_text(json.dumps({"store_ms": wall / reps * 1e3,
                                         "store_cpu_per_wall": sum(cpus) / len(cpus),
                                         "store_bytes": sum(g.size * 4 for g in grads),
                                         "arrays": len(grads),
                                         # the point-to-point route across hosts, or not
                                         "p2p_bytes": getattr(getattr(kv, "stream", None),
                                                              "p2p_bytes", None)}))


def tcp_check(cluster, rate_gbit: float | None, xbytes: int) -> dict:
    """A plain TCP stream host 0 -> host 1, a 1-byte round trip and an
    exchange of `xbytes` each way."""
    server = subprocess.Popen(cluster.exec_cmd(1, [sys.executable, __file__, "--serve",
                                                   str(PORT)]),
                              stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()   # "ready"
        nbytes = 100 << 20 if not rate_gbit else int(min(100 << 20, rate_gbit * 1e9 / 8))
        res = subprocess.run(cluster.exec_cmd(0, [sys.executable, __file__, "--client",
                                                  cluster.addrs[1], str(PORT), str(nbytes),
                                                  "200", str(xbytes)]),
                             capture_output=True, text=True, timeout=120, check=True)
        return json.loads(res.stdout.strip().splitlines()[-1])
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()


def mpi_check(cluster, grad_bytes: int, env: dict, out: Path, reps: int = 3) -> dict:
    cmd = cluster.mpirun(2, [sys.executable, __file__, "--mpi-probe", str(grad_bytes),
                             "--reps", str(reps), "--out", str(out)], per_host=1)
    subprocess.run(cmd, check=True, env=env, cwd=str(ROOT), timeout=300,
                   stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def check_link(cluster, rate_gbit: float | None, grad_bytes: int, outdir: Path) -> dict:
    """The link check between hosts 0 and 1 (as shaped now): a dict of figures."""
    sys.path.insert(0, str(ROOT))
    from mxnet_mpi import transport

    tcp = tcp_check(cluster, rate_gbit, grad_bytes)   # a 2-rank allreduce's bytes each way
    base = cluster.env()
    for name in transport.DEFAULTS:
        base.pop(name, None)
    plain = mpi_check(cluster, grad_bytes, dict(base, MXNET_MPI_TRANSPORT_DEFAULTS="0"),
                      outdir / "linkcheck_mpi.json")
    ours = dict(base)
    transport.apply(ours)
    tuned = mpi_check(cluster, grad_bytes, ours, outdir / "linkcheck_mpi.json")
    wire = wire_ms(grad_bytes, rate_gbit) if rate_gbit else None
    row = {"link_gbit": rate_gbit, "tcp_gbit": tcp["gbit"],
           "tcp_share": tcp["gbit"] / rate_gbit if rate_gbit else None,
           "tcp_rtt_us": tcp["rtt_us"], "tcp_exchange_ms": tcp["xchg_ms"],
           "tcp_exchange_cpu_per_wall": tcp["xchg_cpu_per_wall"],
           "grad_MB": grad_bytes / 2**20, "wire_ms": wire}
    for tag, r in (("ompi", plain), ("ours", tuned)):
        row["mpi_half_rtt_us_" + tag] = r["half_rtt_us"]
        row["mpi_half_rtt_busy_us_" + tag] = r["half_rtt_busy_us"]
        row["allreduce_ms_" + tag] = r["allreduce_ms"]
        row["allreduce_vs_wire_" + tag] = r["allreduce_ms"] / wire if wire else None
        row["allreduce_cpu_per_wall_" + tag] = r["cpu_per_wall"]
    return row


def print_check(row: dict) -> None:
    rate = row["link_gbit"]
    share = row["tcp_share"]
    print("link check %s: TCP stream %.2f Gbit/s%s, TCP round trip %.0f us, TCP exchange of "
          "%.1f MB each way %.0f ms at %.2f CPU/wall; MPI half round "
          "trip %.0f us (Open MPI defaults) / %.0f us (ours), with a busy process beside "
          "each rank %.0f / %.0f us; raw allreduce of %.1f MB %.0f / %.0f ms%s, CPU/wall "
          "%.2f / %.2f"
          % ("unshaped" if not rate else "%g Gbit/s" % rate, row["tcp_gbit"],
             "" if share is None else " (%.0f%% of the shaped rate)" % (100 * share),
             row["tcp_rtt_us"], row["grad_MB"], row["tcp_exchange_ms"],
             row["tcp_exchange_cpu_per_wall"], row["mpi_half_rtt_us_ompi"],
             row["mpi_half_rtt_us_ours"],
             row["mpi_half_rtt_busy_us_ompi"], row["mpi_half_rtt_busy_us_ours"],
             row["grad_MB"], row["allreduce_ms_ompi"], row["allreduce_ms_ours"],
             "" if not row["wire_ms"] else " (%.2fx / %.2fx the wire time %.0f ms)"
             % (row["allreduce_vs_wire_ompi"], row["allreduce_vs_wire_ours"], row["wire_ms"]),
             row["allreduce_cpu_per_wall_ompi"], row["allreduce_cpu_per_wall_ours"]),
          flush=True)
    if share is not None and share < MIN_TCP_SHARE:
        print("WARNING: the emulated link carries only %.0f%% of its shaped rate over plain "
              "TCP (< %.0f%%): the harness, not the store, limits every figure on it"
              % (100 * share, 100 * MIN_TCP_SHARE), flush=True)


def store_check(cluster, model: str, env: dict, out: Path, reps: int = 3) -> dict:
    cmd = cluster.mpirun(2, [sys.executable, __file__, "--store-probe", model,
                             "--reps", str(reps), "--out", str(out)], per_host=1)
    env = dict(env, OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    subprocess.run(cmd, check=True, env=env, cwd=str(ROOT), timeout=300,
                   stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


# The Open MPI settings that were candidates for mxnet_mpi's transport defaults
# (mxnet_mpi/transport.py keeps only btl_tcp_links=4; docs/across-hosts.md): each
# row's variables on top of Open MPI's defaults. The later rows try one more
# candidate each on top of btl_tcp_links=4.
LINKS4 = {"OMPI_MCA_btl_tcp_links": "4"}
MIB = str(1 << 20)
SWEEP = [
    ("defaults", {}),
    ("mpi_yield_when_idle=1", {"OMPI_MCA_mpi_yield_when_idle": "1"}),
    ("btl_tcp_links=4", LINKS4),
    ("both", dict(LINKS4, OMPI_MCA_mpi_yield_when_idle="1")),
    # socket buffers fixed at 4 MiB (Open MPI's 0 leaves them to Linux's autotuning)
    ("links=4, btl_tcp_sndbuf=btl_tcp_rcvbuf=4 MiB",
     dict(LINKS4, OMPI_MCA_btl_tcp_sndbuf=str(4 << 20), OMPI_MCA_btl_tcp_rcvbuf=str(4 << 20))),
    # fragments of 1 MiB instead of 128 KiB: fewer, larger writes and reads
    ("links=4, btl_tcp_max_send_size=1 MiB",
     dict(LINKS4, OMPI_MCA_btl_tcp_max_send_size=MIB,
          OMPI_MCA_btl_tcp_rdma_pipeline_send_length=MIB)),
    # messages up to 1 MiB sent eagerly, without a rendezvous round trip
    ("links=4, btl_tcp_eager_limit=1 MiB",
     dict(LINKS4, OMPI_MCA_btl_tcp_eager_limit=MIB, OMPI_MCA_btl_tcp_rndv_eager_limit=MIB,
          OMPI_MCA_btl_tcp_max_send_size=MIB)),
    # Open MPI's ring allreduce instead of its decision rules (raw MPI only: the
    # stores move allreduces across hosts with their own point-to-point messages)
    ("links=4, ring allreduce",
     dict(LINKS4, OMPI_MCA_coll_tuned_use_dynamic_rules="1",
          OMPI_MCA_coll_tuned_allreduce_algorithm="4")),
    # Open MPI's TCP progress thread: a thread of Open MPI's that sleeps in epoll
    # and moves the sockets' bytes as they become ready, between the waits' tests
    ("links=4, btl_tcp_progress_thread=1", dict(LINKS4, OMPI_MCA_btl_tcp_progress_thread="1")),
]
SWEEP_COLUMNS = ["settings", "link_gbit", "grad_MB", "wire_ms", "allreduce_ms", "vs_wire",
                 "cpu_per_wall", "half_rtt_us", "half_rtt_busy_us", "store_ms", "store_vs_wire",
                 "store_cpu_per_wall", "rounds"]


def sweep(rates_gbit: list, grad_bytes: int, rounds: int, outdir: Path,
          model: str = "resnet18_v1", reps: int = 3) -> list:
    """Each candidate setting (SWEEP), between two emulated hosts at each of
    `rates_gbit`: the raw allreduce of `grad_bytes` against the wire time, the
    MPI round trip, quiet and beside a busy process, and the default store's
    allreduce of `model`'s gradients (what a store moves across hosts), each
    with its CPU time / wall time. Rounds alternate the settings; each figure
    is the median over rounds; each round's figure is the mean of `reps`
    allreduces. Writes transport.csv."""
    import csv

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(HERE))
    from meta import write_meta

    from mxnet_mpi import transport
    from mxnet_mpi.testing import netns

    why = netns.unavailable()
    if why:
        raise SystemExit("benchmarks/linkcheck.py: no netns cluster here: " + why)
    outdir.mkdir(parents=True, exist_ok=True)
    probe = outdir / "sweep.json"
    rows = []
    with netns.NetnsCluster(2, cpus=netns.own_cores(2)) as cluster:
        base = cluster.env()
        for name in transport.DEFAULTS:
            base.pop(name, None)
        base["MXNET_MPI_TRANSPORT_DEFAULTS"] = "0"
        for rate in rates_gbit:
            for h in range(cluster.n):
                cluster.shape(h, rate_gbit=rate)
            runs: dict = {name: [] for name, _ in SWEEP}
            for r in range(rounds):
                for name, extra in SWEEP:
                    env = dict(base, **extra)
                    got = mpi_check(cluster, grad_bytes, env, probe, reps)
                    got.update(store_check(cluster, model, env, probe, reps))
                    if not got["p2p_bytes"]:
                        raise SystemExit("the store did not take its point-to-point route "
                                         "across hosts (p2p_bytes %r): its row would measure "
                                         "MPI's allreduce" % got["p2p_bytes"])
                    runs[name].append(got)
                    print("%g Gbit/s round %d %-46s allreduce %.0f ms (store %.0f ms, CPU/wall "
                          "%.2f), half round trip %.0f / %.0f us busy"
                          % (rate, r + 1, name, got["allreduce_ms"], got["store_ms"],
                             got["store_cpu_per_wall"], got["half_rtt_us"],
                             got["half_rtt_busy_us"]), flush=True)
            wire = wire_ms(grad_bytes, rate)
            for name, _ in SWEEP:
                got = runs[name]
                med = {k: statistics.median(g[k] for g in got) for k in got[0]
                       if isinstance(got[0][k], (int, float))}
                rows.append({"settings": name, "link_gbit": rate, "grad_MB": grad_bytes / 2**20,
                             "wire_ms": wire, "allreduce_ms": med["allreduce_ms"],
                             "vs_wire": med["allreduce_ms"] / wire,
                             "cpu_per_wall": med["cpu_per_wall"],
                             "half_rtt_us": med["half_rtt_us"],
                             "half_rtt_busy_us": med["half_rtt_busy_us"],
                             "store_ms": med["store_ms"],
                             # the store's bytes are the model's gradients
                             "store_vs_wire": med["store_ms"] / wire_ms(med["store_bytes"], rate),
                             "store_cpu_per_wall": med["store_cpu_per_wall"],
                             "rounds": rounds})
            arrays = runs[SWEEP[0][0]][0]["arrays"]
        binding = cluster.binding()
    probe.unlink(missing_ok=True)
    path = outdir / "transport.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, SWEEP_COLUMNS)
        w.writeheader()
        for row in rows:
            w.writerow({k: ("%.4g" % v if isinstance(v, float) else v) for k, v in row.items()})
    write_meta(path, binding=binding, what="raw mpi4py allreduce of %.1f MB, MPI round trips "
               "and the default store's allreduce of %s's gradients between two emulated "
               "hosts at %s Gbit/s, per Open MPI setting"
               % (grad_bytes / 2**20, model, ", ".join("%g" % r for r in rates_gbit)),
               model=model, arrays=arrays)
    for row in rows:
        print("%g Gbit/s %-46s raw %.2fx wire, CPU/wall %.2f; store %.2fx wire, CPU/wall %.2f; "
              "half round trip %.0f us, %.0f us beside a busy process"
              % (row["link_gbit"], row["settings"], row["vs_wire"], row["cpu_per_wall"],
                 row["store_vs_wire"], row["store_cpu_per_wall"], row["half_rtt_us"],
                 row["half_rtt_busy_us"]))
    print("wrote %s" % path)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true",
                    help="compare the candidate Open MPI transport settings (needs root); "
                         "writes transport.csv to --outdir")
    ap.add_argument("--rate", default="1",
                    help="--sweep: link rates in Gbit/s, comma-separated (default 1)")
    ap.add_argument("--model", default="resnet18_v1",
                    help="--sweep: the model whose gradients the store's rows move")
    ap.add_argument("--grad-mb", type=float, default=42.8,
                    help="--sweep: allreduce size in MB (resnet18_v1's gradients: 42.8)")
    ap.add_argument("--rounds", type=int, default=3, help="--sweep: alternating rounds")
    ap.add_argument("--outdir", default=str(HERE / "results"))
    ap.add_argument("--serve", type=int)
    ap.add_argument("--client", nargs=5)
    ap.add_argument("--mpi-probe", type=int)
    ap.add_argument("--store-probe")
    ap.add_argument("--reps", type=int, default=3,
                    help="allreduces timed per round (--sweep) or per probe")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.serve:
        serve(a.serve)
    elif a.client:
        client(a.client[0], *(int(v) for v in a.client[1:]))
    elif a.mpi_probe:
        mpi_probe(a.mpi_probe, a.reps, a.out)
    elif a.store_probe:
        store_probe(a.store_probe, a.reps, a.out)
    elif a.sweep:
        sweep([float(r) for r in a.rate.split(",")], int(a.grad_mb * 2**20) // 4 * 4,
              a.rounds, Path(a.outdir), a.model, a.reps)
    else:
        ap.error("--sweep, or run by benchmarks/cluster.py")


if __name__ == "__main__":
    main()

"""Multi-host runs on a cluster in a box (2 network-namespace hosts x 2 ranks):
local ranks per host, kvstore='mpi' training across hosts (also with 5% packet
loss on one link), and the hybrid store with one group per host and the
parameter server on host 0, started by ``mxnet_mpi.launch --hostfile``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpirun import ROOT, SCRIPTS, mpi_env, run_single
from netns_cluster import needs_netns, run

from mxnet_mpi.testing import netns

pytestmark = needs_netns
HOSTS, PER_HOST = 2, 2
N = HOSTS * PER_HOST
STEPS = 4


@pytest.fixture(scope="module")
def cluster():
    with netns.NetnsCluster(HOSTS, rate_gbit=1.0) as c:
        yield c


def load(outdir, n=N):
    return [dict(np.load(outdir / ("rank%d.npz" % r))) for r in range(n)]


_REFERENCES: dict = {}


def reference(tmp_path, script):
    """One process on the global batch (run once per script)."""
    if script not in _REFERENCES:
        outdir = tmp_path / "ref"
        run_single(script, "--reference", str(N), "--outdir", str(outdir), "--steps", str(STEPS))
        _REFERENCES[script] = dict(np.load(outdir / "rank0.npz"))
    return _REFERENCES[script]


def assert_same_trajectory(ranks, ref):
    assert set(ranks[0]) == set(ref) and len(ref) > 0
    for key in sorted(ref):
        for r, weights in enumerate(ranks[1:], start=1):
            np.testing.assert_array_equal(weights[key], ranks[0][key],
                                          err_msg="rank %d differs at %s" % (r, key))
        np.testing.assert_allclose(ranks[0][key], ref[key], rtol=1e-4, atol=1e-5,
                                   err_msg="differs from one process on the full batch: " + key)


def assert_placed_per_host(out: str, hosts: list) -> None:
    """Each rank's rank, size, local rank and size and host (gluon_train.py's
    PLACED line): mpirun fills host 0's slots first, so ranks 0,1 run on host 0
    and ranks 2,3 on host 1. The store's communicating thread (funneled: one)
    took MXNET_MPI_COMM_NICE's default, -10, where the rank may raise a
    thread's priority, and kept the process's 0 where it may not. Its store
    sends every allreduce over its point-to-point route (threshold 1 byte)."""
    seen = sorted(json.loads(ln.split("PLACED ", 1)[1]) for ln in out.splitlines()
                  if "PLACED " in ln)
    assert len(seen) == N, out[-3000:]
    for rank, size, local_rank, local_size, host, nice, may_raise, p2p_bytes in seen:
        assert p2p_bytes == 1, (rank, p2p_bytes)
        assert size == N
        assert host == hosts[rank // PER_HOST]
        assert (local_rank, local_size) == (rank % PER_HOST, PER_HOST)
        assert nice == ([-10] if may_raise else [0]), (rank, nice, may_raise)


_RUNS: dict = {}


@pytest.mark.parametrize("loss_pct", [0, 5])
def test_mpi_training_across_hosts_is_exact(cluster, tmp_path, loss_pct):
    """Ranks seed differently; kvstore='mpi' (a string) makes them identical and
    equal to one process on the global batch; 5% loss on host 1's link (TCP
    retransmits) changes nothing, bit for bit. Every allreduce takes the
    store's point-to-point allreduce (the default across hosts). Local rank and
    size are per host."""
    cluster.shape(1, rate_gbit=1.0, loss_pct=loss_pct)
    try:
        cmd = [sys.executable, str(SCRIPTS / "gluon_train.py"), "--kvstore", "mpi",
               "--outdir", str(tmp_path / "mpi"), "--steps", str(STEPS)]
        _, out, _ = run(cluster, cluster.mpirun(N, cmd, per_host=PER_HOST))
    finally:
        cluster.shape(1, rate_gbit=1.0)
    assert_placed_per_host(out, cluster.hosts)
    ranks = load(tmp_path / "mpi")
    assert_same_trajectory(ranks, reference(tmp_path, "gluon_train.py"))
    _RUNS[loss_pct] = ranks[0]
    if len(_RUNS) == 2:
        for key in _RUNS[0]:
            np.testing.assert_array_equal(_RUNS[5][key], _RUNS[0][key], err_msg=key)


def test_hybrid_one_group_per_host_ps_on_host0(cluster, tmp_path):
    """`python -m mxnet_mpi.launch --hostfile` run on host 0: scheduler and
    server there, 2 groups (one per host, the store's default group size)."""
    hostfile = cluster.write_hostfile(PER_HOST, str(tmp_path / "hostfile"))
    outdir = tmp_path / "hyb"
    cmd = cluster.exec_cmd(0, [
        sys.executable, "-m", "mxnet_mpi.launch", "-n", str(N), "--servers", "1",
        "--hostfile", hostfile, "--ps-host", cluster.addrs[0], "--grace", "3", "--",
        sys.executable, str(SCRIPTS / "hybrid_train.py"), "--kvstore", "dist_sync_mpi",
        "--outdir", str(outdir), "--steps", str(STEPS)])
    _, out, _ = run(cluster, cmd, timeout=150)
    assert "ps-lite scheduler at %s:" % cluster.addrs[0] in out
    assert "2 group(s) of 2 (one per host)" in out
    ranks = load(outdir)
    infos = [json.loads((outdir / ("rank%d.json" % r)).read_text()) for r in range(N)]
    for rank, info in enumerate(infos):
        assert info["type"] == "dist_sync_mpi" and info["num_groups"] == HOSTS
        assert (info["group"], info["group_rank"]) == (rank // PER_HOST, rank % PER_HOST)
        assert info["is_ps_worker"] == (rank % PER_HOST == 0)
    assert_same_trajectory(ranks, reference(tmp_path, "hybrid_train.py"))


def test_process_sets_on_uneven_hosts_agree_on_their_route(cluster, tmp_path):
    """3 ranks on host 0, 1 on host 1: a set of one rank of each host spans
    hosts for both of them (the point-to-point route), a set inside host 0
    does not; every sum exact; the world's free functions take that route."""
    hostfile = tmp_path / "uneven"
    hostfile.write_text("%s slots=3\n%s slots=1\n" % tuple(cluster.hosts))
    cmd = [str(Path(sys.executable).parent / "mpirun"), "-np", "4", "--hostfile",
           str(hostfile), "--map-by", "slot", sys.executable, str(SCRIPTS / "uneven_hosts.py")]
    _, out, _ = run(cluster, cmd, timeout=120)
    seen = sorted((json.loads(ln) for ln in out.splitlines() if ln.startswith("{")),
                  key=lambda r: r["rank"])
    assert [r["rank"] for r in seen] == [0, 1, 2, 3], out[-3000:]
    for r in seen:
        assert r["local_size"] == (3 if r["rank"] < 3 else 1), r
        across = r["members"] == [2, 3]
        assert (r["spans_hosts"], r["p2p_bytes"] > 0) == (across, across), r
        assert r["set_exact"] and r["world_exact"], r
        # Horovod's global set (the free functions' store) across hosts too:
        # it took MPI's allreduce, whose order of additions is not rank order
        assert r["world_p2p_bytes"] == 1 and r["world_rank_order"], r


HOLDER = ("import sys, time\n"
          "from mxnet_mpi.testing.netns import NetnsCluster\n"
          "c = NetnsCluster(2, rate_gbit=1, loss_pct=1)\n"
          "c.start()\n"
          "print(' '.join(c.hosts + c.links + [c.bridge]), flush=True)\n"
          "print(c.tmp, flush=True)\n"
          "time.sleep(120)\n")


def _exists(names: list) -> list:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [n for n in names if n + " " in ns or n + "\n" in ns or " %s:" % n in links
            or " %s@" % n in links]


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_harness_leaves_nothing_behind(sig):
    """Namespaces and links go on SIGTERM/SIGINT; after SIGKILL, the next
    cluster's stale clean-up removes them (their creator is dead)."""
    import signal as signals
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True,
                            env=mpi_env(), cwd=str(ROOT))
    try:
        names = proc.stdout.readline().split()
        files = Path(proc.stdout.readline().strip())
        assert len(names) == 5 and _exists(names) == names and files.is_dir()
        proc.send_signal(getattr(signals, sig))
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if sig == "SIGKILL":
        assert _exists(names[:2]) == names[:2]   # left behind ...
        removed = netns.cleanup_stale()
        assert set(names[:2]) <= set(removed)    # ... until the stale clean-up
        assert str(files) in removed
    assert _exists(names) == [] and not files.exists()


def test_stale_clean_up_leaves_other_prefixes_alone():
    """Another user's prefix that starts with ours (MXNET_MPI_NETNS_PREFIX
    'mxmpi-zz9' against 'mxmpi-'): its names were read as ours, made by a
    dead pid ('zz9' in base 36), and removed, live cluster and all."""
    other = netns.PREFIX + "zz9-1-h0"
    subprocess.run(["ip", "netns", "add", other], check=True)
    try:
        assert other not in netns.cleanup_stale()
        assert _exists([other]) == [other]
    finally:
        subprocess.run(["ip", "netns", "del", other], check=False)

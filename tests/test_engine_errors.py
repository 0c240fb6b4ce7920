"""Errors of failed collectives reach MXNet's engine without racing it.

MXNet 1.9's threaded engine keeps the errors of failed ops in a list without
a lock, appended to by every op that finishes or starts with an error. The
stores completed a failed collective with its error on their own threads
(the funneled negotiator, the concurrent lanes) while the engine's workers
passed earlier errors on: the list's buffer was freed under a writer, which
once aborted a rank in the suite (`free(): invalid next size`) and, with the
timing stretched, crashed every run (a segmentation fault, then a hang). A
failed collective is now completed by an engine op of its own on the engine's
worker (engine_ops.cc, CompleteWithError)."""

import shutil
import subprocess

import pytest
from mpirun import SCRIPTS, run_mpi


@pytest.fixture(scope="module")
def slow_free(tmp_path_factory) -> str:
    """The timing amplifier (tests/scripts/slow_free.c), built here."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build the timing amplifier")
    lib = tmp_path_factory.mktemp("slow_free") / "slow_free.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib),
                    str(SCRIPTS / "slow_free.c"), "-ldl"], check=True)
    return str(lib)


@pytest.mark.parametrize("mode,lanes", [("concurrent", "8"), ("funneled", "1")])
def test_collectives_failing_side_by_side_do_not_corrupt_the_engine(slow_free, mode, lanes):
    proc = run_mpi("failed_side_by_side.py", 2, mode, "3", "16", timeout=60, check=False,
                   env={"LD_PRELOAD": slow_free, "SLOW_FREE_NS": "300000",
                        "MXNET_MPI_LARGE_LANES": lanes})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Segmentation fault" not in out, out[-4000:]
    done = sorted(ln.split()[1:3] for ln in proc.stdout.splitlines() if ln.startswith("DONE"))
    assert done == [["0", "3"], ["1", "3"]], proc.stdout

"""`python -m mxnet_mpi SCRIPT`: unchanged scripts (no `import mxnet_mpi`) really
communicate, keep their argv, exit status and tracebacks; the launcher runs
every rank through it. Under plain mpirun, the start-up hook of the (dev)
installation makes the same script communicate with no runner at all."""

import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import launching
import pytest
from mpirun import MPIRUN, ROOT, SCRIPTS, mpi_env, run_mpi

PLAIN = str(SCRIPTS / "plain_mxnet.py")


def weights(out: str) -> dict:
    return {int(r): (float(a), float(b)) for r, a, b in re.findall(r"WEIGHT (\d) (\S+) (\S+)", out)}


def runner(*args: str, np_: int = 1, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mxnet_mpi", *args]
    if np_ > 1:
        cmd = [MPIRUN, "-np", str(np_), "--oversubscribe", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, env=mpi_env(), cwd=str(ROOT),
                          timeout=timeout, start_new_session=True)


def test_unchanged_script_sums_across_ranks():
    proc = runner(PLAIN, "mpi", np_=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # -(1 + 2): the ranks summed their gradients (alone they would hold -1 and -2)
    assert weights(proc.stdout) == {0: (-3.0, 0.0), 1: (-3.0, 0.0)}, proc.stdout
    # as `python SCRIPT`: its directory first on sys.path, an absolute __file__
    assert proc.stdout.count("name __main__ argv ['mpi'] mpi loaded path0 %s file %s"
                             % (SCRIPTS, PLAIN)) == 2, proc.stdout


def test_plain_mpirun_with_the_startup_hook_of_the_dev_install():
    # `make build` installs the package editable, with its .pth start-up hook: the
    # script that never names mxnet_mpi is in sync under plain mpirun, and MPI is
    # loaded but not initialised by `import mxnet` (the store initialises it)
    hook = Path(sysconfig.get_paths()["purelib"]) / "mxnet_mpi_autoload.pth"
    assert hook.exists(), "%s is missing: run `make build` (pip install -e .)" % hook
    proc = run_mpi("plain_mxnet.py", 2, "mpi")
    assert weights(proc.stdout) == {0: (-3.0, 0.0), 1: (-3.0, 0.0)}, proc.stdout
    assert proc.stdout.count("argv ['mpi'] mpi loaded path0") == 2, proc.stdout


@pytest.mark.parametrize("store", ["device", "local_update_cpu"])
def test_mxnets_own_store_under_mpirun_warns_that_each_rank_trains_alone(store):
    """kvstore='device' (or another of MXNet's stores of one process) under
    mpirun: each rank trains a model of its own, as MXNet does, silently (a
    newcomer's slip). Each rank now warns once, naming the store and
    kvstore='mpi'; the numbers stay MXNet's."""
    proc = run_mpi("plain_mxnet.py", 2, store)
    assert weights(proc.stdout) == {0: (-1.0, 0.0), 1: (-2.0, 0.0)}, proc.stdout
    assert proc.stderr.count("this process is one of 2 ranks started by mpirun, and its "
                             "Trainer uses kvstore=%r" % store) == 2, proc.stderr[-3000:]
    assert proc.stderr.count("Use kvstore='mpi'") == 2, proc.stderr[-3000:]


HOOK_PROBE = r"""
import importlib.util, sys
exec(open(sys.argv[1]).read().splitlines()[-1])   # what site.py runs of the .pth
print("without", importlib.util.find_spec("mxnet"))
sys.path[:0] = sys.argv[2:]
print("with", type(importlib.util.find_spec("mxnet").loader).__name__)
"""


def test_startup_hook_passes_by_where_its_module_is_gone(tmp_path):
    """pip's isolated build runs the venv's .pth, then takes site-packages off
    sys.path: the hook's finder raised ModuleNotFoundError from every
    find_spec('mxnet') there, so `pip wheel`, a reinstall or an extra into a
    venv holding mxnet-mpi failed. Without its module it must answer None;
    with it, wrap mxnet's loader as before."""
    purelib = sysconfig.get_paths()["purelib"]
    proc = subprocess.run([sys.executable, "-S", "-c", HOOK_PROBE,
                           str(ROOT / "mxnet_mpi_autoload.pth"), str(ROOT), purelib],
                          capture_output=True, text=True, cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["without None", "with _ThenMxnetMpi"], proc.stdout


@pytest.mark.parametrize("variable", ["MXNET_MPI_TRANSPORT_DEFAULTS", "MXNET_MPI_AUTOLOAD"])
def test_startup_hook_that_cannot_load_the_package_refuses_its_stores(variable):
    """A bad MXNET_MPI_* value makes `import mxnet_mpi` fail inside the hook
    (MXNET_MPI_AUTOLOAD=abc: the hook itself takes it as on): `import mxnet`
    still works, but kvstore='mpi' (by name, through a Trainer) must then
    raise rather than leave each rank training alone (MXNet makes a local
    store of an unknown name, and a Trainer on one device none at all)."""
    env = dict(mpi_env(), **{variable: "abc"})
    proc = subprocess.run([sys.executable, PLAIN, "mpi"], capture_output=True, text=True,
                          env=env, cwd=str(ROOT), timeout=120)
    assert proc.returncode != 0 and "WEIGHT" not in proc.stdout, proc.stdout
    assert "kvstore 'mpi' is not available: mxnet_mpi could not be loaded" in proc.stderr
    assert "%s must be 0 or 1 (or true/false, yes/no, on/off), got 'abc'" % variable \
        in proc.stderr
    if variable != "MXNET_MPI_TRANSPORT_DEFAULTS":
        return   # every name refused: once is enough
    # In a rank of a job of several, the defaults the hook set for mxnet_mpi
    # go back when it fails: its one-at-a-time updates without the package's
    # mended LAMB left float16 weights with multi_precision untrained
    probe = ("import os, mxnet as mx\n"
             "print('AGG', os.environ.get('MXNET_OPTIMIZER_AGGREGATION_SIZE'),"
             " mx.optimizer.LAMB().aggregate_num)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=dict(env, OMPI_COMM_WORLD_SIZE="2"), cwd=str(ROOT), timeout=120)
    assert "AGG None 45" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert "could not be loaded" in proc.stderr
    probe = ("import mxnet as mx, _mxnet_mpi_autoload as hook\n"
             "for name in hook.STORE_NAMES:\n"
             "    try:\n        mx.kv.create(name)\n    except mx.base.MXNetError as e:\n"
             "        print('REFUSED', name)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, cwd=str(ROOT), timeout=120)
    assert proc.stdout.count("REFUSED") == 6, proc.stdout + proc.stderr[-2000:]


def test_hook_knows_every_store_name():
    from mxnet.kvstore import KVStoreBase

    import _mxnet_mpi_autoload as hook
    import mxnet_mpi  # noqa: F401  (registers the stores)
    ours = sorted(n for n, c in KVStoreBase.kv_registry.items()
                  if c.__module__.startswith("mxnet_mpi"))
    assert ours == sorted(hook.STORE_NAMES)


def test_exit_status_and_traceback_are_the_scripts():
    proc = runner(PLAIN, "mpi", "exit3")
    assert proc.returncode == 3, proc.stderr[-2000:]
    proc = runner(PLAIN, "mpi_chained", "fail")
    assert proc.returncode == 1
    tb = proc.stderr[proc.stderr.index("Traceback"):]
    line = next(i for i, text in enumerate(open(PLAIN), 1) if "raise ValueError" in text)
    assert '%s", line %d, in <module>' % (PLAIN, line) in tb, tb
    assert "ValueError: boom in the user's script" in tb
    assert "runner.py" not in tb and "runpy" not in tb, tb


@pytest.mark.parametrize("how", ["exit3-last", "raise3-last"])
def test_exit_status_on_one_of_two_ranks_ends_the_job_quickly(how):
    # rank 1 calls sys.exit(3) (or raises SystemExit(3)) after a step; rank 0 would
    # go on training (200 steps, its next allreduce never matched): the non-zero
    # status must end the job now, named as such (not as a clean finish)
    start = time.monotonic()
    proc = runner(PLAIN, "mpi", how, np_=2, timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "rank 1 is exiting with status 3; aborting the MPI job" in proc.stderr, \
        proc.stderr[-3000:]
    assert elapsed < 45, "took %.0f s" % elapsed


def test_failure_on_one_rank_ends_the_whole_job():
    # rank 1 raises after a step while rank 0 trains on: the job ends, naming rank 1
    proc = runner(PLAIN, "mpi", "fail", np_=2, timeout=60)
    assert proc.returncode != 0
    assert "rank 1 raised ValueError; aborting the MPI job" in proc.stderr, proc.stderr[-3000:]


def test_module_form_runs_as_main_with_its_exit_status():
    # python -m mxnet_mpi -m MODULE: the module from the current directory, as __main__
    proc = runner("-m", "tests.scripts.plain_mxnet", "mpi", "exit3")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "name __main__ argv ['mpi', 'exit3'] mpi loaded path0 %s" % ROOT in proc.stdout
    assert weights(proc.stdout) == {0: (-1.0, 0.0)}, proc.stdout


def test_usage_and_missing_script():
    assert runner().returncode == 2
    proc = runner("no_such_script.py")
    assert proc.returncode == 2 and "no_such_script.py" in proc.stderr


def test_launcher_runs_unchanged_scripts_through_the_runner():
    # hybrid store, one group per rank, a real ps-lite server: no import in the script
    proc = launching.run(2, 2, 1, [sys.executable, PLAIN, "dist_sync_mpi"])
    assert weights(proc.stdout) == {0: (-3.0, 0.0), 1: (-3.0, 0.0)}, proc.stdout[-3000:]


def test_launcher_puts_the_runner_after_interpreter_options():
    from mxnet_mpi.launch import through_runner
    py = sys.executable
    assert through_runner([py, "t.py", "-u"]) == [py, "-m", "mxnet_mpi", "t.py", "-u"]
    assert through_runner([py, "-u", "-W", "ignore", "-Xdev", "-m", "pkg.mod", "a"]) == \
        [py, "-u", "-W", "ignore", "-Xdev", "-m", "mxnet_mpi", "-m", "pkg.mod", "a"]
    for unchanged in ([py, "-m", "mxnet_mpi", "t.py"], [py, "-u", "-m", "mxnet_mpi", "t.py"],
                      [py, "-c", "print(1)"], [py, "--version"], ["./train.sh", "t.py"]):
        assert through_runner(unchanged) == unchanged

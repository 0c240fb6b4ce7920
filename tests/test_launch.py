"""`python -m mxnet_mpi.launch`: ps-lite scheduler/servers plus mpirun workers in one
command, and no process left behind when a worker fails or the launcher is stopped."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from launching import alive, pids_of, port_of, processes_with_port, run, start, stop, wait_gone
from mpirun import ROOT, SCRIPTS, mpi_env

PROBE = [sys.executable, str(SCRIPTS / "launch_probe.py")]


def test_worker_error_tears_everything_down():
    # 4 ranks in 2 groups: two ps-lite workers (the leaders); rank 1 (not a
    # leader) raises once the parameter server is up and in use.
    proc = run(4, 2, 1, PROBE + ["--mode", "fail", "--fail-rank", "1"], check=False)
    out = proc.stdout
    assert proc.returncode != 0, out[-3000:]
    assert "rank 1 fails on purpose" in out
    # The failing rank got past a world barrier after a push/pull through the
    # server: every process of the job was up and connected when it failed.
    assert "READY rank 1 " in out and "sum [4.0, 4.0, 4.0, 4.0]" in out, out[-3000:]
    assert "mpirun exited with status" in out
    port, pids = port_of(out), pids_of(out)
    assert set(pids) == {"scheduler", "server0", "mpirun"}
    assert wait_gone(port, timeout=10) == []
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)   # gone (reaped by the launcher)


def test_killed_rank_tears_everything_down_fast():
    """A rank killed outright (SIGKILL: no exception hook, no MPI_Abort) still
    brings the whole job down, non-zero, within 30 s, leaving nothing behind."""
    proc = start(2, 1, 1, PROBE + ["--mode", "kill", "--fail-rank", "1"])
    lines = []
    try:
        for line in proc.stdout:      # rank 1 kills itself right after READY
            lines.append(line)
            if "READY rank 1 " in line:
                break
        t_killed = time.time()
        out, _ = proc.communicate(timeout=60)
    except BaseException:
        stop(proc)
        raise
    took = time.time() - t_killed
    out = "".join(lines) + out
    assert proc.returncode != 0, out[-3000:]
    assert took < 30, took
    port, pids = port_of(out), pids_of(out)
    assert wait_gone(port, timeout=10) == []
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_mpirun_killed_by_a_signal_gives_128_plus_its_number():
    """mpirun killed by SIGKILL: the launcher exited 247 (sys.exit(-9))."""
    proc = start(2, 1, 1, PROBE + ["--mode", "sleep"])
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "READY rank 1 " in line:
                break
        os.kill(pids_of("".join(lines))["mpirun"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
    except BaseException:
        stop(proc)
        raise
    assert proc.returncode == 128 + signal.SIGKILL, "".join(lines) + out[-3000:]


@pytest.mark.parametrize("sig", [signal.SIGTERM])   # SIGINT takes the same handler
def test_signal_tears_everything_down(sig):
    proc = start(2, 1, 1, PROBE + ["--mode", "sleep"])
    lines = []
    try:
        for line in proc.stdout:      # wait until both ranks hold the store
            lines.append(line)
            if sum("READY" in ln for ln in lines) == 2:
                break
        assert sum("sum [2.0, 2.0, 2.0, 2.0]" in ln for ln in lines) == 2, "".join(lines)[-3000:]
        port = port_of("".join(lines))
        assert len(processes_with_port(port)) >= 4   # scheduler, server, 2 ranks (+ mpirun)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    except BaseException:
        stop(proc)
        raise
    out = "".join(lines) + out
    assert proc.returncode == 128 + sig, out[-3000:]
    assert "got %s" % sig.name in out
    assert wait_gone(port, timeout=10) == []


def test_servers_zero_is_pure_mpi():
    proc = run(2, 2, 0, PROBE + ["--mode", "mpi"], env={"DMLC_PS_ROOT_PORT": "1"})
    sums = [ln for ln in proc.stdout.splitlines() if "SUM" in ln]
    assert len(sums) == 2, proc.stdout[-3000:]
    for ln in sums:
        # allreduce over both ranks; group size n/groups; no ps-lite variables
        assert "SUM [3.0, 3.0, 3.0] GROUP_SIZE 1 DMLC_VARS []" in ln, ln
    assert "scheduler" not in proc.stdout
    # a hybrid store there needs ps-lite: the advice says why the 0 gives none
    bad = run(2, 2, 0, PROBE + ["--mode", "fail"], check=False, timeout=120)
    assert bad.returncode != 0
    assert "DMLC_PS_ROOT_URI" in bad.stdout and "--servers 0 starts no ps-lite" in bad.stdout, \
        bad.stdout[-3000:]


def test_exit_hang_without_our_store_is_named_and_ended():
    """Ranks that use no mxnet_mpi store (so no watchdog of ours runs in them)
    finish their scripts, then cannot exit: rank 1 waits in an exit handler,
    rank 0 while objects are freed at interpreter teardown. The launcher names
    both, with where each is stuck, at MXNET_MPI_STALL_WARN_S, and ends the
    job, non-zero, at MXNET_MPI_STALL_ABORT_S, leaving no process behind."""
    t0 = time.time()
    proc = run(2, 2, 0, PROBE + ["--mode", "exit-hang"], "--grace", "3", check=False,
               env={"MXNET_MPI_STALL_WARN_S": "1", "MXNET_MPI_STALL_ABORT_S": "4"}, timeout=90)
    took = time.time() - t0
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    pids = [int(p) for p in re.findall(r"SCRIPT_DONE rank \d pid (\d+)", out)]
    assert len(pids) == 2, out[-3000:]
    # at the warning (1 s) a loaded machine may still be running rank 0's exit
    # handlers; by the abort (4 s) it is past them (checked in the verdict below)
    assert re.search(r"every rank finished its script \d+ s ago, but these are still running: "
                     r"rank 0 on host \S+ \((in|after) its exit handlers[^)]*\); "
                     r"rank 1 on host \S+ \(in its exit handlers\)", out), out[-3000:]
    assert re.search(r"rank 1 finished its script but did not exit \(in its exit handlers\)",
                     out), out[-3000:]
    assert re.search(r"rank 0 finished its script but did not exit \(after its exit handlers",
                     out), out[-3000:]
    assert took < 4 + 40, took
    assert not any(alive(pid) for pid in pids)


def test_exit_pending_once_every_rank_finished_its_script():
    """The launcher's exit bound starts only when every rank's script has
    finished; a rank gone through os._exit (no 'done' line) has finished."""
    from mxnet_mpi.launch_watch import RankState, RankWatch

    watch = RankWatch(2, "127.0.0.1")
    try:
        t = time.monotonic()
        watch.ranks = {0: RankState("h0", 10, t), 1: RankState("h1", 11, t, done=t)}
        assert watch.exit_pending() is None            # rank 0 still runs its script
        watch.ranks[0] = RankState("h0", 10, t, status=0, ended=t, closed=t)   # os._exit(0)
        since, stuck = watch.exit_pending()
        assert stuck == ["rank 1 on host h1 (in its exit handlers)"] and since >= 0
        watch.ranks[1].status, watch.ranks[1].ended = 0, t
        assert "after its exit handlers" in watch.exit_pending()[1][0]
        watch.ranks[1].closed = t
        assert watch.exit_pending() is None and watch.verdict() == []
    finally:
        watch.close()


def test_hostfile_on_localhost(tmp_path):
    """--hostfile goes to mpirun (multi-machine use); here it lists this host."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    proc = run(2, 2, 0, PROBE + ["--mode", "mpi"], "--hostfile", str(hostfile),
               "--ps-host", "127.0.0.1", env={"DMLC_PS_ROOT_PORT": "1"})
    sums = [ln for ln in proc.stdout.splitlines() if "SUM" in ln]
    assert len(sums) == 2 and all("SUM [3.0, 3.0, 3.0]" in ln for ln in sums), proc.stdout
    # and it really is mpirun's hostfile: a missing one makes mpirun fail
    bad = run(2, 2, 0, PROBE + ["--mode", "mpi"], "--hostfile", str(tmp_path / "missing"),
              "--ps-host", "127.0.0.1", check=False)
    assert bad.returncode != 0 and "mpirun exited with status" in bad.stdout


@pytest.mark.parametrize("args, message", [
    (["-n", "4", "--groups", "3", "--", "true"], "--groups 3 does not divide -n 4"),
    (["-n", "2", "--"], "no command given"),
])
def test_bad_arguments(args, message):
    proc = subprocess.run([sys.executable, "-m", "mxnet_mpi.launch", *args],
                          capture_output=True, text=True, timeout=120, cwd=str(ROOT),
                          env=mpi_env())
    assert proc.returncode == 2
    assert message in proc.stderr


LAUNCHER_IMPORTS = ("import runpy, sys\n"
                    "sys.argv = ['-m'] + sys.argv[1:]\n"
                    "sys.orig_argv = [sys.executable, '-m', 'mxnet_mpi.launch'] + sys.argv[1:]\n"
                    "import mxnet_mpi, mxnet_mpi.launch as launch\n"
                    "assert not hasattr(mxnet_mpi, 'MPIKVStore')\n"
                    "try:\n"
                    "    launch.main(sys.argv[1:])\n"
                    "finally:\n"
                    "    bad = sorted(m for m in sys.modules if m.split('.')[0] == 'mxnet'\n"
                    "                 or m in ('mxnet_mpi._native', 'mxnet_mpi.hybrid'))\n"
                    "    print('LOADED', bad, flush=True)\n")


def test_launcher_imports_neither_mxnet_nor_the_native_library():
    """`python -m mxnet_mpi.launch --help`, and starting ps-lite and mpirun, load
    neither MXNet nor the native library in the launcher (its workers do)."""
    helped = subprocess.run([sys.executable, "-X", "importtime", "-m", "mxnet_mpi.launch",
                             "--help"], capture_output=True, text=True, env=mpi_env(),
                            cwd=str(ROOT), timeout=60)
    assert helped.returncode == 0 and "--servers" in helped.stdout, helped.stderr[-2000:]
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in helped.stderr.splitlines()
                if ln.startswith("import time:")}
    assert "mxnet_mpi.routes" in imported, imported   # the launcher ran (as __main__)
    assert not {"mxnet", "mxnet_mpi._native", "mxnet_mpi.hybrid"} & imported, imported
    # A whole launch with a ps-lite scheduler and server (its workers: `true`, which
    # connect to no one; the servers are stopped after --grace).
    proc = subprocess.run([sys.executable, "-c", LAUNCHER_IMPORTS, "-n", "1", "--servers", "1",
                           "--grace", "1", "--", "true"], capture_output=True, text=True,
                          env=mpi_env(), cwd=str(ROOT), timeout=120)
    out = proc.stdout + proc.stderr
    assert "ps-lite scheduler at" in out and "LOADED []" in out, out[-3000:]


def test_scheduler_command_loads_libmxnet_without_the_mxnet_package():
    """The launcher's ps-lite scheduler (mxnet_mpi/pslite_roles.py) imports no
    mxnet module: here without DMLC_ROLE, it names what is missing and stops;
    every launch with --servers in this suite runs it for real."""
    from mxnet_mpi.pslite_roles import role_command

    cmd = role_command("scheduler")
    env = {k: v for k, v in mpi_env().items() if k != "DMLC_ROLE"}
    proc = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], capture_output=True,
                          text=True, env=env, cwd=str(ROOT), timeout=60)
    assert proc.returncode != 0 and "needs DMLC_ROLE=scheduler" in proc.stderr, proc.stderr
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines()
                if ln.startswith("import time:")}
    assert "ctypes" in imported and not any(m.split(".")[0] == "mxnet" for m in imported)
    assert role_command("server")[-1] == "import mxnet"   # MXNet's own server
    with pytest.raises(ValueError, match="unknown ps-lite role 'worker'"):
        role_command("worker")


@pytest.mark.parametrize("kvstore", ["dist_sync", "dist_async"])
def test_mxnet_own_parameter_server_exits_as_without_us(kvstore):
    """MXNet's own dist_sync/dist_async through the launcher (which runs the
    script through the runner), with the Trainer alive until the interpreter
    exits: exit 0, nothing printed by a crash at exit, and the final weights
    that the same job gives without the runner (`-- env python ...`; the
    loss is linear in the weights, so dist_async's are order-free too). On
    dist_sync, a last step that one rank leaves queued when its script ends
    is still sent (MXNet's exit handler alone would skip it and the other
    rank would wait forever)."""
    proc = run(2, 2, 1, [sys.executable, str(SCRIPTS / "ps_exit.py"), kvstore], "--grace", "3",
               timeout=180)
    finals = sorted(ln.split("FINAL ", 1)[1].split() for ln in proc.stdout.splitlines()
                    if "FINAL " in ln)
    assert finals == [["0", "-30.000000", "-6.000000"], ["1", "-30.000000", "-6.000000"]], \
        proc.stdout[-3000:]
    if kvstore == "dist_sync":   # the step rank 0 left queued at its exit was applied
        assert "AFTER5 1 -39.000000 -7.500000" in proc.stdout, proc.stdout[-3000:]
    for bad in ("terminate called", "Aborted", "exited on signal", "not every rank"):
        assert bad not in proc.stdout, proc.stdout[-3000:]


def test_mxnet_own_store_with_fewer_ps_workers_than_ranks_is_named():
    """MXNet's own dist_sync launched without --groups (DMLC_NUM_WORKER=1, one
    worker per group, for the hybrid stores, on a job of 2 ranks): rank 0
    trained alone and rank 1 hung in ps-lite until the stall abort, named only
    as a rank missing. Now an error at the store's creation says why."""
    proc = run(2, 1, 1, [sys.executable, str(SCRIPTS / "ps_exit.py"), "dist_sync"],
               timeout=120, env={"MXNET_MPI_STALL_ABORT_S": "60"}, check=False)
    assert proc.returncode != 0
    assert ("kvstore 'dist_sync' (MXNet's own) makes every rank a ps-lite worker, but this "
            "job has 2 ranks and DMLC_NUM_WORKER=1") in proc.stdout, proc.stdout[-3000:]
    assert "launch with --groups 2" in proc.stdout
    assert "FINAL" not in proc.stdout

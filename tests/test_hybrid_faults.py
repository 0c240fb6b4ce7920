"""Hybrid stores under faults, with real ps-lite and mpirun started by
`python -m mxnet_mpi.launch`: parameter-server errors reach every rank of the
group, row_sparse_pull with no rows, several Trainers on one store."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

import numpy as np
import pytest
from launching import pids_of, port_of, processes_with_port, start, stop, wait_gone
from launching import run as launch
from mpirun import SCRIPTS

SCRIPT = str(SCRIPTS / "hybrid_faults.py")
N, GROUPS = 4, 2
FAST = {"MXNET_MPI_STALL_WARN_S": "5", "MXNET_MPI_STALL_ABORT_S": "20"}


def results(output: str) -> dict:
    """{case: [row per rank, by rank]} from the RESULT lines."""
    by_case: dict = {}
    for ln in output.splitlines():
        if "RESULT " in ln:
            row = json.loads(ln.split("RESULT ", 1)[1])
            by_case.setdefault(row["case"], []).append(row)
    return {c: sorted(rows, key=lambda r: r["rank"]) for c, rows in by_case.items()}


def run_cases(cases: list, kvstore: str = "dist_sync_mpi", groups: int = GROUPS) -> dict:
    """Run several cases one after another in one launched job (one store)."""
    proc = launch(N, groups, 1, [sys.executable, SCRIPT, "--case", ",".join(cases),
                                 "--kvstore", kvstore], timeout=90, env=FAST)
    rows = results(proc.stdout)
    for case in cases:
        assert len(rows.get(case, [])) == N, proc.stdout[-4000:]
    return rows


# The sync cases share one launched job: each needs the cluster, none breaks it.
SYNC_CASES = ["uninit_pull", "two_trainers", "rsp_no_rows", "other_params", "raw_key",
              "sub_block", "lr_changed"]


@pytest.fixture(scope="module")
def sync_rows() -> dict:
    return run_cases(SYNC_CASES)


def test_uninitialised_pull_fails_on_every_rank(sync_rows):
    rows = sync_rows["uninit_pull"]
    errors = {r["error"] for r in rows}
    assert len(errors) == 1, rows            # the same error on every rank
    msg = errors.pop()
    assert msg is not None and "pull of key 99" in msg and "never initialised" in msg, msg
    for r in rows:
        assert r["seconds"] < 10, r
        assert r["after"] == [[1.0] * 3] * 2, r   # the store still works


def test_row_sparse_pull_with_no_rows_in_a_group(sync_rows):
    for r in sync_rows["rsp_no_rows"]:
        dense = np.array(r["dense"])
        if r["group"] == 1 and r["rank"] % 2 == 0:
            assert r["rows"] == [2]
            np.testing.assert_array_equal(dense[2], [1.0, 1.0])
            dense[2] = 0
        else:
            assert r["rows"] == [], r
        assert not dense.any(), r


def test_several_trainers_do_not_reinit_the_servers(sync_rows):
    # 3 steps of SGD(0.1) on sum over ranks of d(sum(W x + b)): grad W = sum(rank+1)
    # per column, grad b = N; from W = 0.5, b = 0, untouched by re-inits.
    s = sum(range(1, N + 1))
    want_w = np.full((2, 3), 0.5 - 3 * 0.1 * s)
    want_b = np.full(2, 0.0 - 3 * 0.1 * N)   # Dense: bias_initializer="zeros"
    for r in sync_rows["two_trainers"]:
        np.testing.assert_allclose(r["weight"], want_w, rtol=1e-5)
        np.testing.assert_allclose(r["bias"], want_b, rtol=1e-5)


def test_trainers_over_other_parameters_cannot_share_server_weights(sync_rows):
    """Trainers over nets of the same layout as an earlier Trainer's on one
    store whose servers update: their keys are the earlier net's weights
    there, and they trained on them (wrong weights on every rank, silently).
    Refused on every rank at the step, naming both parameters."""
    for r in sync_rows["other_params"]:
        assert r["error"] is not None and "key 0 holds the weight of an earlier Trainer's " \
            "parameter" in r["error"] and "update_on_kvstore=False" in r["error"], r


def test_trainer_at_a_key_the_stores_own_init_gave_a_value_is_refused(sync_rows):
    """kv.init(2, 7s), then a server-update Trainer whose parameter 2 has that
    shape: the servers updated the 7s as its weight (6.8 after a step at
    rate 0, exit 0). Refused at its step, naming the key."""
    for r in sync_rows["raw_key"]:
        assert r["error"] is not None and "key 2 holds the value the store's own init" \
            in r["error"], r


def test_trainer_of_other_shapes_at_held_keys_names_both_parameters(sync_rows):
    """A Trainer whose parameters have other shapes at keys the servers hold
    for an earlier Trainer: the message named only the new parameter, as if
    it had changed shape. It names the parameter that first used the key and
    says the servers keep it."""
    for r in sync_rows["sub_block"]:
        # two_trainers' layer is the script's first block; a Trainer's key 0
        # is its bias (gluon.Trainer sorts a ParameterDict by name)
        assert r["error"] is not None and "was first used with shape (2,)" in r["error"], r
        assert "by parameter 'dense0_bias'" in r["error"] and "the servers keep a key's " \
            "first one" in r["error"], r


def test_learning_rate_changed_after_the_optimizer_went_to_the_servers(sync_rows):
    """Trainer.set_learning_rate with the optimizer on the servers was ignored
    without a word (the servers kept 0.1): refused on every rank instead."""
    for r in sync_rows["lr_changed"]:
        assert r["error"] is not None and "changed after they went to the parameter " \
            "servers" in r["error"] and "lr=0.1" in r["error"] and "lr=0.05" in r["error"], r


def test_several_trainers_async():
    """Asynchronous servers: each group's last pull holds its own 3 updates and
    0 to 3 of the other group's (a re-initialised key would lose updates)."""
    rows = run_cases(["two_trainers"], "dist_async_mpi")["two_trainers"]
    assert len(rows) == N
    per = N // GROUPS
    sums = [sum(r + 1 for r in range(g * per, (g + 1) * per)) for g in range(GROUPS)]
    for g in range(GROUPS):
        group = [r for r in rows if r["group"] == g]
        assert len(group) == per and all(r["weight"] == group[0]["weight"] and
                                         r["bias"] == group[0]["bias"] for r in group), group
        w, b = np.array(group[0]["weight"]), np.array(group[0]["bias"])
        assert (w >= 0.5 - 0.3 * sum(sums) - 1e-5).all() and \
            (w <= 0.5 - 0.3 * sums[g] + 1e-5).all(), (g, w)
        assert (b >= -0.3 * N - 1e-5).all() and (b <= -0.3 * per + 1e-5).all(), (g, b)


def _kill_left(port: int) -> list:
    """SIGCONT + SIGKILL whatever the job left behind (by PID); returns it."""
    left = processes_with_port(port)
    for pid, _ in left:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    return left


def _stop_while_training(case: str, victim: str) -> tuple:
    """Start N ranks in GROUPS groups on the script's `case`, SIGSTOP `victim`
    ('scheduler', 'server0' or 'rank<r>') once every rank is READY, and wait
    for the job to end: (exit status, output, seconds after the stop,
    processes left behind)."""
    env = {"MXNET_MPI_STALL_WARN_S": "2", "MXNET_MPI_STALL_ABORT_S": "5"}
    proc = start(N, GROUPS, 1, [sys.executable, SCRIPT, "--case", case], env=env)
    lines: list = []
    port = None
    try:
        for line in proc.stdout:
            lines.append(line)
            if sum("READY" in ln for ln in lines) == N:
                break
        port, pids = port_of("".join(lines)), pids_of("".join(lines))
        pids.update({"rank%s" % m.group(1): int(m.group(2)) for m in
                     (re.search(r"READY rank (\d+) pid (\d+)", ln) for ln in lines) if m})
        os.kill(pids[victim], signal.SIGSTOP)
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=45)
        took = time.monotonic() - t0
    finally:
        stop(proc)
        leftovers = _kill_left(port) if port is not None else []
    return proc.returncode, "".join(lines) + out, took, leftovers


def test_stopped_scheduler_is_named_at_the_exit_barrier():
    """The scheduler stopped with SIGSTOP: training goes on (it is off the data
    path), then ps-lite's exit barrier needs it: the ranks warn about that
    barrier, the job aborts at MXNET_MPI_STALL_ABORT_S, nothing is left behind."""
    rc, out, took, leftovers = _stop_while_training("train_steps", "scheduler")
    assert rc != 0, out[-3000:]
    assert out.count("RESULT ") == N, out[-3000:]        # training itself finished
    assert "stall warning: 'parameter-server exit barrier" in out, out[-3000:]
    assert "MXNET_MPI_STALL_ABORT_S=5" in out, out[-3000:]
    assert took < 30, took
    assert leftovers == [], leftovers
    print("time to abort after SIGSTOP of the scheduler: %.1f s" % took)


def test_stopped_server_does_not_outlive_a_killed_launcher():
    """Server stopped with SIGSTOP, then the launcher killed outright (SIGKILL:
    no teardown): the parent-death signal still removes every process."""
    proc = start(2, 1, 1, [sys.executable, str(SCRIPTS / "launch_probe.py"), "--mode", "sleep"])
    lines: list = []
    port = None
    try:
        for line in proc.stdout:
            lines.append(line)
            if sum("READY" in ln for ln in lines) == 2:
                break
        out = "".join(lines)
        port, pids = port_of(out), pids_of(out)
        os.kill(pids["server0"], signal.SIGSTOP)
        t0 = time.monotonic()
        proc.kill()
        proc.wait(timeout=10)
        left = wait_gone(port, timeout=20)
        took = time.monotonic() - t0
    finally:
        stop(proc)
        if port is not None:
            leftovers = _kill_left(port)
    assert left == [] and leftovers == [], left
    assert took < 20, took


@pytest.mark.parametrize("victim", ["server0", "rank1"])
def test_stopped_server_is_named_and_aborts(victim):
    """A server stopped with SIGSTOP while 2 groups train (a stopped scheduler is
    off the data path: training goes on until the exit barrier):
    the waiting ranks warn about a parameter-server request, the job aborts at
    MXNET_MPI_STALL_ABORT_S and nothing is left behind."""
    rc, out, took, leftovers = _stop_while_training("train_loop", victim)
    assert rc != 0, out[-3000:]
    # group 1 waits on the servers for group 0's push; with a stopped rank 1,
    # its group peer rank 0 names it
    assert "stall warning: 'parameter-server pull of key 0" in out, out[-3000:]
    assert "servers or the scheduler do not answer" in out, out[-3000:]
    if victim == "rank1":
        assert "Missing ranks: 1 (not answering" in out, out[-3000:]
    assert "MXNET_MPI_STALL_ABORT_S=5" in out, out[-3000:]
    assert took < 30, took
    assert leftovers == [], leftovers
    print("time to abort after SIGSTOP of %s: %.1f s" % (victim, took))

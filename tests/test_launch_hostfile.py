"""mxnet_mpi.launch --hostfile without --groups: one group per host (the hosts
the ranks fill slot by slot), or a clear error when that is ambiguous."""

from __future__ import annotations

import os
import sys

import pytest

from mxnet_mpi import launch


def parse(tmp_path, text: str, n: int):
    hostfile = tmp_path / "hosts"
    hostfile.write_text(text)
    return launch.parse_args(["-n", str(n), "--hostfile", str(hostfile), "--", "true"])


def test_one_group_per_filled_host(tmp_path, monkeypatch):
    monkeypatch.delenv("MXNET_MPI_GROUP_SIZE", raising=False)
    args = parse(tmp_path, "# cluster\nnode1 slots=2\n\nnode2 slots=2 # spare\nnode3 slots=2\n", 4)
    assert (args.groups, args.per_host) == (2, True)   # node3 gets no rank
    env, ps_env, exported = launch.job_env(args)
    assert env["DMLC_NUM_WORKER"] == "2"               # one ps-lite worker per group
    assert "MXNET_MPI_GROUP_SIZE" not in env          # the store's default: ranks per host
    assert "MXNET_MPI_GROUP_SIZE" not in exported


def test_explicit_groups_still_win(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=2\nnode2 slots=2\n")
    args = launch.parse_args(["-n", "4", "--groups", "4", "--hostfile", str(hostfile), "--",
                              "true"])
    env, _, _ = launch.job_env(args)
    assert (args.groups, env["MXNET_MPI_GROUP_SIZE"], env["DMLC_NUM_WORKER"]) == (4, "1", "4")


@pytest.mark.parametrize("text, n, message", [
    ("node1 slots=2\nnode2 slots=2\n", 3, "does not fill the --hostfile hosts evenly"),
    ("node1 slots=2\nnode2 slots=2\n", 6, "-n 6 is more ranks than the --hostfile's 4 slots"),
    ("node1\nnode2\n", 2, "has no slots=N: give --groups"),
])
def test_ambiguous_hostfile_is_an_error(tmp_path, capsys, text, n, message):
    with pytest.raises(SystemExit) as exc:
        parse(tmp_path, text, n)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_mpirun_arg_takes_a_value_that_starts_with_a_dash():
    args = launch.parse_args(["-n", "2", "--mpirun-arg", "--bind-to", "--mpirun", "none",
                              "--m", "-x", "--", "python", "t.py", "--mpirun-arg", "--x"])
    assert args.mpirun_arg == ["--bind-to", "none", "-x"]   # argparse's prefixes too
    assert args.command == ["python", "t.py", "--mpirun-arg", "--x"]   # the script's own
    # without `--` too: the command starts at its first word (its --m and --mpi
    # became --mpirun-arg=...)
    args = launch.parse_args(["-n", "2", "--servers", "0", "--m", "-x", "python", "t.py", "--m",
                              "0.9", "--mpi", "1"])
    assert args.mpirun_arg == ["-x"] and args.servers == 0
    assert args.command == ["python", "t.py", "--m", "0.9", "--mpi", "1"]


# What prterun printed for a hostfile line naming a host that does not resolve
UNSTARTED = b"""ssh: Could not resolve hostname nosuchhost.invalid: Name or service not known
------------------------------------------------------------
A daemon failed to report back after being spawned. This could
be due to several factors, including inability to find the
daemon executable, or the executable was unable to find its
required supporting libraries.

  Local host:    vm
  Remote host:   nosuchhost
  Daemon exit status: 255
------------------------------------------------------------
"""


def test_host_whose_daemon_never_started_is_named_with_what_to_check(capsys):
    mpirun = launch.Child("mpirun", [sys.executable, "-c",
                                     "import sys; sys.stderr.buffer.write(%r)" % UNSTARTED],
                          dict(os.environ), prefix_output=False, watch_stderr=True)
    mpirun.proc.wait(timeout=60)
    # Open MPI cut the name at its first dot: named as the hostfile has it
    mpirun.hostfile_hosts = ["nosuchhost.invalid"]

    class NoReports:
        def verdict(self):
            return []

    assert launch._verdict(NoReports(), 255, mpirun) == 255
    err = capsys.readouterr().err
    assert "host nosuchhost.invalid: mpirun could not start its daemon there" in err, err
    assert "lost by mpirun" not in err

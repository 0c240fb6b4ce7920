"""Run `python -m mxnet_mpi.launch` from tests, and find processes it left behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from mpirun import ROOT, mpi_env

PORT_RE = re.compile(r"ps-lite scheduler at [^:]+:(\d+)")
PIDS_RE = re.compile(r"pids: (.*)")


def launch_cmd(n: int, groups: int, servers: int, command: list, *opts: str) -> list:
    return [sys.executable, "-m", "mxnet_mpi.launch", "-n", str(n), "--groups", str(groups),
            "--servers", str(servers), *opts, "--", *command]


def start(n: int, groups: int, servers: int, command: list, *opts: str,
          env: dict | None = None) -> subprocess.Popen:
    """Start the launcher (its own session) with output merged into stdout."""
    return subprocess.Popen(launch_cmd(n, groups, servers, command, *opts), cwd=str(ROOT),
                            env=mpi_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    """Last resort on a test timeout: SIGTERM the launcher (it tears its job down)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def run(n: int, groups: int, servers: int, command: list, *opts: str, timeout: float = 240,
        env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run a whole launch; fail with its output on a non-zero exit (if `check`)."""
    proc = start(n, groups, servers, command, *opts, env=env)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        out, _ = proc.communicate()
        raise AssertionError("launch timed out after %ss:\n%s" % (timeout, out[-8000:])) from None
    if check and proc.returncode != 0:
        raise AssertionError("launch exited %d:\n%s" % (proc.returncode, out[-8000:]))
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def port_of(output: str) -> int:
    m = PORT_RE.search(output)
    assert m, "the launcher did not report its scheduler port:\n" + output[-3000:]
    return int(m.group(1))


def pids_of(output: str) -> dict:
    """{name: pid} from the launcher's 'pids:' line."""
    m = PIDS_RE.search(output)
    assert m, "the launcher did not report its pids:\n" + output[-3000:]
    return {k: int(v) for k, v in (item.split("=") for item in m.group(1).split())}


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def processes_with_port(port: int) -> list:
    """(pid, cmdline) of live processes whose environment has DMLC_PS_ROOT_PORT=port."""
    needle = b"DMLC_PS_ROOT_PORT=%d\0" % port
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                environ = f.read() + b"\0"
            with open("/proc/%s/stat" % entry) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in environ and state != "Z":
            found.append((int(entry), cmdline))
    return found


def wait_gone(port: int, timeout: float = 20) -> list:
    """Processes of the job with `port` still alive after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    left = processes_with_port(port)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = processes_with_port(port)
    return left

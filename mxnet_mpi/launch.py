"""Launch a hybrid job: ps-lite scheduler and servers here, workers under mpirun.

    python -m mxnet_mpi.launch -n 4 --groups 2 --servers 1 -- python train.py ...

starts MXNet's scheduler and ``--servers`` servers on this machine, then
``mpirun -np N`` (the one next to this Python, ``--oversubscribe``, output
tagged ``[job,rank]``) with every ``DMLC_*`` variable and
``MXNET_MPI_GROUP_SIZE = N / groups`` set (and exported with ``-x`` so that
``--hostfile`` hosts get them too). The training script uses
``kvstore='dist_sync_mpi'`` or ``'dist_async_mpi'``. ``--servers 0`` runs pure
MPI (no ps-lite, for ``kvstore='mpi'``).

Every child runs in its own session. When mpirun succeeds, the servers get a
few seconds to stop by themselves (they do once the workers closed their
stores) and are then stopped. When any process fails, or on SIGINT/SIGTERM,
everything is torn down (SIGTERM, then SIGKILL to every process left in the
children's sessions) and the launcher exits non-zero; the session directory of
an mpirun killed that way is removed (remove_session_dir).

Ranks run through the runner report their start (with their host) and their
end to this process (``MXNET_MPI_REPORT``; mxnet_mpi.report, launch_watch).
A rank that ends any other way fails the job, naming its host, even where
mpirun exits 0 (Open MPI 5 after losing a host); mpirun then gets ``--grace``
seconds to end the job before it is stopped here (after a pulled cable it
would wait for TCP, ~15 min). For ranks that do not report, a host that
mpirun's own output says it lost fails the job. Once every rank's script has
finished, the processes still running are named after
``MXNET_MPI_STALL_WARN_S`` and the job is ended, non-zero, after
``MXNET_MPI_STALL_ABORT_S``: a job never waits silently at exit, whatever store
it uses. This module imports neither MXNet nor the native library.

With ``--hostfile`` and no ``--groups``, each host the ranks fill (slot by
slot, as mpirun maps them) is one group. With ``--hostfile`` the ranks run
where mpirun places them; the scheduler and
the servers still run here, at ``--ps-host`` (default: this host's address),
which the other hosts must reach; workers there find their own address
(set ``DMLC_INTERFACE`` if they pick the wrong interface).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import transport
from .launch_watch import RankWatch
from .pslite_roles import role_command
from .report import ENV as REPORT_ENV
from .routes import ROUTES, expected_ps_workers
from .settings import stall_limits

PREFIX = "mxnet_mpi.launch: "
# Run a command with a parent-death signal (PR_SET_PDEATHSIG survives exec): if the
# launcher is killed outright, its children still get a signal. mpirun gets SIGTERM,
# which it forwards to the ranks; the scheduler and servers get SIGKILL, the one
# signal a stopped (SIGSTOP) process cannot leave pending.
_WRAP = ("import ctypes, os, sys; ctypes.CDLL(None).prctl(1, %d); "
         "os.execvp(sys.argv[1], sys.argv[1:])")
# Open MPI 5's mpirun exits 0 after losing a host; these lines of its stderr
# name the host (for ranks that do not report to the launcher themselves).
_LOST_HOST = re.compile(r"^\s*(?:Remote host:\s+(\S+)|Remote daemon:.* on node (\S+))")
_LOST_HEADERS = ("lost communication with a remote daemon", "daemon failed to report back")
_UNSTARTED = ("mpirun could not start its daemon there: check that the host name resolves, "
              "that `ssh HOST` works without a password, and that Open MPI and this Python "
              "are installed there at the same paths (ssh's or Open MPI's message is above)")


def log(msg: str) -> None:
    """One line on stderr, prefixed with the launcher's name."""
    sys.stderr.write(PREFIX + msg + "\n")
    sys.stderr.flush()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def parameter_server(num_workers: int, num_servers: int = 1, env: dict | None = None,
                     host: str = "127.0.0.1", cwd: str | None = None):
    """Run a ps-lite scheduler and `num_servers` servers here for the duration
    of the block; yields the environment for `num_workers` workers (based on
    `env`, default os.environ). Every process is killed on exit, whatever
    happened (for tests and benchmarks; jobs use ``main``)."""
    base = dict(os.environ if env is None else env)
    dmlc = {"DMLC_PS_ROOT_URI": host, "DMLC_PS_ROOT_PORT": str(free_port(host)),
            "DMLC_NUM_SERVER": str(num_servers), "DMLC_NUM_WORKER": str(num_workers),
            "DMLC_NODE_HOST": host, "PS_VERBOSE": "0"}
    procs = []
    try:
        for role in ["scheduler"] + ["server"] * num_servers:
            procs.append(subprocess.Popen(role_command(role),
                                          env={**base, **dmlc, "DMLC_ROLE": role}, cwd=cwd,
                                          start_new_session=True, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        yield {**base, **dmlc, "DMLC_ROLE": "worker"}
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def mpirun_path() -> str:
    """The mpirun next to this Python (the venv's Open MPI), else the one on PATH."""
    local = Path(sys.executable).parent / "mpirun"
    return str(local) if local.exists() else "mpirun"


def _session_members(sid: int) -> list:
    """PIDs of the processes in session `sid` (from /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 3 and int(fields[3]) == sid:
            pids.append(int(entry))
    return pids


class Child:
    """A child process in its own session, with optional prefixed output."""

    def __init__(self, name: str, cmd: list, env: dict, prefix_output: bool,
                 watch_stderr: bool = False) -> None:
        self.name = name
        out = subprocess.PIPE if prefix_output or watch_stderr else None
        err = subprocess.STDOUT if prefix_output else subprocess.PIPE if watch_stderr else None
        death = signal.SIGTERM if name == "mpirun" else signal.SIGKILL
        wrapped = ([sys.executable, "-S", "-c", _WRAP % death, *cmd]
                   if sys.platform == "linux" else cmd)
        self.proc = subprocess.Popen(wrapped, env=env, stdout=out, stderr=err,
                                     start_new_session=True)
        self.pid = self.proc.pid
        self.env = env
        self.killed_at: float | None = None   # when SIGKILL found it still running
        self.lost_hosts: list = []
        self.unstarted_hosts: set = set()   # lost before their daemon ever reported
        self.hostfile_hosts: list = []      # the names the user gave (--hostfile)
        self.thread = self.thread2 = None
        if prefix_output:
            self.thread = threading.Thread(target=self._forward, daemon=True)
            self.thread.start()
        elif watch_stderr:
            self.thread = threading.Thread(target=self._watch, daemon=True,
                                           args=(self.proc.stdout, sys.stdout))
            self.thread2 = threading.Thread(target=self._watch, daemon=True,
                                            args=(self.proc.stderr, sys.stderr))
            self.thread.start()
            self.thread2.start()

    def _watch(self, pipe, to) -> None:
        """Pass a stream through unchanged, noting the hosts mpirun says it lost
        (Open MPI prints that on stdout or stderr)."""
        lost = unstarted = False
        for raw in iter(pipe.readline, b""):
            # PRTE ends its help messages with a NUL byte and no newline, which
            # would glue itself to the launcher's next line: drop it.
            line = raw.replace(b"\0", b"").decode(errors="replace")
            if not line:
                continue
            try:
                to.write(line)
                to.flush()
            except (OSError, ValueError):
                pass   # our stream is gone: keep draining, or the child blocks on write
            if any(h in line for h in _LOST_HEADERS):
                lost, unstarted = True, _LOST_HEADERS[1] in line
            m = _LOST_HOST.match(line) if lost else None
            if m and (m.group(1) or m.group(2)) not in self.lost_hosts:
                self.lost_hosts.append(m.group(1) or m.group(2))
                if unstarted:
                    self.unstarted_hosts.add(self.lost_hosts[-1])

    def _forward(self) -> None:
        for raw in iter(self.proc.stdout.readline, b""):
            try:
                sys.stdout.write("[%s] %s" % (self.name, raw.decode(errors="replace")))
                sys.stdout.flush()
            except (OSError, ValueError):
                pass   # our stdout is gone: keep draining, or the child blocks on write

    def poll(self) -> int | None:
        """The exit status, or None while running."""
        return self.proc.poll()

    def signal(self, sig: int) -> None:
        """Send `sig` to the child's process group (ignore if gone)."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill_session(self) -> None:
        """SIGKILL every process still in the child's session (mpirun's ranks
        run in process groups of their own, but in its session)."""
        if self.poll() is None and self.killed_at is None:
            self.killed_at = time.time()
        for pid in _session_members(self.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.signal(signal.SIGKILL)


def teardown(children: list, grace: float) -> None:
    """SIGTERM every child, wait up to `grace` seconds, SIGKILL what is left
    (mpirun's whole session: its ranks and daemons started from here)."""
    for c in children:
        if c.poll() is None:
            c.signal(signal.SIGTERM)   # mpirun forwards it to the ranks
            c.signal(signal.SIGCONT)   # a stopped process acts on it now, not after `grace`
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(c.poll() is None for c in children):
        time.sleep(0.1)
    for c in children:
        c.kill_session()
        try:
            c.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log("%s (pid %d) did not die" % (c.name, c.pid))
            continue
        if c.name == "mpirun" and c.killed_at is not None:
            remove_session_dir(c.pid, c.env, c.killed_at)
    for c in children:
        for thread in (c.thread, getattr(c, "thread2", None)):
            if thread is not None:
                thread.join(timeout=2)


def remove_session_dir(pid: int, env: dict, killed_at: float) -> bool:
    """Remove the session directory (<tmp>/ompi.<pid>) of an mpirun that had to
    be killed, which it would have removed at its own end: while it is there, a
    later mpirun that gets the same pid fails to start. Only a directory of this
    user's, unchanged since `killed_at` (a new process with that pid would make
    a new one). Returns whether one was removed."""
    # where Open MPI's mpirun (PRRTE) puts it: the first of these variables set
    tmp = env.get("TMPDIR") or env.get("TEMP") or env.get("TMP") or "/tmp"
    path = os.path.join(tmp, "ompi.%d" % pid)
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.getuid() \
            or st.st_ctime > killed_at:
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.exists(path)


# Interpreter options that take no argument (may be combined: -uB), and those
# that take one (attached, -Wignore, or as the next word).
_PY_FLAGS = set("bBdEiIOPqRsSuvx")
_PY_WITH_ARG = {"-W", "-X", "--check-hash-based-pycs"}


def through_runner(command: list) -> list:
    """`command` with a Python script or module run by ``python -m mxnet_mpi``
    (after the interpreter's own options, e.g. ``python -u train.py``), so
    launched scripts need no ``import mxnet_mpi``; other commands unchanged."""
    if len(command) < 2 or not Path(command[0]).name.startswith("python"):
        return list(command)
    i = 1
    while i < len(command) and command[i].startswith("-") and command[i] != "-m":
        word = command[i]
        if word in _PY_WITH_ARG:
            i += 2
        elif word[:2] in ("-W", "-X") or (len(word) > 1 and set(word[1:]) <= _PY_FLAGS):
            i += 1
        else:   # -c CODE, -, --help, an option we do not know: leave the command alone
            return list(command)
    rest = command[i:]
    if not rest or rest[:2] == ["-m", "mxnet_mpi"] or rest[0] == "-mmxnet_mpi":
        return list(command)
    if rest[0] == "-m" and len(rest) < 2:
        return list(command)
    # python [OPTIONS] -m MOD ... / python [OPTIONS] SCRIPT ...
    return [*command[:i], "-m", "mxnet_mpi", *rest]


def parse_args(argv: list) -> argparse.Namespace:
    """The launcher's options; exits with status 2 on bad ones."""
    ap = argparse.ArgumentParser(
        prog="python -m mxnet_mpi.launch",
        description="Run ps-lite scheduler/servers here and the MPI workers under mpirun.",
        epilog="Example: python -m mxnet_mpi.launch -n 4 --groups 2 --servers 1 -- "
               "python train.py --kvstore dist_sync_mpi")
    ap.add_argument("-n", "--np", dest="n", type=int, required=True, help="MPI ranks")
    ap.add_argument("--groups", type=int, default=None,
                    help="MPI groups (MXNET_MPI_GROUP_SIZE = n / groups); default 1, or with "
                         "--hostfile one group per host (the store's own default group)")
    ap.add_argument("--servers", type=int, default=1,
                    help="ps-lite servers; 0 = pure MPI, no scheduler or servers")
    ap.add_argument("--route", choices=ROUTES, default="leader",
                    help="who talks to the servers: group leaders (DMLC_NUM_WORKER = groups) "
                         "or every rank for a shard of keys (dist_async_mpi only)")
    ap.add_argument("--hostfile", help="passed to mpirun; scheduler and servers stay here")
    ap.add_argument("--ps-host", help="address of the scheduler (default 127.0.0.1, or this "
                                      "host's address with --hostfile)")
    ap.add_argument("--port", type=int, default=0, help="scheduler port (default: a free one)")
    ap.add_argument("--mpirun-arg", action="append", default=[],
                    help="extra argument for mpirun (repeatable)")
    ap.add_argument("--grace", type=float, default=10.0,
                    help="seconds the servers get to stop after the workers, mpirun gets "
                         "to end the job after a rank failed, and every process gets after "
                         "SIGTERM, before SIGKILL")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")
    args = ap.parse_args(_glue_mpirun_args(argv))
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        ap.error("no command given (put it after --)")
    args.per_host = False
    if args.groups is None and args.hostfile:
        args.groups, args.per_host = hosts_filled(args.hostfile, args.n, ap.error), True
    elif args.groups is None:
        args.groups = 1
    if args.n <= 0 or args.groups <= 0 or args.servers < 0:
        ap.error("-n and --groups must be > 0 and --servers >= 0")
    if args.n % args.groups:
        ap.error("--groups %d does not divide -n %d" % (args.groups, args.n))
    if not 0 <= args.port <= 65535:
        ap.error("--port must be from 1 to 65535 (0: a free one), got %d" % args.port)
    if args.grace < 0:
        ap.error("--grace must be >= 0, got %g" % args.grace)
    return args


def _glue_mpirun_args(argv: list) -> list:
    """`--mpirun-arg --bind-to` as `--mpirun-arg=--bind-to`: argparse takes a
    value that starts with '-' for an option of its own and refuses it. Only
    the launcher's own options are read: the command (after `--`, or from its
    first word) is left as it is."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--" or not a.startswith("-"):   # the command starts here
            return out + argv[i:]
        # argparse also takes an unambiguous prefix (--mpirun, --m)
        if len(a) >= 3 and "--mpirun-arg".startswith(a) and i + 1 < len(argv) \
                and argv[i + 1] != "--":
            out.append("--mpirun-arg=" + argv[i + 1])
            i += 2
            continue
        out.append(a)
        if "=" not in a and _takes_value(a) and i + 1 < len(argv):
            out.append(argv[i + 1])
            i += 1
        i += 1
    return out


_VALUED = ("--np", "--groups", "--servers", "--route", "--hostfile", "--ps-host", "--port",
           "--grace")


def _takes_value(option: str) -> bool:
    """Whether `option` (as typed: -n, a long option or a prefix of one) is
    followed by its value as the next word."""
    if option == "-n":
        return True
    return option.startswith("--") and any(o.startswith(option) for o in _VALUED)


def hosts_filled(hostfile: str, n: int, error) -> int:
    """How many hosts of `hostfile` mpirun fills with `n` ranks (slot by slot,
    in file order); calls `error` unless they all get the same number."""
    try:
        entries = _hostfile_entries(hostfile)
    except OSError as e:
        error("cannot read --hostfile: %s" % e)
    counts, left = [], n
    for words in entries:
        if left <= 0:
            continue
        slots = [w.split("=", 1)[1] for w in words[1:] if w.startswith("slots=")]
        if not slots or not slots[0].isdigit():
            error("--hostfile line %r has no slots=N: give --groups" % " ".join(words))
        counts.append(min(int(slots[0]), left))
        left -= counts[-1]
    if left > 0 and counts:
        error("-n %d is more ranks than the --hostfile's %d slots: raise slots=N there, "
              "or give --groups G (mpirun then oversubscribes the hosts)" % (n, n - left))
    if left > 0 or not counts or len(set(counts)) != 1:
        error("-n %d does not fill the --hostfile hosts evenly (%s ranks per host): give "
              "--groups" % (n, counts or "none"))
    return len(counts)


def this_host(args: argparse.Namespace) -> str:
    """The address the ranks reach this host at (scheduler, rank reports)."""
    return args.ps_host or (socket.gethostbyname(socket.gethostname()) if args.hostfile
                            else "127.0.0.1")


def job_env(args: argparse.Namespace, report_to: str | None = None) -> tuple:
    """(env for mpirun, env for scheduler/servers or None, names to export with -x)."""
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    # Open MPI's transport defaults, unless the user set them; those that depend
    # on a host's hardware are left to each rank's `import mxnet_mpi`
    transport.apply(env, host=False)
    exported = {"MXNET_MPI_HYBRID_ROUTE": args.route}
    if report_to:
        exported[REPORT_ENV] = report_to
    if not args.per_host:   # else the store's default: the ranks of one host
        exported["MXNET_MPI_GROUP_SIZE"] = str(args.n // args.groups)
    ps_env = None
    if args.servers:
        host = this_host(args)
        num_workers = expected_ps_workers(args.route, args.n, args.groups)
        base = {"DMLC_PS_ROOT_URI": host,
                "DMLC_PS_ROOT_PORT": str(args.port or free_port(host)),
                "DMLC_NUM_SERVER": str(args.servers), "DMLC_NUM_WORKER": str(num_workers)}
        exported.update(base)
        exported["DMLC_ROLE"] = "worker"
        if not args.hostfile:
            exported["DMLC_NODE_HOST"] = host
        ps_env = {**env, **base, "DMLC_NODE_HOST": host}
    else:
        for name in list(env):
            if name.startswith("DMLC_"):   # a stale ps-lite set-up must not leak in
                del env[name]
    env.update(exported)
    return env, ps_env, sorted(exported)


def main(argv: list | None = None) -> int:
    """Run the job; return the exit status (non-zero if any process failed)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    exit_limits = stall_limits()[:2]   # a bad value fails here, before anything starts
    watch = RankWatch(args.n, this_host(args))
    env, ps_env, exported = job_env(args, watch.address)
    children: list = []
    stopping = {"signal": 0}

    def on_signal(signum, frame):
        stopping["signal"] = signum

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if ps_env is not None:
            log("ps-lite scheduler at %s:%s, %d server(s), DMLC_NUM_WORKER=%s"
                % (ps_env["DMLC_PS_ROOT_URI"], ps_env["DMLC_PS_ROOT_PORT"], args.servers,
                   ps_env["DMLC_NUM_WORKER"]))
            for i, role in enumerate(["scheduler"] + ["server"] * args.servers):
                name = role if role == "scheduler" else "server %d" % (i - 1)
                children.append(Child(name, role_command(role),
                                      {**ps_env, "DMLC_ROLE": role}, prefix_output=True))
        cmd = [mpirun_path(), "-np", str(args.n), "--oversubscribe", "--output", "tag"]
        for name in exported:
            cmd += ["-x", name]
        if args.hostfile:
            cmd += ["--hostfile", args.hostfile]
            if not any(a.startswith("--map-by") for a in args.mpirun_arg):
                # fill each host's slots in turn (what the groups assume): with
                # --oversubscribe, mpirun would otherwise map by core and may put
                # every rank on the first host
                cmd += ["--map-by", "slot"]
        cmd += args.mpirun_arg + through_runner(args.command)
        mpirun = Child("mpirun", cmd, env, prefix_output=False, watch_stderr=True)
        mpirun.hostfile_hosts = _hostfile_hosts(args.hostfile)
        children.append(mpirun)
        log("pids: %s" % " ".join("%s=%d" % (c.name.replace(" ", ""), c.pid)
                                  for c in children))
        log("%d rank(s) in %d group(s) of %s" % (args.n, args.groups, args.n // args.groups)
            + (" (one per host)" if args.per_host else ""))
        return _supervise(children, mpirun, args.grace, stopping, watch, exit_limits)
    finally:
        teardown(children, args.grace)   # idempotent; also after an error while starting
        watch.close()
        for s, h in old.items():
            signal.signal(s, h)


def _status(rc: int) -> int:
    """A child's non-zero return code as an exit status: killed by signal N
    (rc -N), 128 + N, as a shell reports it."""
    return rc if rc > 0 else 128 - rc


def _verdict(watch: RankWatch, rc: int, mpirun: Child | None = None) -> int:
    """Exit status for mpirun's `rc` and what the ranks reported; names every
    host whose ranks did not finish cleanly (Open MPI's mpirun exits 0 when it
    loses a whole host)."""
    lines = watch.verdict()
    for thread in (mpirun.thread, mpirun.thread2) if mpirun is not None else ():
        if thread is not None:
            thread.join(timeout=2)   # its last lines
    lost = mpirun.lost_hosts if mpirun is not None else []
    if lost and not lines:   # ranks that do not report: what mpirun said
        lines = ["host %s: %s" % (_named(h, mpirun.hostfile_hosts),
                                  _UNSTARTED if h in mpirun.unstarted_hosts
                                  else "lost by mpirun (its daemon stopped answering)")
                 for h in lost]
    for line in lines:
        log(line)
    if lines and rc == 0:
        log("mpirun exited 0, but not every rank finished cleanly: the job failed")
        return 1
    return rc


def _named(host: str, hostfile_hosts: list) -> str:
    """`host` as the hostfile names it (Open MPI cuts names at the first dot)."""
    return next((h for h in hostfile_hosts if h == host or h.startswith(host + ".")), host)


def _hostfile_entries(hostfile: str) -> list:
    """The words of each host line of `hostfile` (comments and blank lines
    left out); OSError if it cannot be read."""
    lines = Path(hostfile).read_text().splitlines()
    return [words for words in (ln.split("#")[0].split() for ln in lines) if words]


def _hostfile_hosts(hostfile: str | None) -> list:
    """The host names of `hostfile` (none without one, or if it is unreadable)."""
    try:
        return [words[0] for words in _hostfile_entries(hostfile)] if hostfile else []
    except OSError:
        return []


def _settle(watch: RankWatch, timeout: float = 3.0) -> None:
    """Give the ranks' last reports (and their connections' ends) time to arrive."""
    deadline = time.monotonic() + timeout
    while watch.reporting and not watch.all_closed() and time.monotonic() < deadline:
        time.sleep(0.05)


def _exit_overdue(watch: RankWatch, limits: tuple, warned: dict) -> list | None:
    """The verdict's lines once every rank's script has finished and some
    process is still running `limits[1]` seconds later (named at `limits[0]`)."""
    pending = watch.exit_pending()
    if pending is None:
        return None
    since, stuck = pending
    warn, abort = limits
    if since >= warn and not warned.get("exit"):
        warned["exit"] = True
        log("every rank finished its script %.0f s ago, but %s still running: %s "
            "(the job is ended when MXNET_MPI_STALL_ABORT_S=%g s have passed)"
            % (since, "these are" if len(stuck) > 1 else "this one is", "; ".join(stuck), abort))
    if since < abort:
        return None
    log("the job has not ended %.0f s after every rank finished its script: stopping "
        "every process" % since)
    return watch.verdict()


def _supervise(children: list, mpirun: Child, grace: float, stopping: dict,
               watch: RankWatch, exit_limits: tuple) -> int:
    servers = [c for c in children if c is not mpirun]
    failing_since = None
    warned: dict = {}
    while True:
        if stopping["signal"]:
            log("got %s: stopping every process" % signal.Signals(stopping["signal"]).name)
            teardown(children, grace)
            return 128 + stopping["signal"]
        rc = mpirun.poll()
        if rc is not None:
            _settle(watch)
            if rc != 0:
                log("mpirun exited with status %d: stopping the scheduler and servers" % rc)
                teardown(children, grace)
                return _verdict(watch, _status(rc), mpirun)
            # Servers stop by themselves once every worker closed its store;
            # after a lost rank they never will.
            deadline = time.monotonic() + (grace if not watch.verdict() else 0)
            while time.monotonic() < deadline and any(c.poll() is None for c in servers):
                time.sleep(0.1)
            left = [c.name for c in servers if c.poll() is None]
            if left:
                log("workers done; stopping %s" % ", ".join(left))
            teardown(children, grace)
            failed = [c for c in servers if c.poll() not in (0, -signal.SIGTERM,
                                                             -signal.SIGKILL)]
            for c in failed:
                log("%s exited with status %s" % (c.name, c.poll()))
            return _verdict(watch, 1 if failed else 0, mpirun)
        for c in servers:
            crc = c.poll()
            if crc is not None and crc != 0:
                log("%s exited with status %d: stopping every process" % (c.name, crc))
                teardown(children, grace)
                return _verdict(watch, _status(crc), mpirun)
        # A rank that ended badly ends the job: mpirun gets `grace` seconds to
        # do it (it can wait ~15 min for a host whose cable was pulled).
        first = watch.first_failure()
        if first is not None and failing_since is None:
            failing_since = time.monotonic()
            log("rank %d on host %s ended without a clean exit (%.1f s into the job); "
                "mpirun gets %g s to end the job" % (first[1], first[2], first[0], grace))
        if failing_since is not None and time.monotonic() - failing_since > grace:
            log("mpirun is still running %g s after a rank failed: stopping every process"
                % grace)
            teardown(children, min(grace, 3.0))
            _settle(watch, 1.0)
            rc = mpirun.poll()
            return _verdict(watch, rc if rc not in (None, 0) and rc > 0 else 1, mpirun)
        stuck = _exit_overdue(watch, exit_limits, warned)
        if stuck is not None:   # named before teardown: killed, they would look ended
            for line in stuck:
                log(line)
            teardown(children, min(grace, 3.0))
            return 1
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())

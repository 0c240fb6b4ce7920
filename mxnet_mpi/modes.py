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

import warnings

from . import _native, settings
from .collectives import Stream, p2p_bytes
from .errors import MPIKVStoreError
from .world import THREAD_MULTIPLE, Communicator, thread_level

MODES = ("chained", "funneled", "concurrent")
# Chosen from benchmarks/overlap.py, overhead.py and cluster.py (README "Modes").
DEFAULT_MODE = "funneled"
FALLBACK_MODE = "chained"
ENV_VAR = "MXNET_MPI_MODE"

_KINDS = {"chained": _native.EXEC_CHAINED, "funneled": _native.EXEC_FUNNELED,
          "concurrent": _native.EXEC_CONCURRENT}


def resolve(name: str | None) -> str:
    """The mode to use: `name` if given, else $MXNET_MPI_MODE, else the default
    (which falls back to chained, with a warning, without MPI_THREAD_MULTIPLE)."""
    if name is None and not settings.is_set(ENV_VAR):
        if DEFAULT_MODE != "chained" and thread_level() < THREAD_MULTIPLE:
            warnings.warn("mxnet_mpi: this MPI provides no MPI_THREAD_MULTIPLE, which the "
                          "default mode '%s' needs; using mode '%s'"
                          % (DEFAULT_MODE, FALLBACK_MODE), stacklevel=3)
            return FALLBACK_MODE
        return DEFAULT_MODE
    if name is None:
        return settings.get(ENV_VAR)   # validated there
    mode = name.strip().lower()
    if mode not in MODES:
        raise MPIKVStoreError("unknown mxnet_mpi mode %r (from %s); choose one of %s"
                              % (mode, "argument", ", ".join(MODES)))
    return mode


def stream_options() -> dict:
    """The native stream settings (settings.store_options)."""
    return settings.store_options()


def create_stream(mode: str, comm: Communicator, name: str) -> Stream:
    """A native stream running `mode` over a private duplicate of `comm`
    (collective over it)."""
    if mode != "chained" and thread_level() < THREAD_MULTIPLE:
        raise MPIKVStoreError(
            "mode '%s' needs MPI_THREAD_MULTIPLE but this MPI provides thread level %d; use "
            "mode 'chained' (MXNET_MPI_MODE)" % (mode, thread_level()))
    return Stream(_KINDS[mode], comm, name, p2p_bytes=p2p_bytes(comm), **stream_options())

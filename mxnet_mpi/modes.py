"""Embedding modes: how a collective becomes a node of the engine's DAG.

chained     every collective also writes one process-wide engine variable, so
            the engine releases collectives one at a time in push order, the
            same order on every rank (all ranks push the same sequence). One
            thread per store runs them with blocking MPI calls.
funneled    one thread per store owns its communicator. Collectives get a
            ticket at push time (push order, the same on every rank); engine
            ops only mark their ticket ready. Each cycle the thread ANDs a
            bitmask of locally ready tickets with its peers (one allreduce of
            512 bytes) and runs exactly the tickets ready everywhere, in ticket
            order, fusing small allreduces of one dtype into one buffer.
concurrent  each key has its own communicator and its own engine variable.
            Engine threads issue non-blocking collectives directly
            (MPI_THREAD_MULTIPLE) and a progress thread completes them; keys
            never match each other whatever order ranks issue them in, and one
            key's collectives keep push order through its engine variable.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings

import mxnet as mx

from . import _native
from .errors import MPIKVStoreError
from .settings import env_number
from .world import THREAD_MULTIPLE, Communicator, thread_level

MODES = ("chained", "funneled", "concurrent")
# Measured best by benchmarks/overlap.py (README); it needs MPI_THREAD_MULTIPLE.
DEFAULT_MODE = "concurrent"
FALLBACK_MODE = "chained"
ENV_VAR = "MXNET_MPI_MODE"
FUSION_ENV = "MXNET_MPI_FUSION_BYTES"      # funneled: fuse allreduces up to this size
CYCLE_ENV = "MXNET_MPI_CYCLE_US"           # funneled: wait after an empty agreement

_KINDS = {"chained": _native.EXEC_CHAINED, "funneled": _native.EXEC_FUNNELED,
          "concurrent": _native.EXEC_CONCURRENT}

_chain = None
_default_executor = None
_chain_lock = threading.Lock()


def resolve(name: str | None) -> str:
    """The mode to use: `name` if given, else $MXNET_MPI_MODE, else the default
    (which falls back to chained, with a warning, without MPI_THREAD_MULTIPLE)."""
    if name is None and ENV_VAR not in os.environ:
        if DEFAULT_MODE == "concurrent" and thread_level() < THREAD_MULTIPLE:
            warnings.warn("mxnet_mpi: this MPI provides no MPI_THREAD_MULTIPLE, which the "
                          "default mode 'concurrent' needs; using mode '%s'" % FALLBACK_MODE,
                          stacklevel=3)
            return FALLBACK_MODE
        return DEFAULT_MODE
    mode = name if name is not None else os.environ[ENV_VAR]
    mode = mode.strip().lower()
    if mode not in MODES:
        raise MPIKVStoreError("unknown mxnet_mpi mode %r (from %s); choose one of %s"
                              % (mode, "argument" if name is not None else ENV_VAR,
                                 ", ".join(MODES)))
    return mode


def create_executor(mode: str, comm: Communicator) -> int:
    """A native executor for `mode` over `comm` (collective for 'funneled')."""
    if mode == "concurrent" and thread_level() < THREAD_MULTIPLE:
        raise MPIKVStoreError(
            "mode 'concurrent' needs MPI_THREAD_MULTIPLE but this MPI provides thread level "
            "%d; use mode 'funneled' or 'chained' (MXNET_MPI_MODE)" % thread_level())
    out = ctypes.c_int()
    _native.check(_native.LIB.mxmpi_executor_create(
        _KINDS[mode], comm.id, env_number(FUSION_ENV, 2 << 20, int),
        env_number(CYCLE_ENV, 200, int), ctypes.byref(out)))
    return out.value


def free_executor(executor: int) -> None:
    _native.LIB.mxmpi_executor_free(executor)


def chain_var():
    """The process-wide engine variable (a 1-element array) that chains collectives.

    One per process, shared by every chained store, so that two stores alive
    at once cannot interleave their collectives differently on different ranks."""
    global _chain
    with _chain_lock:
        if _chain is None:
            _chain = mx.nd.zeros((1,), ctx=mx.cpu())
        return _chain


def default_executor() -> int:
    """The process-wide chained executor used by the free functions
    ``allreduce_``/``broadcast_`` when no executor is given."""
    global _default_executor
    with _chain_lock:
        if _default_executor is None:
            from .world import init
            _default_executor = create_executor("chained", init())
        return _default_executor


def _forget() -> None:
    """Native executors and arrays are gone after finalize()."""
    global _default_executor
    _default_executor = None

"""Embedding modes: how a collective becomes a node of the engine's DAG.

chained   every collective also writes one process-wide engine variable, so
          the engine runs collectives one at a time in push order, the same
          order on every rank (all ranks push the same sequence). The native
          owner thread runs them; engine workers never block on a peer.
"""

from __future__ import annotations

import os
import threading

import mxnet as mx

from .errors import MPIKVStoreError

MODES = ("chained",)
DEFAULT_MODE = "chained"
ENV_VAR = "MXNET_MPI_MODE"

_chain = None
_chain_lock = threading.Lock()


def resolve(name: str | None) -> str:
    """The mode to use: `name` if given, else $MXNET_MPI_MODE, else the default."""
    mode = name if name is not None else os.environ.get(ENV_VAR, DEFAULT_MODE)
    mode = mode.strip().lower()
    if mode not in MODES:
        raise MPIKVStoreError("unknown mxnet_mpi mode %r (from %s); choose one of %s"
                              % (mode, "argument" if name is not None else ENV_VAR,
                                 ", ".join(MODES)))
    return mode


def chain_var():
    """The process-wide engine variable (a 1-element array) that chains collectives.

    One per process, shared by every store, so that two stores alive at once
    cannot interleave their collectives differently on different ranks."""
    global _chain
    with _chain_lock:
        if _chain is None:
            _chain = mx.nd.zeros((1,), ctx=mx.cpu())
        return _chain


def chain_for(mode: str):
    """The chain array a collective in `mode` depends on, or None."""
    return chain_var() if mode == "chained" else None

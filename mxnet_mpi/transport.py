"""Open MPI transport settings that mxnet_mpi applies by default.

Open MPI reads its ``OMPI_MCA_*`` variables when MPI is initialised, so these
are put into the environment at ``import mxnet_mpi`` (before MPI starts; the
start-up hook imports mxnet_mpi with mxnet), by ``python -m mxnet_mpi.launch``
for every process it starts, and by the Makefile's targets. A variable the
user has set, to any value, is left alone. ``MXNET_MPI_TRANSPORT_DEFAULTS=0``
turns all of them off. The measurements behind them: docs/benchmarks.md,
"Transport settings" (benchmarks/cluster.py's link check).

This module imports nothing from mxnet_mpi (it must run before the rest).
"""

from __future__ import annotations

import os
from typing import MutableMapping

# name -> (value, why)
DEFAULTS = {
    # Open MPI's progress loop busy-polls; on a host whose cores are all busy
    # (training) that starves the kernel's network work and every blocking
    # call waits for a scheduler tick (4 ms half round trip on 2 busy cores;
    # 40 us with yielding). Costs nothing measurable on shared memory.
    "OMPI_MCA_mpi_yield_when_idle": ("1", "a waiting rank yields its core"),
    # One TCP connection per peer cannot fill a link; four carry large
    # messages striped (a 2-rank allreduce went from 2.1x to about 1.1x the
    # wire time).
    "OMPI_MCA_btl_tcp_links": ("4", "TCP connections per peer"),
}
OFF_VAR = "MXNET_MPI_TRANSPORT_DEFAULTS"
_OFF = ("0", "false", "no", "off")


def enabled(env: MutableMapping | None = None) -> bool:
    """Whether the defaults apply (not switched off by MXNET_MPI_TRANSPORT_DEFAULTS)."""
    env = os.environ if env is None else env
    return env.get(OFF_VAR, "1").strip().lower() not in _OFF


def apply(env: MutableMapping | None = None) -> dict:
    """Put each default that is not already set into `env` (default: this
    process's environment); returns the ones set here."""
    env = os.environ if env is None else env
    if not enabled(env):
        return {}
    added = {}
    for name, (value, _why) in DEFAULTS.items():
        if name not in env:
            env[name] = value
            added[name] = value
    return added


def describe(env: MutableMapping | None = None) -> str:
    """The transport variables in effect, as ``NAME=value`` words (for notes)."""
    env = os.environ if env is None else env
    return " ".join("%s=%s" % (n, env[n]) for n in DEFAULTS if n in env) or "Open MPI defaults"

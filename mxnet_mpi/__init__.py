"""mxnet_mpi: MPI KVStores embedded in MXNet's dependency engine.

``import mxnet_mpi`` registers the stores ``mpi`` and ``mpi_<mode>`` (and the
hybrid MPI + parameter-server stores ``dist_sync_mpi``/``dist_async_mpi``) with
MXNet, so ``gluon.Trainer(..., kvstore='mpi')`` and
``Module.fit(..., kvstore='mpi')`` work under ``mpirun``. MPI itself is
initialised on first use. ``python -m mxnet_mpi.launch`` imports neither
MXNet nor the native library (its workers do). An installed package is imported with mxnet by its
start-up hook (``_mxnet_mpi_autoload``; ``MXNET_MPI_AUTOLOAD=0`` turns it off).
"""

import sys

from . import settings as _settings


def _launcher_only() -> bool:
    """True while ``python -m mxnet_mpi.launch`` locates its module: the
    launcher starts ps-lite and mpirun and must not load MXNet or MPI itself."""
    if sys.argv[:1] != ["-m"]:   # "-m" only while a -m module is being located
        return False
    argv = list(getattr(sys, "orig_argv", []))
    for i, word in enumerate(argv[1:], 1):
        if word == "-m":
            return argv[i + 1:i + 2] == ["mxnet_mpi.launch"]
        if word.startswith("-m"):
            return word == "-mmxnet_mpi.launch"
    return False


# The start-up hook reads this one itself, before the package can be imported,
# and takes any value but 0/false/no/off as on: a bad value is named here.
_settings.get("MXNET_MPI_AUTOLOAD")

if not _launcher_only():
    from . import transport

    transport.apply()   # Open MPI's transport defaults, before MPI is initialised
    from _mxnet_mpi_autoload import engine_defaults, optimizer_defaults

    if "mxnet" not in sys.modules:
        # imported before mxnet: MXNet's segment defaults, which MXNet reads
        # as it loads (the start-up hook sets them when mxnet is imported)
        engine_defaults()
    else:
        optimizer_defaults()   # an optimizer reads it when it is created

    from . import hybrid, mxnet_patches, ops, optimizer_fixes, stores
    from .collectives import SUPPORTED_DTYPES
    from .consistency import check_consistency
    from .errors import MPIKVStoreError
    from .hybrid import HybridKVStore
    from .joining import join
    from .kvstore import MPIKVStore
    from .modes import DEFAULT_MODE, MODES
    from .ops import allreduce_, broadcast_  # the same functions as mxnet_mpi.ops's
    from .syncbn import SyncBatchNorm
    from .world import finalize, init, local_rank, local_size, rank, size, world

    mxnet_patches.apply()
    optimizer_fixes.apply()

__all__ = [
    "DEFAULT_MODE", "MODES", "HybridKVStore", "MPIKVStore", "MPIKVStoreError",
    "SUPPORTED_DTYPES", "SyncBatchNorm",
    "allreduce_", "broadcast_", "check_consistency", "finalize", "init", "join", "local_rank",
    "local_size", "rank",
    "hybrid", "ops", "size", "stores", "world",
]
__version__ = "0.1.0"

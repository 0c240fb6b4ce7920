"""mxnet_mpi: MPI KVStores embedded in MXNet's dependency engine.

``import mxnet_mpi`` registers the stores ``mpi`` and ``mpi_<mode>`` (and the
hybrid MPI + parameter-server stores ``dist_sync_mpi``/``dist_async_mpi``) with
MXNet, so ``gluon.Trainer(..., kvstore='mpi')`` and
``Module.fit(..., kvstore='mpi')`` work under ``mpirun``. MPI itself is
initialised on first use. An installed package is imported with mxnet by its
start-up hook (``_mxnet_mpi_autoload``; ``MXNET_MPI_AUTOLOAD=0`` turns it off).
"""

from . import transport

transport.apply()   # Open MPI's transport defaults, before MPI is initialised

from . import hybrid, mxnet_patches, ops, stores  # noqa: E402
from .collectives import SUPPORTED_DTYPES  # noqa: E402
from .consistency import check_consistency  # noqa: E402
from .errors import MPIKVStoreError  # noqa: E402
from .hybrid import HybridKVStore  # noqa: E402
from .joining import join  # noqa: E402
from .kvstore import MPIKVStore  # noqa: E402
from .modes import DEFAULT_MODE, MODES  # noqa: E402
from .ops import allreduce_, broadcast_  # the same functions as mxnet_mpi.ops's  # noqa: E402
from .syncbn import SyncBatchNorm  # noqa: E402
from .world import finalize, init, local_rank, local_size, rank, size, world  # noqa: E402

mxnet_patches.apply()

__all__ = [
    "DEFAULT_MODE", "MODES", "HybridKVStore", "MPIKVStore", "MPIKVStoreError",
    "SUPPORTED_DTYPES", "SyncBatchNorm",
    "allreduce_", "broadcast_", "check_consistency", "finalize", "init", "join", "local_rank",
    "local_size", "rank",
    "hybrid", "ops", "size", "stores", "world",
]
__version__ = "0.1.0"

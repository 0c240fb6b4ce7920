"""Exceptions raised by mxnet_mpi."""

from mxnet.base import MXNetError


class MPIKVStoreError(MXNetError, ValueError):
    """Invalid use of an MPI KVStore: bad dtype, storage type, shape or key."""

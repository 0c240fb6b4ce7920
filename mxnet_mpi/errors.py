"""Exceptions raised by mxnet_mpi."""

from mxnet.base import MXNetError, register_error


@register_error
class MPIKVStoreError(MXNetError, ValueError):
    """Invalid use of an MPI KVStore (bad dtype, storage type, shape or key), or
    a collective that failed on every rank because of one rank (the message
    names it). Registered with MXNet, so errors raised inside engine ops reach
    Python as this type too."""

"""Exceptions raised by mxnet_mpi."""

from mxnet.base import MXNetError, register_error


@register_error
class MPIKVStoreError(MXNetError, ValueError):
    """Invalid use of an MPI KVStore (bad dtype, storage type, shape or key), or
    a collective that failed on every rank because of one rank (the message
    names it). Registered with MXNet, so errors raised inside engine ops reach
    Python as this type too."""

    def __init__(self, message="", *args) -> None:
        # MXNet passes an engine op's error on with its "TypeName: " header,
        # which printing the exception would show twice
        if isinstance(message, str) and message.startswith(_HEADER):
            message = message[len(_HEADER):]
        super().__init__(message, *args)


_HEADER = MPIKVStoreError.__name__ + ": "

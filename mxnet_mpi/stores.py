"""Registration of our KVStore names in MXNet's registry."""

from __future__ import annotations

from mxnet.kvstore import KVStoreBase

from . import modes
from .kvstore import MPIKVStore


def _store_class(mode: str) -> type:
    name = "mpi_" + mode
    cls = type(name, (MPIKVStore,), {
        "fixed_mode": mode,
        "__doc__": "MPI KVStore in %s mode (``mx.kv.create('%s')``)." % (mode, name),
        "__module__": __name__,
    })
    return cls


def register_all() -> dict:
    """Register ``mpi`` (default mode) and ``mpi_<mode>`` for every mode."""
    # KVStoreBase.register keys by lower-cased class name; class `mpi` is ours.
    classes = {"mpi": type("mpi", (MPIKVStore,), {"__module__": __name__})}
    classes.update({"mpi_" + m: _store_class(m) for m in modes.MODES})
    for name, cls in classes.items():
        if KVStoreBase.kv_registry.get(name) is not cls:
            KVStoreBase.register(cls)
    return classes


STORES = register_all()

"""Start-up hook of mxnet-mpi: ``import mxnet`` also registers mxnet_mpi's stores.

``mxnet_mpi_autoload.pth`` (installed into site-packages with the package)
puts a finder first on ``sys.meta_path`` that calls :func:`find_spec` here
when, and only when, the module ``mxnet`` is imported; until then this module
is not even imported. The spec it returns loads mxnet as usual, then imports
``mxnet_mpi``, so ``kvstore='mpi'`` works in a script that never names
mxnet_mpi, under plain ``mpirun``. Importing mxnet_mpi does not initialise MPI
(that happens on first use of a store).

Switched off by ``MXNET_MPI_AUTOLOAD=0`` (read when mxnet is imported), and
in ps-lite scheduler and server processes (``DMLC_ROLE``), whose role runs
inside ``import mxnet``. If mxnet_mpi cannot be imported, ``import mxnet``
still succeeds, with a warning that says why.

Just before mxnet loads, in a rank of an MPI job of several ranks, the hook
also sets MXNet's backward segment default (:func:`engine_defaults`), which
MXNet reads only as it loads.
"""

from __future__ import annotations

import os
import sys
import threading

_OFF = ("0", "false", "no", "off")
_finding = threading.local()

#: MXNet's most ops per engine segment of a training backward pass (default 15).
SEGMENT_VAR = "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD"
# Either of these set by the user leaves MXNet's segments alone.
_SEGMENT_SET_BY = (SEGMENT_VAR, "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN")
# The number of ranks, as Open MPI, MPICH/Hydra (and Slurm's PMI) and MVAPICH
# tell each process they start.
_WORLD_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")


def enabled() -> bool:
    """Whether importing mxnet imports mxnet_mpi in this process."""
    if os.environ.get("MXNET_MPI_AUTOLOAD", "1").strip().lower() in _OFF:
        return False
    return os.environ.get("DMLC_ROLE", "") not in ("scheduler", "server")


def find_spec(name: str, path=None, target=None):
    """The spec the other finders give for `name`, loading mxnet_mpi after mxnet."""
    if name != "mxnet" or getattr(_finding, "on", False) or not enabled():
        return None
    _finding.on = True   # the search below calls this finder again: it must pass
    try:
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
    finally:
        _finding.on = False
    if spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return spec
    spec.loader = _ThenMxnetMpi(spec.loader)
    return spec


def _first_int(env, names, default: int) -> int:
    """The first of `names` set in `env` (default: os.environ) to an integer."""
    env = os.environ if env is None else env
    for name in names:
        try:
            return int(env[name])
        except (KeyError, ValueError):
            continue
    return default


def mpi_ranks(env=None) -> int:
    """The size of the MPI job this process was started in (1 if none)."""
    return _first_int(env, _WORLD_SIZE_VARS, 1)


def backward_segment_ops(env=None) -> int:
    """The most ops per backward segment that MXNet takes from `env` as it
    loads: its variables in its order of precedence, else its 15."""
    return _first_int(env, _SEGMENT_SET_BY, 15)


def engine_defaults(env=None) -> dict:
    """In a rank of an MPI job of several ranks, a backward pass in segments of
    one op: MXNet runs up to 15 ops as one engine operation, so a gradient made
    inside a segment is ready for its allreduce only when the whole segment
    ends, and the link idles meanwhile (docs/across-hosts.md). Left alone where
    the user set ``MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD`` or
    ``MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN``. Hybridized blocks read it when
    MXNet loads, so it must be set before. Returns what it set."""
    env = os.environ if env is None else env
    if mpi_ranks(env) < 2 or any(name in env for name in _SEGMENT_SET_BY):
        return {}
    env[SEGMENT_VAR] = "1"
    return {SEGMENT_VAR: "1"}


class _ThenMxnetMpi:
    """mxnet's own loader, followed by ``import mxnet_mpi``."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def __getattr__(self, attr: str):
        return getattr(self._loader, attr)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        # mxnet keeps its own loader: nothing of this hook stays visible on it
        module.__spec__.loader = module.__loader__ = self._loader
        engine_defaults()
        self._loader.exec_module(module)   # a ps-lite role never returns from here
        load_stores()


def load_stores() -> None:
    """Import mxnet_mpi (which registers its stores) unless it is being
    imported already (it imports mxnet itself); warn if it fails."""
    if "mxnet_mpi" in sys.modules:
        return
    try:
        import mxnet_mpi  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (import mxnet must still work)
        msg = ("mxnet_mpi could not be loaded when mxnet was imported, so kvstore 'mpi' and "
               "its relatives are not registered (a script using them would train each "
               "process alone): %s: %s. MXNET_MPI_AUTOLOAD=0 switches this hook off."
               % (type(exc).__name__, exc))
        try:
            import warnings
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
        except Exception:  # noqa: BLE001  (warnings turned into errors)
            sys.stderr.write("Warning: %s\n" % msg)

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
also sets MXNet's engine segment and optimizer group defaults
(:func:`engine_defaults`); MXNet reads the segments only as it loads.
"""

from __future__ import annotations

import os
import sys
import threading

_OFF = ("0", "false", "no", "off")
_finding = threading.local()

#: MXNet's most ops per engine segment of a training backward pass (default 15).
SEGMENT_VAR = "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD"
#: The same for the forward pass of training.
FORWARD_SEGMENT_VAR = "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD"
#: The most parameters MXNet's SGD and LARS update in one op (default 4; LAMB 45).
AGGREGATION_VAR = "MXNET_OPTIMIZER_AGGREGATION_SIZE"
_TRAIN_SEGMENT_VAR = "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN"   # both passes at once
# Each default, with the variables (in MXNet's order of precedence) that,
# set by the user, leave it alone.
_SEGMENT_SET_BY = (SEGMENT_VAR, _TRAIN_SEGMENT_VAR)
_FORWARD_SET_BY = (FORWARD_SEGMENT_VAR, _TRAIN_SEGMENT_VAR)
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


def forward_segment_ops(env=None) -> int:
    """The same for the forward pass of training."""
    return _first_int(env, _FORWARD_SET_BY, 15)


#: The defaults engine_defaults/optimizer_defaults set in this process's own
#: environment (name -> value): a saved optimizer must not carry them as the
#: user's choice (optimizer_fixes.py)
SET_HERE: dict = {}


def engine_defaults(env=None) -> dict:
    """In a rank of an MPI job of several ranks, training passes in engine
    segments of one op, and each parameter updated by an op of its own.

    MXNet runs up to 15 ops as one engine operation, so a gradient made inside
    a backward segment is ready for its allreduce only when the whole segment
    ends, and a forward segment starts only when every weight its ops read has
    arrived and been updated; SGD updates 4 parameters per op, which waits for
    the last of their 4 gradients. Meanwhile the link or the core idles
    (docs/across-hosts.md). Each default is left alone where the user set it
    (``MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN`` covers both passes). Hybridized
    blocks read the segments when MXNet loads, so they must be set before.
    Returns what it set."""
    env = os.environ if env is None else env
    if mpi_ranks(env) < 2:
        return {}
    done = {}
    for var, set_by in ((SEGMENT_VAR, _SEGMENT_SET_BY), (FORWARD_SEGMENT_VAR, _FORWARD_SET_BY)):
        if not any(name in env for name in set_by):
            env[var] = done[var] = "1"
    done.update(optimizer_defaults(env))
    if env is os.environ:
        SET_HERE.update(done)
    return done


def optimizer_defaults(env=None) -> dict:
    """The optimizer part of :func:`engine_defaults`, which still takes effect
    after MXNet loaded (an optimizer reads it when it is created)."""
    env = os.environ if env is None else env
    if mpi_ranks(env) < 2 or AGGREGATION_VAR in env:
        return {}
    env[AGGREGATION_VAR] = "1"
    if env is os.environ:
        SET_HERE[AGGREGATION_VAR] = "1"
    return {AGGREGATION_VAR: "1"}


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
        before = {var: os.environ.get(var) for var in _ENGINE_VARS}
        engine_defaults()
        self._loader.exec_module(module)   # a ps-lite role never returns from here
        load_stores(before)


# What engine_defaults may set (and `import mxnet_mpi` too, before it fails)
_ENGINE_VARS = (SEGMENT_VAR, FORWARD_SEGMENT_VAR, AGGREGATION_VAR)


def load_stores(before: dict | None = None) -> None:
    """Import mxnet_mpi (which registers its stores) unless it is being
    imported already (it imports mxnet itself); warn if it fails. Where it
    fails, the engine variables go back to `before` (name -> value or None):
    without mxnet_mpi's mended LAMB, one-at-a-time updates
    (MXNET_OPTIMIZER_AGGREGATION_SIZE=1) leave float16 LAMB weights with
    multi_precision untrained (optimizer_fixes.py)."""
    if "mxnet_mpi" in sys.modules:
        return
    try:
        import mxnet_mpi  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (import mxnet must still work)
        for var, value in (before or {}).items():
            SET_HERE.pop(var, None)
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        reason = "%s: %s" % (type(exc).__name__, exc)
        msg = ("mxnet_mpi could not be loaded when mxnet was imported, so kvstore 'mpi' and "
               "its relatives raise this error when used: %s. MXNET_MPI_AUTOLOAD=0 switches "
               "this hook off. MXNet's optimizers keep their own defaults." % reason)
        try:
            import warnings
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
        except Exception:  # noqa: BLE001  (warnings turned into errors)
            sys.stderr.write("Warning: %s\n" % msg)
        try:
            refuse_stores(reason)
        except Exception:  # noqa: BLE001  (an mxnet without these hooks)
            pass


#: The store names mxnet_mpi registers (tests/test_runner.py checks the list).
STORE_NAMES = ("mpi", "mpi_funneled", "mpi_chained", "mpi_concurrent", "dist_sync_mpi",
               "dist_async_mpi")


def refuse_stores(reason: str) -> None:
    """After mxnet_mpi failed to load: our store names raise, naming `reason`.
    MXNet would otherwise create a local store for an unknown name, and a
    Trainer or Module given one by name on one device creates none at all:
    every process of the job would train alone and exit 0."""
    import mxnet as mx
    from mxnet.base import MXNetError
    from mxnet.kvstore import KVStoreBase

    def refuse(name: str):
        raise MXNetError("kvstore '%s' is not available: mxnet_mpi could not be loaded when "
                         "mxnet was imported (%s)" % (name, reason))

    for name in STORE_NAMES:
        KVStoreBase.kv_registry[name] = type(
            name, (KVStoreBase,), {"__init__": lambda self, _name=name: refuse(_name)})
    for module in (mx.model, mx.gluon.trainer, mx.module.module):
        original = module._create_kvstore

        def create(kvstore, *args, _original=original):
            if isinstance(kvstore, str) and kvstore.lower() in STORE_NAMES:
                refuse(kvstore)
            return _original(kvstore, *args)

        module._create_kvstore = create

"""Weight consistency check: are the parameters still bit-identical on every rank?

With our stores every rank applies the optimizer to its own copy of the
weights, after the same summed gradients; nothing compares the copies again.
They can still drift apart: MXNet itself is not bit-deterministic everywhere
(oneDNN kernels with NAG after an inference pass drift by ~1e-6 per pass with
no kvstore at all), a rank can load another checkpoint, or user code can touch
one rank's weights. Drift is silent and grows. This check hashes every
parameter's bytes and compares the hashes across ranks with one small
collective; on a difference it warns naming the first differing parameter and
the ranks that differ, re-broadcasts rank 0's weights, or raises.

Opt in with ``MXNET_MPI_CONSISTENCY_EVERY=N`` (every N ``Trainer.step`` /
``Trainer.update`` / ``Module.update`` calls; 0, the default, turns it off and
costs nothing) and ``MXNET_MPI_CONSISTENCY_ACTION=warn|broadcast|raise``, or
call :func:`check_consistency` yourself.
"""

from __future__ import annotations

import ctypes
import hashlib
import warnings
from typing import Callable

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, check_call

from . import settings, weight_writes
from .collectives import RankTable
from .errors import MPIKVStoreError
from .joining import broadcast_from, broadcast_state_values, module_arrays
from .module_states import ModuleStates, counts_by_index

EVERY_ENV = "MXNET_MPI_CONSISTENCY_EVERY"
ACTION_ENV = "MXNET_MPI_CONSISTENCY_ACTION"
ACTIONS = ("warn", "broadcast", "raise")


def every() -> int:
    """The check period from the environment (0: off)."""
    return settings.get(EVERY_ENV)


def default_action() -> str:
    return settings.get(ACTION_ENV)


def _bytes(arr: mx.nd.NDArray):
    """The bytes of `arr`: read in place for a dense host array (after its
    pending writes), else a host copy. In place, 100 MB hash in 124 ms here;
    through asnumpy and tobytes, 434 ms (two copies first)."""
    if arr.stype != "default" or arr.context.device_type != "cpu" or arr.size == 0:
        return memoryview(np.ascontiguousarray(arr.asnumpy())).cast("B")
    arr.wait_to_read()
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(arr.handle, ctypes.byref(ptr)))
    return memoryview((ctypes.c_char * (arr.size * np.dtype(arr.dtype).itemsize))
                      .from_address(ptr.value)).cast("B")


def _digest(arr: mx.nd.NDArray) -> int:
    """A 62-bit hash of the array's bytes (so that -h never overflows int64);
    SHA-1 for speed, not secrecy: it tells copies apart."""
    h = hashlib.sha1(_bytes(arr))
    h.update(str((tuple(arr.shape), np.dtype(arr.dtype).str)).encode())
    return int.from_bytes(h.digest()[:8], "little") >> 2


def per_rank(param) -> bool:
    """Whether Gluon `param` holds each rank's own values: a statistic the
    forward pass updates from the rank's data (BatchNorm's running mean and
    variance: not differentiable), as with MXNet's dist stores and Horovod."""
    return not getattr(param, "_differentiable", True)


def _named_arrays(target) -> list:
    """[(name, first device's array)] of a Trainer's, a ParameterDict's or a
    dict's parameters, in a rank-independent order: the Trainer's (its keys')
    or the ParameterDict's (creation) order, since Gluon's name counters can
    name the same parameter differently on two ranks; a dict's sorted names."""
    if isinstance(target, mx.gluon.Trainer):
        target = target._params
    if isinstance(target, mx.gluon.ParameterDict):
        items = list(target.items())
    elif hasattr(target, "items"):
        items = sorted(target.items(), key=lambda kv: kv[0])
    else:
        items = [(p.name, p) for p in target]
    out = []
    for name, p in items:
        if isinstance(p, mx.nd.NDArray):
            out.append((name, p))
        elif isinstance(p, (list, tuple)) and p:
            out.append((name, p[0]))
        elif hasattr(p, "list_data"):
            # deferred, never initialised: nothing to compare
            if p._data is not None and not per_rank(p):
                out.append((name, p.list_data()[0]))
        else:
            raise MPIKVStoreError("check_consistency takes a Trainer, Gluon parameters, a Module "
                                  "or a dict of NDArrays; got %s for %r"
                                  % (type(p).__name__, name))
    return out


def _module_arrays(module) -> dict:
    """A Module's (a BucketingModule's current one's) weights: name -> the
    arrays of every device."""
    module = getattr(module, "_curr_module", module)
    if getattr(module, "_exec_group", None) is None:
        raise MPIKVStoreError("check_consistency of a Module needs it bound with its optimizer "
                              "initialised (after init_optimizer or fit)")
    return module_arrays(module)


def _updater_of(target):
    """What holds the optimizer states that go with `target`'s weights on
    this rank: a Trainer that updates locally, a Module's updater (as
    join() copies them), or None (plain parameters, or updates on servers)."""
    if isinstance(target, mx.gluon.Trainer):
        return None if target._update_on_kvstore else target
    module = getattr(target, "_curr_module", target)
    if isinstance(module, mx.module.BaseModule) and getattr(module, "_updater", None) is not None:
        return ModuleStates(module)
    return None


def _store_of(target, store):
    if store is not None:
        return store
    kv = getattr(target, "_kvstore", None)
    if kv is None or not hasattr(kv, "internal_collective"):
        raise MPIKVStoreError("check_consistency needs an mxnet_mpi store: pass store=, or a "
                              "Trainer whose kvstore is one (after its first step)")
    return kv


def hashes_per_rank(kv, hashes: np.ndarray) -> RankTable:
    """Every worker's hashes (the whole world for a hybrid store: with local
    updates, every rank holds the weights); ranks that joined left out."""
    return kv.rank_table(hashes, "consistency check: parameter hashes")


def check_consistency(target, store=None, action: str | None = None) -> list[str]:
    """Compare every parameter of `target` (a Trainer, Gluon parameters, a
    Module, or a dict name -> NDArray) across the ranks of `store` (default: the Trainer's
    store; for hybrid stores, every rank of the world), except each rank's own
    statistics (BatchNorm's running mean and variance, per_rank). Collective:
    every rank must call it. Returns the names of the parameters that differ (the same
    list on every rank). `action` (default $MXNET_MPI_CONSISTENCY_ACTION or
    'warn'): 'warn' names the first differing parameter and its ranks;
    'broadcast' also copies rank 0's values of every parameter to every rank,
    and for a Trainer or Module its optimizer states too (momentum, the
    float32 master copies of multi-precision weights: without them the next
    update would take the ranks apart again); 'raise' raises MPIKVStoreError."""
    action = default_action() if action is None else action
    if action not in ACTIONS:
        raise MPIKVStoreError("action must be one of %s, got %r" % (", ".join(ACTIONS), action))
    kv = _store_of(getattr(target, "_curr_module", target), store)
    updater = _updater_of(target)
    modules = []
    if isinstance(target, mx.module.BaseModule):
        modules = [target, getattr(target, "_curr_module", target)]
        target = _module_arrays(target)
    named = _named_arrays(target)
    if not named:
        return []
    table = hashes_per_rank(kv, np.array([_digest(a) for _, a in named], dtype=np.int64))
    bad = table.differing()
    if not bad:
        return []
    differ = [named[i][0] for i in bad]
    ranks = table.ranks_differing(bad[0])
    first = repr(differ[0])
    keys = getattr(target, "_param2idx", {})   # a Trainer's: its store's keys
    if differ[0] in keys:
        first += " (key %d)" % keys[differ[0]]
    text = ("mxnet_mpi: weights differ across ranks in %d parameter(s); first %s, where rank(s) "
            "%s differ from rank %d" % (len(differ), first, ", ".join(map(str, ranks)),
                                        table.ranks[0]))
    if action == "raise":
        raise MPIKVStoreError(text)
    if action == "broadcast":
        params = target._params if isinstance(target, mx.gluon.Trainer) else target
        broadcast_from(kv, 0, params, why="consistency check", workers=True)
        if updater is not None:
            broadcast_state_values(kv, 0, updater, "consistency check", workers=True)
        for module in modules:
            module._params_dirty = True   # get_params reads the arrays again
        mx.nd.waitall()
        text += "; copied rank 0's weights%s to every rank" % (
            " and optimizer states" if updater is not None else "")
    global _warned
    _warned += 1
    # numbered: Python's default filter shows a warning text once per place,
    # which hid every later check that still found the ranks apart
    warnings.warn("%s (difference %d found by this process)" % (text, _warned), RuntimeWarning,
                  stacklevel=2)
    return differ


_warned = 0


#: The calls whose writes are noted (weight_writes.py).
WRITES = ("set_data, load_parameters, initialize(force_reinit=True), Trainer.load_states, "
          "Module.set_params, Module.load_optimizer_states")


def _state_digest(updater, index: int, count) -> int:
    """A 62-bit hash of parameter `index`'s optimizer state and update count."""
    h = hashlib.blake2b(digest_size=8)
    h.update(repr(count).encode())
    pending = [updater.states.get(index) if updater is not None else None]
    while pending:
        item = pending.pop()
        if isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(item, mx.nd.NDArray):
            h.update(str((tuple(item.shape), np.dtype(item.dtype).str)).encode())
            h.update(_bytes(item))
        else:
            h.update(repr(item).encode())
    return int.from_bytes(h.digest(), "little") >> 2


def check_trainer_after_writes(trainer, watch, table: Callable[[np.ndarray], np.ndarray],
                               what: str, writers: int, outcome: str, fix: str) -> None:
    """check_after_writes for a Gluon Trainer whose weight_writes.Watch
    `watch` said what this rank wrote; each rank's own statistics left out."""
    kept = [i for i, p in enumerate(trainer._params) if not per_rank(p)]
    weights = [(trainer._params[i].name, trainer._params[i].list_data()[0]
                if trainer._params[i]._data is not None else None, i) for i in kept]
    here = {k for k, i in enumerate(kept) if i in watch.params} if watch is not None else set()

    def still_apart(positions: list, states: bool) -> None:
        for k in positions:
            weight_writes.note(trainer._params[kept[k]])
        if states:
            weight_writes.note(trainer)
    check_after_writes(weights, trainer._optimizer, trainer._updaters[0], table, what, writers,
                       outcome, fix, here, watch is not None and watch.states, still_apart)


def check_after_writes(weights: list, optimizer, updater,
                       table: Callable[[np.ndarray], np.ndarray], what: str, writers: int,
                       outcome: str, fix: str, params_here, states_here: bool,
                       still_apart: Callable[[list, bool], None],
                       states_fix: str | None = None) -> None:
    """After `writers` rank(s) wrote weights or optimizer states outside
    training (weight_writes.py), compare the `weights` ([(name, array or
    None, optimizer index)], in an order the same on every rank) that any rank
    wrote (this rank: the positions `params_here`), and where any rank wrote
    optimizer states (`states_here`), the `updater`'s states and the
    `optimizer`'s update counts, across the ranks (collective: `table(row)`
    returns every rank's int64 row: a collectives.RankTable) and raise MPIKVStoreError on
    every rank if any differ. Only what was written is hashed: a program that
    sets a weight every step pays for that weight alone. `what` names the
    call, `outcome` what became of it, `fix` how else to make them alike
    (`states_fix`, from ': ', where optimizer states differ).
    Before raising, `still_apart(weight positions, states)` notes what differs
    as written again, so that every later step compares it again (and fails
    again) until the ranks hold the same values: a program that caught the
    error and stepped on trained apart, silently."""
    mask = np.zeros(len(weights) + 1, dtype=np.int64)
    mask[sorted(params_here)] = 1
    mask[-1] = 1 if states_here else 0
    anywhere = table(mask).any()
    labels, hashes, positions = [], [], []   # positions: in `weights`, or None (states)
    for k, (name, arr, _) in enumerate(weights):
        if anywhere[k]:
            labels.append("the weights of %r" % name)
            hashes.append(_digest(arr) if arr is not None else 0)
            positions.append(k)
    if anywhere[-1]:
        # MXNet counts per device id, and `_index_update_count` is the table of
        # the device updated last, which depends on the rank's devices
        counts = counts_by_index(optimizer)
        for name, _, index in weights:
            labels.append("the optimizer state of %r" % name)
            hashes.append(_state_digest(updater, index, counts.get(index)))
        labels.append("the optimizer's update count")
        hashes.append(int(optimizer.num_update))
        positions.extend([None] * (len(labels) - len(positions)))
    if not hashes:
        return
    rows = table(np.array(hashes, dtype=np.int64))
    bad = rows.differing()
    if not bad:
        return
    still_apart([positions[j] for j in bad if positions[j] is not None],
                any(positions[j] is None for j in bad))
    if any(labels[j].startswith("the optimizer") for j in bad):
        # a broadcast of the weights (the usual `fix`) leaves the states apart
        remedy = states_fix or (": load the same files on every rank (Trainer.load_states, "
                                "Module.load_optimizer_states; check_consistency compares "
                                "weights, not optimizer states)")
    else:
        remedy = " (load the same files on every rank), or %s" % fix
    raise MPIKVStoreError(
        "mxnet_mpi: %s: %d rank(s) wrote weights or optimizer states outside training (%s) "
        "or had them found apart at an earlier step and not made alike since, and now the "
        "ranks differ in %d of them: first %s, where rank(s) %s differ from rank "
        "%d. Each rank updates its own copy, so they would drift apart; %s. Write them alike "
        "on every rank%s"
        % (what, writers, WRITES, len(bad), labels[bad[0]],
           ", ".join(map(str, rows.ranks_differing(bad[0]))), rows.ranks[0], outcome, remedy))


class PeriodicCheck:
    """Counts a trainer's (or module's) updates and runs the check every
    $MXNET_MPI_CONSISTENCY_EVERY of them."""

    def __init__(self) -> None:
        self.period = every()
        self.count = 0
        if self.period > 0:
            default_action()   # a misspelt action fails at the first step, not the Nth

    def tick(self, target, store) -> None:
        if self.period <= 0:
            return
        self.count += 1
        if self.count % self.period == 0:
            check_consistency(target, store)

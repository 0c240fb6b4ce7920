"""Make MXNet 1.9's Gluon Trainer and Module use our stores given as strings.

MXNet's ``model._create_kvstore`` returns *no* kvstore for a string without
'dist' when the process has one device: ``Trainer(kvstore='mpi')`` would then
silently train each rank alone. The patches below apply only when the
kvstore is one of ours; MXNet's own stores take MXNet's unchanged code paths.

They also apply the batch-size rule (batch_sizes.py) where each rank would
otherwise divide by its own batch size (local updates), and tell the store
which parameter each key serves and which call and step each collective
belongs to, for its messages.
"""

from __future__ import annotations

import atexit
import functools
import os
import warnings

import mxnet as mx
import numpy as np
from mxnet.kvstore import KVStoreBase

from . import _native, joining, module_states, rank_children, report, weight_writes
from .batch_sizes import step_flags
from .consistency import PeriodicCheck, check_after_writes, check_trainer_after_writes
from .errors import MPIKVStoreError
from .kvstore import SPARSE_HINT, MPIKVStore
from .module_states import ModuleStates, spread_counts
from .optimizer_fixes import new_step
from .optimizer_settings import describe, describe_params
from .param_order import agreed_order
from .stale_grads import COUNTS_DESC, FreshCounts, stale_gradient, zero_stale
from .world import wait_queued_ops

_applied = False
_drain_registered = False
_original_create = None   # MXNet's kv.create, before apply() wraps it


def _claims(name: str) -> bool:
    """Names in our namespace (``mpi*``, ``*_mpi``): ours and typos, not a
    store someone else registered with MXNet under such a name."""
    name = name.lower()
    if not (name.startswith("mpi") or name.endswith("_mpi")):
        return False
    cls = KVStoreBase.kv_registry.get(name)
    return cls is None or issubclass(cls, MPIKVStore)


def is_ours(kvstore) -> bool:
    """True if `kvstore` is one of our stores, or a name in our namespace."""
    if isinstance(kvstore, MPIKVStore):
        return True
    return isinstance(kvstore, str) and _claims(kvstore)


def _patched_create(orig):
    @functools.wraps(orig)
    def create(name="local"):
        if isinstance(name, str) and _claims(name):
            cls = KVStoreBase.kv_registry.get(name.lower())
            if cls is None or not issubclass(cls, MPIKVStore):
                # MXNet would silently fall back to a local store here.
                ours = sorted(k for k, c in KVStoreBase.kv_registry.items()
                              if issubclass(c, MPIKVStore))
                raise MPIKVStoreError("unknown kvstore %r; mxnet_mpi provides %s"
                                      % (name, ", ".join(ours)))
        elif isinstance(name, str) and name.lower().startswith("dist"):
            _check_ps_workers(name)   # MXNet's own distributed store
            _finish_queued_work_at_exit()
        return orig(name)
    return create


def create_inner_dist(name: str):
    """MXNet's own dist store `name` for a hybrid store's ps-lite worker (one
    per group: DMLC_NUM_WORKER counts groups, so _check_ps_workers does not
    apply)."""
    _finish_queued_work_at_exit()
    return _original_create(name)


def _check_ps_workers(name: str) -> None:
    """MXNet's own dist stores make each process a ps-lite worker. In an MPI
    job of more ranks than DMLC_NUM_WORKER (as mxnet_mpi.launch sets it for the
    hybrid stores: one worker per group), one rank trained alone and the others
    hung in ps-lite until the stall abort, named only as a missing rank."""
    ranks, declared = report.size_from_env(), os.environ.get("DMLC_NUM_WORKER", "")
    if os.environ.get("DMLC_ROLE", "worker") != "worker" or ranks is None \
            or not declared.isdigit() or int(declared) >= ranks:
        return
    raise MPIKVStoreError(
        "kvstore %r (MXNet's own) makes every rank a ps-lite worker, but this job has %d "
        "ranks and DMLC_NUM_WORKER=%s (mxnet_mpi.launch sets one worker per MPI group, for "
        "the hybrid stores): launch with --groups %d (one group per rank), or use a hybrid "
        "store ('dist_sync_mpi', 'dist_async_mpi')" % (name, ranks, declared, ranks))


def resolve(kvstore):
    """Our store instance for `kvstore` (creating it from a name), else None."""
    if isinstance(kvstore, MPIKVStore):
        return kvstore
    if is_ours(kvstore):
        return mx.kv.create(kvstore)
    return None


# MXNet's stores of one process: 'local', 'device', 'nccl' and their variants
# ('local_allreduce_cpu', 'local_update_cpu', 'local_allreduce_device')
_LOCAL_STORES = ("local", "device", "nccl")
_alone = {"warned": False}


def _drain_failed_step() -> None:
    """A step failed on a collective error: the step's other failed
    collectives left their errors on gradient arrays nobody waits for, and
    the next step's collectives of those arrays were skipped (that step
    failed too, on every rank, and updated only some parameters). Wait for
    them here; the first error is what the caller raises."""
    wait_queued_ops(report=False)


def _warn_training_alone(kvstore, what: str) -> None:
    """Once per process: a rank of a job of several (mpirun) whose Trainer or
    Module reduces with one of MXNet's stores of one process ('device',
    'local'): each rank trains a model of its own, which MXNet does silently.
    kvstore=None (Horovod's style, mxnet_mpi.horovod) is left alone."""
    name = kvstore if isinstance(kvstore, str) else getattr(kvstore, "type", None)
    size = report.size_from_env()
    if _alone["warned"] or size is None or size < 2 or not isinstance(name, str) \
            or not name.lower().startswith(_LOCAL_STORES) or rank_children.started_by() is not None:
        return
    _alone["warned"] = True
    warnings.warn(
        "mxnet_mpi: this process is one of %d ranks started by mpirun, and its %s uses "
        "kvstore=%r, which reduces over this process's devices only: each rank trains a "
        "model of its own. Use kvstore='mpi' to train one model over all the ranks (or "
        "kvstore=None with mxnet_mpi.horovod's DistributedTrainer)" % (size, what, name),
        RuntimeWarning, stacklevel=3)


def _patched_create_kvstore(orig):
    @functools.wraps(orig)
    def create(kvstore, num_device, arg_params):
        kv = resolve(kvstore)
        if kv is None:
            return orig(kvstore, num_device, arg_params)
        update_on_kvstore = bool(int(os.getenv("MXNET_UPDATE_ON_KVSTORE", "1")))
        return kv, update_on_kvstore and kv.is_capable(KVStoreBase.OPTIMIZER)
    return create


def _store_of(trainer) -> MPIKVStore | None:
    """The trainer's store if it is ours (also before MXNet's lazy _init_kvstore)."""
    kv = trainer._kvstore if trainer._kv_initialized else trainer._kvstore_params.get("kvstore")
    return kv if isinstance(kv, MPIKVStore) else None


#: What the ranks agree on when they compare weights after writes.
WRITES_DESC = "hashes of the weights and optimizer states after writes"
NOT_APPLIED = "this step was not applied"
TRAINER_FIX = ("write them before creating the Trainer (it copies rank 0's weights to every "
               "rank then), or copy rank 0's weights to every rank with "
               "mxnet_mpi.check_consistency(trainer, action='broadcast') called on every rank")


def fresh_counts(trainer, kv) -> None:
    """With ignore_stale_grad=True: push the counts of ranks where each of
    `trainer`'s gradients is fresh (stale_grads.FreshCounts), over every
    worker of store `kv`; _update applies them."""
    if getattr(trainer, "_mxmpi_fresh", None) is None:
        trainer._mxmpi_fresh = FreshCounts()
    trainer._mxmpi_fresh.push(trainer._params, lambda arr: kv.internal_collective(
        _native.ALLREDUCE, arr, COUNTS_DESC, workers=True))


def written(trainer) -> bool:
    """Whether `trainer`'s weights or optimizer states were written outside
    training since its last step (weight_writes)."""
    watch = getattr(trainer, "_mxmpi_writes", None)
    return watch is not None and watch.written(trainer, trainer._params)


def _patch_parameter() -> None:
    """Note writes of a Trainer's parameters (weight_writes): set_data (also
    load_parameters') and initialize(force_reinit=True); a cast lets the
    store's key take the new dtype."""
    Parameter = mx.gluon.Parameter
    orig_set_data = Parameter.set_data
    orig_initialize = Parameter.initialize

    @functools.wraps(orig_set_data)
    def set_data(self, data):
        orig_set_data(self, data)
        if self._trainer is not None:
            weight_writes.note(self)

    @functools.wraps(orig_initialize)
    def initialize(self, *args, **kwargs):
        orig_initialize(self, *args, **kwargs)
        force = kwargs.get("force_reinit", args[3] if len(args) > 3 else False)
        if force and self._trainer is not None:
            weight_writes.note(self)

    orig_cast = Parameter.cast

    @functools.wraps(orig_cast)
    def cast(self, dtype):
        orig_cast(self, dtype)
        kv = _store_of(self._trainer) if self._trainer is not None else None
        if kv is not None and self.name in self._trainer._param2idx:
            kv.recast(self._trainer._param2idx[self.name])

    Parameter.set_data = set_data
    Parameter.initialize = initialize
    Parameter.cast = cast


def _patch_trainer() -> None:
    trainer_mod = mx.gluon.trainer
    Trainer = trainer_mod.Trainer
    orig_init = Trainer.__init__
    orig_allreduce = Trainer._allreduce_grads
    orig_update = Trainer._update
    orig_step = Trainer.step
    orig_public_allreduce = Trainer.allreduce_grads
    orig_public_update = Trainer.update

    @functools.wraps(orig_init)
    def __init__(self, params, optimizer, optimizer_params=None, kvstore="device",
                 compression_params=None, update_on_kvstore=None):
        kv = resolve(kvstore)
        if kv is not None and isinstance(params, (dict, mx.gluon.ParameterDict, list, tuple)):
            # keys are positions: pair the same layers on every rank, whatever
            # Gluon's name counters did or a list's order (param_order)
            listed = isinstance(params, (list, tuple))
            named = ([(getattr(p, "name", ""), p) for p in params] if listed
                     else list(params.items()))
            params, _ = agreed_order(named, lambda row, desc: kv.rank_table(
                row, "Trainer init: " + desc), by_name=not listed)
        orig_init(self, params, optimizer, optimizer_params,
                  kvstore=kv if kv is not None else kvstore,
                  compression_params=compression_params, update_on_kvstore=update_on_kvstore)
        self._mxmpi_writes = weight_writes.Watch()
        if kv is None:
            _warn_training_alone(kvstore, "Trainer")
            return
        sparse_ok = getattr(kv, "supports_sparse", False)
        if sparse_ok:
            # MXNet's sparse-gradient branch of _init_kvstore rejects any class but its
            # own KVStore; a store with supports_sparse routes row_sparse gradients itself.
            self._contains_sparse_grad = False
        elif not any(p._grad_stype != "default" for p in self._params if p.grad_req != "null"):
            # only frozen parameters (grad_req 'null') have sparse gradients, and
            # they have none to reduce: MXNet's sparse branch would refuse the store
            self._contains_sparse_grad = False
        for p in self._params:
            sparse_grad = p._grad_stype != "default" and p.grad_req != "null"
            if not sparse_ok and (p._stype != "default" or sparse_grad):
                raise MPIKVStoreError(
                    "Parameter %s has %s weight / %s gradient storage; kvstore '%s' "
                    "supports dense parameters only%s"
                    % (p.name, p._stype, p._grad_stype, kv.type, SPARSE_HINT))
        # Create the store now (MXNet would do it at the first step) so that
        # initial weights are broadcast before the first forward pass.
        self._kvstore_params["kvstore"] = kv
        # join() on the store brings this Trainer up to date; its place among
        # the store's users tells its keys' collectives and names apart
        with kv.owned_by(joining.attach(kv, self)):
            kv.sync_initial_params(self._params)
        self._params_to_init = []

    # The batch-size rule needs the agreed mean before _update() pushes the
    # optimizer ops (rescale_grad is their attribute): step()/update() note the
    # batch size, _allreduce_grads() (or update()) pushes its sum, _update()
    # waits for it. With update_on_kvstore the servers hold the weights and
    # MXNet's own rule applies (the optimizer's rescale_grad from world rank 0).
    def _reduction(self, call: str) -> None:
        self._mxmpi_count = getattr(self, "_mxmpi_count", 0) + 1
        self._mxmpi_call = call

    @functools.wraps(orig_step)
    def step(self, batch_size, ignore_stale_grad=False):
        if _store_of(self) is None:
            return orig_step(self, batch_size, ignore_stale_grad)
        if batch_size == 0:   # MXNet divides by it: ZeroDivisionError, naming nothing
            raise MPIKVStoreError(
                "mxnet_mpi: Trainer.step(0): a rank with no data this step calls "
                "mxnet_mpi.join(trainer) (or kv.join()) once its data has run out, and takes "
                "part in the other ranks' steps from there (docs/faults.md, 'Uneven data')")
        _reduction(self, "Trainer.step")
        self._mxmpi_batch = batch_size
        self._mxmpi_ignore_stale = ignore_stale_grad
        try:
            return orig_step(self, batch_size, ignore_stale_grad)
        except MPIKVStoreError:
            _drain_failed_step()
            raise
        finally:
            self._mxmpi_batch = self._mxmpi_agreed = None

    @functools.wraps(orig_public_allreduce)
    def allreduce_grads(self):
        kv = _store_of(self)
        if kv is None:
            return orig_public_allreduce(self)
        _reduction(self, "Trainer.allreduce_grads")
        self._mxmpi_batch = None
        self._mxmpi_reduced = True
        self._mxmpi_failed_reduce = None
        try:
            return orig_public_allreduce(self)
        except MPIKVStoreError as exc:
            # This rank failed at once; its peers learn of it only in update(),
            # which sums the batch sizes: take that collective's place now (a
            # program that catches the error here never calls update()), and
            # refuse an update() that follows on this rank
            if not self._update_on_kvstore:
                kv.batch_token(str(exc), "Trainer.update %d: sum of batch sizes"
                               % getattr(self, "_mxmpi_count", 0))
                self._mxmpi_failed_reduce = str(exc)
            _drain_failed_step()
            raise

    @functools.wraps(orig_public_update)
    def update(self, batch_size, ignore_stale_grad=False):
        kv = _store_of(self)
        if kv is None:
            return orig_public_update(self, batch_size, ignore_stale_grad)
        if not self._kv_initialized:
            self._init_kvstore()   # as update() does first; rescale_grad is set after
        self._mxmpi_call = "Trainer.update"   # in _update's messages, with allreduce_grads' count
        if not self._update_on_kvstore and not getattr(self, "_mxmpi_reduced", False):
            # each rank would apply its own gradients to its own weights: they
            # drift apart with no error (as with MXNet's dist stores)
            raise MPIKVStoreError(
                "mxnet_mpi: Trainer.update without Trainer.allreduce_grads() since the last "
                "update: each rank would update its weights with its own gradients and the "
                "ranks would drift apart. Call trainer.allreduce_grads() before "
                "trainer.update(batch_size), or trainer.step(batch_size), which does both")
        self._mxmpi_reduced = False
        failed = getattr(self, "_mxmpi_failed_reduce", None)
        if failed is not None:   # its batch sizes' place is taken already
            self._mxmpi_failed_reduce = None
            if ignore_stale_grad and not self._update_on_kvstore:
                fresh_counts(self, kv)   # as the peers push after their batch sizes
            raise MPIKVStoreError("mxnet_mpi: Trainer.update after a failed "
                                  "Trainer.allreduce_grads: %s" % failed)
        if not self._update_on_kvstore:
            self._mxmpi_agreed = kv.batch_agreement(
                batch_size, "Trainer.update %d: sum of batch sizes"
                % getattr(self, "_mxmpi_count", 0), describe(self._optimizer, self._scale),
                step_flags(not ignore_stale_grad and stale_gradient(self._params),
                           written(self)))
            if ignore_stale_grad:
                fresh_counts(self, kv)
        try:
            return orig_public_update(self, batch_size, ignore_stale_grad)
        except MPIKVStoreError:
            _drain_failed_step()
            raise
        finally:
            self._mxmpi_agreed = None

    def _allreduce_grads(self):
        kv = self._kvstore
        if not isinstance(kv, MPIKVStore):
            return orig_allreduce(self)
        uok = bool(self._update_on_kvstore)
        batch = None if uok else getattr(self, "_mxmpi_batch", None)
        what = "%s %d: gradient allreduce" % (getattr(self, "_mxmpi_call", "Trainer.step"),
                                              getattr(self, "_mxmpi_count", 0))
        settings, flags = "", 0
        stale = stale_gradient(self._params)
        if stale:
            zero_stale(self._params)   # a stale gradient adds nothing to the sums
        if batch is not None:
            settings = describe(self._optimizer, self._scale)
            ignore = getattr(self, "_mxmpi_ignore_stale", False)
            flags = step_flags(stale and not ignore, written(self))
            if ignore:
                fresh_counts(self, kv)
        skip = frozenset()
        if uok and getattr(self, "_mxmpi_ignore_stale", False) and "async" not in kv.type:
            # the servers update what is pushed: a parameter fresh on no rank
            # is neither pushed nor pulled on any rank, so it is not updated,
            # as a step with ignore_stale_grad=True skips it on one process
            # (synchronous stores: asynchronous groups step apart, and each
            # server update takes one group's push as it comes)
            fresh_counts(self, kv)
            counts = self._mxmpi_fresh.counts()
            skip = frozenset(i for i, c in enumerate(counts) if c == 0)
        agreed = kv.allreduce_params(self._params, uok, batch, what, settings, flags, skip=skip,
                                     owner=getattr(self, "_mxmpi_owner", ""))
        if agreed is not None:
            self._mxmpi_agreed = agreed

    def _update(self, ignore_stale_grad=False):
        new_step(self._optimizer)   # Nadam's copies on several devices (optimizer_fixes)
        agreed = getattr(self, "_mxmpi_agreed", None)
        if agreed is not None:
            self._mxmpi_agreed = None
            self._optimizer.rescale_grad = self._scale / agreed.mean()
            what = "%s %d" % (getattr(self, "_mxmpi_call", "Trainer.step"),
                              getattr(self, "_mxmpi_count", 0))
            if agreed.written_ranks:   # before any rank may raise for a stale gradient
                kv = self._kvstore
                check_trainer_after_writes(self, getattr(self, "_mxmpi_writes", None),
                                           lambda row: kv.rank_table(row, WRITES_DESC), what,
                                           agreed.written_ranks, NOT_APPLIED, TRAINER_FIX)
            agreed.refuse_if_stale_elsewhere(self._params, ignore_stale_grad, what)
            if ignore_stale_grad and getattr(self, "_mxmpi_fresh", None) is not None:
                self._mxmpi_fresh.apply(self._params)   # the same parameters on every rank
        if isinstance(self._kvstore, MPIKVStore):
            self._kvstore.share_noise(self._optimizer)   # SGLD: the same noise on every rank
        result = orig_update(self, ignore_stale_grad)
        if self._update_on_kvstore and isinstance(self._kvstore, MPIKVStore):
            # MXNet marks a gradient used only where it updates on the rank:
            # with the servers updating, every gradient stayed fresh, and one
            # that backward did not write again was pushed again (the last
            # step's values in the next sum) where it should add nothing
            for p in self._params:
                if p._data is not None and p.grad_req != "null":
                    for arr in p._data:
                        arr._fresh_grad = False
        return result

    orig_sparse_create = trainer_mod._create_sparse_kvstore

    @functools.wraps(orig_sparse_create)
    def _create_sparse_kvstore(kvstore):
        # row_sparse weights: only stores with supports_sparse get this far.
        if isinstance(kvstore, MPIKVStore):
            return kvstore, True
        return orig_sparse_create(kvstore)

    def checked(orig):
        @functools.wraps(orig)
        def run(self, *args, **kwargs):
            result = orig(self, *args, **kwargs)
            if isinstance(self._kvstore, MPIKVStore):
                if not hasattr(self, "_mxmpi_check"):
                    self._mxmpi_check = PeriodicCheck()
                self._mxmpi_check.tick(self, self._kvstore)
            return result
        return run

    orig_load_states = Trainer.load_states

    @functools.wraps(orig_load_states)
    def load_states(self, fname):
        orig_load_states(self, fname)
        if _store_of(self) is not None and not self._update_on_kvstore:
            # the file's count tables are those of the saving rank's device
            # ids: a device it did not have counted from 0 again (Adam's step
            # apart from the rank's other copies, and its gradient in the sum)
            spread_counts(self._optimizer, self._contexts)
        weight_writes.note(self)

    Trainer.__init__ = __init__
    Trainer.load_states = load_states
    Trainer._allreduce_grads = _allreduce_grads
    Trainer._update = _update
    Trainer.step = checked(step)
    Trainer.allreduce_grads = allreduce_grads
    Trainer.update = checked(update)
    trainer_mod._create_kvstore = _patched_create_kvstore(trainer_mod._create_kvstore)
    trainer_mod._create_sparse_kvstore = _create_sparse_kvstore


MODULE_OUTCOME = ("they were compared at this update, a few updates after the write, and "
                  "have been updated apart since")
MODULE_FIX = ("write them before init_optimizer (it copies rank 0's weights to every rank "
              "then)")


def _note_module_write(module) -> None:
    """A Module's weights or states were written: noted on its updater, which
    a BucketingModule's modules share (a write while one bucket is current
    is then seen by the update of any other), else on the module."""
    weight_writes.note(getattr(module, "_updater", None) or module)


def _module_checks(module, kv, what: str, now: bool = False) -> None:
    """Before a Module's update: compare the ranks' optimizer settings
    (Module's rescale_grad included: agreed once, in init_optimizer) and,
    after writes on any rank, their weights and states; never waiting (each
    comparison is read a few updates later: store_glue.settings_check). With
    `now`, compare at once and wait (the end of Module.fit's epoch)."""
    updater = getattr(module, "_updater", None)
    optimizer = getattr(updater, "optimizer", None)
    if optimizer is None:
        return
    watch = getattr(updater, "_mxmpi_writes", None)
    group = module._exec_group
    ndev = len(module._context)

    def after_writes(writers: int) -> None:
        weights = [(name, arrays[0], i * ndev) for i, (name, arrays) in
                   enumerate(zip(group.param_names, group.param_arrays))]
        # the watch still holds what this rank wrote before that comparison;
        # a Module's writes are noted as a whole (set_params, load_optimizer_states)
        whole = watch is not None and watch.states
        check_after_writes(weights, optimizer, updater,
                           lambda row: kv.rank_table(row, WRITES_DESC), what, writers,
                           MODULE_OUTCOME, MODULE_FIX, set(range(len(weights))) if whole
                           else set(), whole, lambda *_: _note_module_write(module))
    check = kv.settings_settle if now else kv.settings_check
    check(lambda: describe(optimizer, optimizer.rescale_grad),
          lambda: watch is not None and watch.written(updater, ()), after_writes)


def _patch_module() -> None:
    module_mod = mx.module.module
    Module = module_mod.Module
    orig_init_optimizer = Module.init_optimizer
    orig_initialize = module_mod._initialize_kvstore

    @functools.wraps(orig_init_optimizer)
    def init_optimizer(self, kvstore="local", optimizer="sgd",
                       optimizer_params=(("learning_rate", 0.01),), force_init=False):
        kv = resolve(kvstore)
        if kv is None and not (self.optimizer_initialized and not force_init):
            # (MXNet ignores the call where the optimizer is initialised:
            # Module.fit after init_optimizer keeps the store it has)
            _warn_training_alone(kvstore, "Module")
        if kv is not None and isinstance(optimizer, str) and "async" not in kv.type:
            # MXNet divides by batch_size * num_workers for synchronous dist stores
            # only (not for dist_async); we divide by the sum of the ranks' bound
            # batch sizes, which is that whenever they are equal and the same
            # constant on every rank when they are not (collective: every rank
            # calls init_optimizer).
            optimizer_params = dict(optimizer_params)
            if "rescale_grad" not in optimizer_params:
                total = kv.batch_agreement(self._exec_group.batch_size,
                                           "Module.init_optimizer: sum of bound batch sizes",
                                           describe_params(optimizer, optimizer_params)
                                           ).total()
                optimizer_params["rescale_grad"] = 1.0 / total
        result = orig_init_optimizer(self, kvstore=kv if kv is not None else kvstore,
                                     optimizer=optimizer, optimizer_params=optimizer_params,
                                     force_init=force_init)
        if getattr(self, "_updater", None) is not None:
            self._updater._mxmpi_writes = weight_writes.Watch()
        if isinstance(self._kvstore, MPIKVStore) and not self._update_on_kvstore:
            joining.attach(self._kvstore, self, module=True)   # join() copies it too
        return result

    @functools.wraps(orig_initialize)
    def _initialize_kvstore(kvstore, param_arrays, arg_params, param_names, update_on_kvstore):
        if not isinstance(kvstore, MPIKVStore):
            return orig_initialize(kvstore, param_arrays, arg_params, param_names,
                                   update_on_kvstore)
        # Rank 0's weights go into every device copy the executors train on.
        kvstore.name_keys({name: name for name in param_names})
        with kvstore.serving("Module init: broadcast of initial weights"):
            for idx, param_on_devs in enumerate(param_arrays):
                name = param_names[idx]
                kvstore.broadcast(name, arg_params[name], out=param_on_devs, priority=-idx)
        return None

    orig_update = module_mod._update_params

    @functools.wraps(orig_update)
    def _update_params(param_arrays, grad_arrays, updater, num_device, kvstore=None,
                       param_names=None):
        if not isinstance(kvstore, MPIKVStore):
            return orig_update(param_arrays, grad_arrays, updater, num_device, kvstore,
                               param_names)
        # Last parameter first: the order backprop makes gradients ready.
        for index in reversed(range(len(grad_arrays))):
            if grad_arrays[index][0] is not None:
                kvstore.pushpull(param_names[index], grad_arrays[index], priority=-index)
        # then MXNet's own local update, on the reduced gradients
        return orig_update(param_arrays, grad_arrays, updater, num_device, None, param_names)

    orig_update_module = Module.update
    orig_init_params = Module.init_params
    orig_load_states = Module.load_optimizer_states

    @functools.wraps(orig_init_params)
    def init_params(self, *args, **kwargs):
        was = self.params_initialized
        orig_init_params(self, *args, **kwargs)
        force = kwargs.get("force_init", args[4] if len(args) > 4 else False)
        if self.optimizer_initialized and (force or not was):
            _note_module_write(self)

    orig_set_params = Module.set_params

    @functools.wraps(orig_set_params)
    def set_params(self, *args, **kwargs):   # allow_missing=True bypasses init_params
        orig_set_params(self, *args, **kwargs)
        if self.optimizer_initialized:
            _note_module_write(self)

    @functools.wraps(orig_load_states)
    def load_optimizer_states(self, fname):
        if isinstance(self._kvstore, MPIKVStore) and not self._update_on_kvstore:
            assert self.optimizer_initialized
            with open(fname, "rb") as f:
                module_states.load_file_blob(self, f.read())
        else:
            orig_load_states(self, fname)
        _note_module_write(self)

    orig_save_states = Module.save_optimizer_states

    @functools.wraps(orig_save_states)
    def save_optimizer_states(self, fname):
        if not isinstance(self._kvstore, MPIKVStore) or self._update_on_kvstore:
            return orig_save_states(self, fname)
        # by parameter: MXNet's numbering (parameter x devices + device) loads
        # wrongly on a rank with another number of devices
        assert self.optimizer_initialized
        with open(fname, "wb") as f:
            f.write(module_states.file_blob(self))
        return None

    @functools.wraps(orig_update_module)
    def update(self):
        if not isinstance(self._kvstore, MPIKVStore):
            return orig_update_module(self)
        self._mxmpi_count = getattr(self, "_mxmpi_count", 0) + 1
        kv = self._kvstore
        what = "Module.update %d" % self._mxmpi_count
        kv.share_noise(self._optimizer)   # SGLD: the same noise on every rank
        new_step(self._optimizer)   # Nadam's copies on several devices (optimizer_fixes)
        with kv.serving(what + ": gradient allreduce"), \
                kv.owned_by(getattr(self, "_mxmpi_owner", "")):
            _module_checks(self, kv, what)
            orig_update_module(self)
        if not hasattr(self, "_mxmpi_check"):
            self._mxmpi_check = PeriodicCheck()
        group = self._exec_group
        self._mxmpi_check.tick(dict(zip(group.param_names, group.param_arrays)), self._kvstore)

    orig_sync = Module._sync_params_from_devices

    @functools.wraps(orig_sync)
    def _sync_params_from_devices(self):
        if not isinstance(self._kvstore, MPIKVStore) or any(
                a.stype != "default" for a in self._arg_params.values()):
            return orig_sync(self)   # row_sparse weights: pulled from the servers there
        # MXNet averages the devices' copies of each weight; on our stores they
        # are identical, and (3a)/3 need not be a: on 3 devices Module.fit's
        # end of epoch (get_params, then set_params) moved a rank's weights by
        # rounding, apart from ranks on 1 or 2 devices. Device 0's copy is exact.
        # Auxiliary states (BatchNorm's) differ per device: averaged as MXNet does.
        group = self._exec_group
        for name, block in zip(group.param_names, group.param_arrays):
            block[0].astype(self._arg_params[name].dtype).copyto(self._arg_params[name])
        for name, block in zip(group.aux_names, group.aux_arrays):
            mean = sum(a.copyto(mx.cpu()) for a in block) / len(block)
            mean.astype(self._aux_params[name].dtype).copyto(self._aux_params[name])
        self._params_dirty = False
        return None

    Module._sync_params_from_devices = _sync_params_from_devices
    Module.init_optimizer = init_optimizer
    Module.init_params = init_params
    Module.set_params = set_params
    Module.load_optimizer_states = load_optimizer_states
    Module.save_optimizer_states = save_optimizer_states
    Module.update = update
    module_mod._initialize_kvstore = _initialize_kvstore
    module_mod._update_params = _update_params
    module_mod._create_kvstore = _patched_create_kvstore(module_mod._create_kvstore)


def _trained_modules(module) -> list:
    """The Modules that Module.fit trains under `module`. A BucketingModule's
    buckets share weights, updater and store: its default bucket, which holds
    every parameter (the others bind sharing its arrays), the same on every
    rank; not the current bucket, which differs from rank to rank, nor the
    one that ran init_optimizer, which may lack some parameters."""
    if isinstance(module, mx.mod.Module):
        return [module]
    if isinstance(module, mx.mod.BucketingModule):
        default = module._buckets.get(module._default_bucket_key)
        if default is not None:
            return [default]
        return [module._curr_module] if module._curr_module is not None else []
    if isinstance(module, mx.mod.SequentialModule):
        return [m for sub in module._modules for m in _trained_modules(sub)]
    return []


class _JoiningIter:
    """A Module.fit training iterator that, when this rank's epoch runs out,
    joins the module's store (uneven shards finish together, then continue
    from the state of the rank that ran the most batches)."""

    def __init__(self, data, module) -> None:
        self._data = data
        self._module = module
        self._it = None

    def __iter__(self):
        self._it = iter(self._data)
        return self

    def __next__(self):
        try:
            return next(self._it)
        except StopIteration:
            self._end_of_epoch()
            raise

    def _end_of_epoch(self) -> None:
        modules = [m for m in _trained_modules(self._module)
                   if isinstance(getattr(m, "_kvstore", None), MPIKVStore)]
        if len(modules) > 1:
            # each module has a store of its own, and a rank joined on one
            # would not serve the others: one small collective, so that a rank
            # with fewer batches is named here, not paired with the next epoch
            modules[0]._kvstore.rank_table(
                np.zeros(1, dtype=np.int64), "Module.fit: end of epoch (the modules of a "
                "SequentialModule cannot join: every rank needs the same number of batches)")
            return
        for module in modules:
            kv = module._kvstore
            if not kv.supports_join:
                continue
            group = module._exec_group
            params = dict(zip(group.param_names, group.param_arrays))
            params.update(zip(group.aux_names, group.aux_arrays))
            updater = getattr(module, "_updater", None)
            kv.join(params=params, updater=ModuleStates(module) if updater is not None else None)
            # every rank is here now: a write on some ranks (set_params,
            # load_optimizer_states on rank 0 only) is named before the
            # epoch's checkpoint, not only at the next periodic comparison
            _module_checks(module, kv, "Module.fit: end of epoch", now=True)

    def __getattr__(self, name):
        return getattr(self._data, name)


def _patch_module_fit() -> None:
    BaseModule = mx.module.BaseModule
    orig_fit = BaseModule.fit

    @functools.wraps(orig_fit)
    def fit(self, train_data, *args, **kwargs):
        names = orig_fit.__code__.co_varnames[2:orig_fit.__code__.co_argcount]
        kvstore = kwargs.get("kvstore", args[names.index("kvstore")]
                             if len(args) > names.index("kvstore") else "local")
        # fit's kvstore is ignored where init_optimizer ran before (MXNet
        # keeps that store): then the store the module already has decides
        ours = is_ours(kvstore) or (getattr(self, "optimizer_initialized", False) and any(
            isinstance(getattr(m, "_kvstore", None), MPIKVStore)
            for m in _trained_modules(self)))
        if ours and not isinstance(train_data, _JoiningIter):
            train_data = _JoiningIter(train_data, self)
        return orig_fit(self, train_data, *args, **kwargs)

    BaseModule.fit = fit


def _finish_queued_work_at_exit() -> None:
    """MXNet's exit handler puts its engine in a shutdown phase in which
    operations still queued are skipped, not run. A dist_sync worker whose last
    pushes were still queued when its script ended would drop them, and the
    workers whose pushes were already sent would wait for them forever (seen
    with MXNet's own image-classification example, most runs hanging at exit).
    Registered after MXNet's handler (mxnet is imported first), this one runs
    before it and lets the queued work finish. Only for processes that create
    one of MXNet's distributed stores (ours drain at exit already, world.py);
    elsewhere an exit stays exactly as MXNet makes it. Idempotent."""
    global _drain_registered
    if not _drain_registered:
        atexit.register(wait_queued_ops)
        _drain_registered = True


def apply() -> None:
    """Install the patches once (idempotent)."""
    global _applied
    if _applied:
        return
    global _original_create
    _original_create = mx.kv.create
    mx.kv.create = _patched_create(mx.kv.create)
    mx.model._create_kvstore = _patched_create_kvstore(mx.model._create_kvstore)
    _patch_parameter()
    _patch_trainer()
    _patch_module()
    _patch_module_fit()
    _applied = True

"""Ranks whose optimizer settings differ end with an error at the step the
difference appears, on every rank, naming each rank's settings; ranks whose
settings agree train on, bit-identical.

  mpirun -np 2 python optimizer_settings.py MODE OUTDIR SECTION[,SECTION...]

Each "differ" section gives rank 1 (only) another setting and expects
MPIKVStoreError from the step that applies it, with the step's name and this
rank's own value in the message; the "same" sections train with equal,
non-default settings (a scheduler, multipliers) and record a digest of the
weights, which the test compares across ranks. Writes rank<r>.json
(tests/scripts/_common.py Results).
"""

from __future__ import annotations

import hashlib
import sys

import mxnet as mx
import numpy as np
from _common import Results, gluon_step, small_net_and_data

import mxnet_mpi
from mxnet_mpi.store_glue import SETTINGS_COLLECTIVES

MODE, OUTDIR, SECTIONS = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
RANK, SIZE = mxnet_mpi.rank(), mxnet_mpi.size()
OTHER = RANK == 1          # the rank given another setting in the "differ" sections
SAME = {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01}
digests: dict = {}


def expect_refusal(res: Results, run, where: str, mine: str) -> None:
    """`run` must raise MPIKVStoreError naming `where` and this rank's `mine`."""
    try:
        run()
        mx.nd.waitall()
    except mxnet_mpi.MPIKVStoreError as e:
        text = str(e)
        res.check("optimizer settings differ" in text and where in text and mine in text,
                  "unexpected message (want %r and %r): %s" % (where, mine, text[:600]))
        return
    res.check(False, "no error: rank %d trained on with other optimizer settings" % RANK)


def trainer_differs(optimizer: str, params: dict, mine: str, where="Trainer.step 1",
                    before=None, steps: int = 1, update_path: bool = False):
    def section(res: Results) -> None:
        net, x, y = small_net_and_data(RANK)
        if before is not None:
            before(net)
        trainer = mx.gluon.Trainer(net.collect_params(), optimizer, params, kvstore="mpi_" + MODE)

        def run() -> None:
            for _ in range(steps):
                gluon_step(net, trainer, x, y, update_path)
        expect_refusal(res, run, where, mine)
    return section


def section_set_learning_rate(res: Results) -> None:
    """Two steps in agreement, then set_learning_rate on one rank: the third
    step is refused."""
    net, x, y = small_net_and_data(RANK)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", SAME, kvstore="mpi_" + MODE)
    for _ in range(2):
        gluon_step(net, trainer, x, y)
    mx.nd.waitall()
    if OTHER:
        trainer.set_learning_rate(0.5)
    expect_refusal(res, lambda: gluon_step(net, trainer, x, y), "Trainer.step 3",
                   "lr=0.5" if OTHER else "lr=0.1")


def section_same(res: Results) -> None:
    """Equal settings, not the defaults: a scheduler, a parameter multiplier,
    Adam; trains on, bit-identical (digests compared by the test)."""
    for name, params in (("sgd", dict(SAME, lr_scheduler=mx.lr_scheduler.MultiFactorScheduler(
            step=[2, 4], factor=0.5))), ("adam", {"learning_rate": 0.01})):
        net, x, y = small_net_and_data(RANK)
        net[0].weight.lr_mult = 0.5
        trainer = mx.gluon.Trainer(net.collect_params(), name, params, kvstore="mpi_" + MODE)
        for _ in range(5):
            gluon_step(net, trainer, x, y)
        gluon_step(net, trainer, x, y, update_path=True)
        digests["same_" + name] = hashlib.sha256(b"".join(
            p.data().asnumpy().tobytes() for p in net.collect_params().values())).hexdigest()


def section_scheduler_peek(res: Results) -> None:
    """Rank 1 logs the next step's rate by asking the scheduler ahead of the
    optimizer (it moves MXNet's schedulers' progress early, not the rate of
    the next update): trains on, bit-identical, across two changes of rate.
    Then rank 1 asks it far ahead (a plot of the schedule with the same
    object), which changes the next rate: refused."""
    net, x, y = small_net_and_data(RANK)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", dict(
        SAME, lr_scheduler=mx.lr_scheduler.FactorScheduler(step=2, factor=0.5)),
        kvstore="mpi_" + MODE)
    rates = []
    for _ in range(6):
        gluon_step(net, trainer, x, y)
        if OTHER:
            rates.append(trainer.optimizer.lr_scheduler(trainer.optimizer.num_update + 1))
    mx.nd.waitall()
    res.check(not OTHER or rates[-1] < rates[0], "the rate never changed: %s" % rates)
    digests["scheduler_peek"] = hashlib.sha256(b"".join(
        p.data().asnumpy().tobytes() for p in net.collect_params().values())).hexdigest()
    if OTHER:
        trainer.optimizer.lr_scheduler(100)
    expect_refusal(res, lambda: gluon_step(net, trainer, x, y), "Trainer.step 7",
                   "lr at update 7=%r" % (1e-08 if OTHER else 0.1 * 0.5 ** 3))


def section_numpy_rate(res: Results) -> None:
    """A rate read from a float32 table (numpy scalars: np.float32 is no
    float), one step ahead on rank 1: left out of the settings, the ranks
    drifted apart silently. Refused at the step it is applied; and in the
    Module, a numpy rate that differs from the start."""
    table = np.array([0.1, 0.05, 0.025, 0.0125], dtype=np.float32)
    net, x, y = small_net_and_data(RANK)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", dict(SAME), kvstore="mpi_" + MODE)

    def run() -> None:
        for step in range(3):
            trainer.set_learning_rate(table[step + (1 if OTHER and step == 2 else 0)])
            gluon_step(net, trainer, x, y)
    expect_refusal(res, run, "Trainer.step 3", "lr=%r" % float(table[3 if OTHER else 2]))
    data = mx.sym.Variable("data")
    out = mx.sym.LinearRegressionOutput(mx.sym.FullyConnected(data, num_hidden=2, name="fc"),
                                        name="lro")
    mod = mx.mod.Module(out, data_names=["data"], label_names=["lro_label"])
    mod.bind(data_shapes=[("data", (8, 3))], label_shapes=[("lro_label", (8, 2))])
    mod.init_params(mx.init.Constant(0.1))
    rate = table[1 if OTHER else 0]
    expect_refusal(res, lambda: mod.init_optimizer(
        kvstore="mpi_" + MODE, optimizer="sgd", optimizer_params={"learning_rate": rate}),
        "Module.init_optimizer", "learning_rate=%r" % float(rate))


class Plateau(mx.lr_scheduler.LRScheduler):
    """A scheduler of the user's own that keeps its rate in a private
    attribute, halved when the rank's own loss stops falling."""

    def __init__(self, lr: float) -> None:
        super().__init__(lr)
        self._lr = lr

    def __call__(self, num_update: int) -> float:
        return self._lr


class LoggedFactor(mx.lr_scheduler.FactorScheduler):
    """A subclass of one of MXNet's schedulers that writes each rate to a
    file (so it cannot be copied, and is not called ahead)."""

    def __init__(self, path: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.log = open(path, "w")  # noqa: SIM115  (closed by the section)

    def __call__(self, num_update: int) -> float:
        rate = super().__call__(num_update)
        self.log.write("%d %g\n" % (num_update, rate))
        return rate


def refused_when_halved(res: Results, sched, halve, mine: str) -> None:
    """Train with `sched`; before the third step rank 1 alone calls `halve`:
    refused at that step, naming this rank's `mine`."""
    net, x, y = small_net_and_data(RANK)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", dict(SAME, lr_scheduler=sched),
                               kvstore="mpi_" + MODE)

    def run() -> None:
        for step in range(3):
            if OTHER and step == 2:
                halve()
            gluon_step(net, trainer, x, y)
    expect_refusal(res, run, "Trainer.step 3", mine)


def section_private_scheduler(res: Results) -> None:
    """A scheduler whose rate no public setting shows, halved on rank 1 only:
    the ranks drifted apart silently. Its private values are compared:
    refused at the step that applies it."""
    plateau = Plateau(0.1)

    def halve() -> None:
        plateau._lr /= 2
    refused_when_halved(res, plateau, halve, "_lr=%r" % (0.05 if OTHER else 0.1))


class Warmup(mx.lr_scheduler.LRScheduler):
    """A warm-up wrapper of the user's own around one of MXNet's schedulers."""

    def __init__(self, after, warm: int = 2) -> None:
        super().__init__(base_lr=0.1)
        self.after, self.warm = after, warm

    def __call__(self, num_update: int) -> float:
        if num_update <= self.warm:
            return self.base_lr * num_update / self.warm
        return self.after(num_update - self.warm)


class Decay:
    """A scheduler that is a plain callable, no LRScheduler."""

    def __init__(self) -> None:
        self.base_lr = 0.1

    def __call__(self, num_update: int) -> float:
        return self.base_lr / (1 + num_update)


FUNCTION_RATE = 0.5 if OTHER else 0.1   # read by function_rate below


def function_rate(num_update: int) -> float:
    """A scheduler that is a plain function reading a module value."""
    return FUNCTION_RATE


def closure_rate(rate: float):
    def schedule(num_update: int) -> float:
        return rate
    schedule.base_lr = 0.1
    return schedule


def section_function_scheduler(res: Results) -> None:
    """A plain function as the scheduler whose rate differs on rank 1 (a
    module value it reads, or a value it closes over): only its attributes
    were compared, and the ranks drifted apart silently. Refused at the
    first step."""
    function_rate.base_lr = 0.1
    for sched, mine in ((function_rate, "global FUNCTION_RATE=%r" % FUNCTION_RATE),
                        (closure_rate(FUNCTION_RATE), "__closure__=[%r]" % FUNCTION_RATE)):
        net, x, y = small_net_and_data(RANK)
        trainer = mx.gluon.Trainer(net.collect_params(), "sgd", dict(SAME, lr_scheduler=sched),
                                   kvstore="mpi_" + MODE)
        expect_refusal(res, lambda net=net, trainer=trainer, x=x, y=y: gluon_step(
            net, trainer, x, y), "Trainer.step 1", mine)


def section_nested_scheduler(res: Results) -> None:
    """A warm-up wrapper whose inner FactorScheduler has another base rate on
    rank 1: compared by the wrapper's own values only, the ranks drifted apart
    silently once the inner one took over. Refused at the first step; equal
    wrappers train on, bit-identical."""
    net, x, y = small_net_and_data(RANK)
    inner = mx.lr_scheduler.FactorScheduler(step=100, base_lr=0.05 if OTHER else 0.1)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", dict(SAME, lr_scheduler=Warmup(
        inner)), kvstore="mpi_" + MODE)
    expect_refusal(res, lambda: gluon_step(net, trainer, x, y), "Trainer.step 1",
                   "after=FactorScheduler(base_lr=%r" % (0.05 if OTHER else 0.1))
    net, x, y = small_net_and_data(RANK)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", dict(SAME, lr_scheduler=Warmup(
        mx.lr_scheduler.FactorScheduler(step=2, base_lr=0.1))), kvstore="mpi_" + MODE)
    for _ in range(5):
        gluon_step(net, trainer, x, y)
    # MXNet takes any callable as the scheduler: one that is no LRScheduler
    # (its description crashed every step)
    net2, x2, y2 = small_net_and_data(RANK)
    trainer = mx.gluon.Trainer(net2.collect_params(), "sgd", dict(SAME, lr_scheduler=Decay()),
                               kvstore="mpi_" + MODE)
    for _ in range(3):
        gluon_step(net2, trainer, x2, y2)
    digests["nested_scheduler"] = hashlib.sha256(b"".join(
        p.data().asnumpy().tobytes() for p in list(net.collect_params().values())
        + list(net2.collect_params().values()))).hexdigest()


def section_scheduler_subclass(res: Results) -> None:
    """A subclass of FactorScheduler that holds a file, its base rate halved
    on rank 1 only: refused at the step that applies it (a version that left
    out subclasses' progress, and copied only schedulers of small values,
    compared nothing of its rate: the ranks drifted apart silently)."""
    import os
    import tempfile
    path = os.path.join(tempfile.mkdtemp(), "rates%d.txt" % RANK)
    sched = LoggedFactor(path, step=100, factor=0.5)

    def halve() -> None:
        sched.base_lr /= 2
    try:
        refused_when_halved(res, sched, halve, "base_lr=%r" % (0.05 if OTHER else 0.1))
    finally:
        sched.log.close()


def section_module(res: Results) -> None:
    """Module: the settings are compared at init_optimizer (with the sum of
    the bound batch sizes) and at an update once per SETTINGS_COLLECTIVES
    collectives, each comparison read at the next one."""
    data = mx.sym.Variable("data")
    out = mx.sym.LinearRegressionOutput(mx.sym.FullyConnected(data, num_hidden=2, name="fc"),
                                        name="lro")

    def module(lr: float, **more):
        mod = mx.mod.Module(out, data_names=["data"], label_names=["lro_label"])
        mod.bind(data_shapes=[("data", (8, 3))], label_shapes=[("lro_label", (8, 2))])
        mod.init_params(mx.init.Constant(0.1))
        mod.init_optimizer(kvstore="mpi_" + MODE, optimizer="sgd",
                           optimizer_params=dict(more, learning_rate=lr))
        return mod
    mod = module(0.1)   # equal: no error
    rng = np.random.RandomState(RANK)
    batch = mx.io.DataBatch([mx.nd.array(rng.randn(8, 3))], [mx.nd.array(rng.randn(8, 2))])
    for _ in range(2):
        mod.forward_backward(batch)
        mod.update()
    if OTHER:
        mod._optimizer.set_learning_rate(0.5)

    def more(updates: int) -> None:
        for _ in range(updates):
            mod.forward_backward(batch)
            mod.update()
    # an update moves 2 gradients: a comparison sees the new rate within
    # SETTINGS_COLLECTIVES / 2 updates, and is read as many later
    limit = SETTINGS_COLLECTIVES + 2
    expect_refusal(res, lambda: more(limit), "Module.update", "lr=0.5" if OTHER else "lr=0.1")
    expect_refusal(res, lambda: module(0.2 if OTHER else 0.1),
                   "Module.init_optimizer", "learning_rate=%r" % (0.2 if OTHER else 0.1))
    # a scheduler object in optimizer_params, compared by its settings
    factor_step = 3 if OTHER else 2
    expect_refusal(res, lambda: module(0.1, lr_scheduler=mx.lr_scheduler.FactorScheduler(
        step=factor_step, factor=0.5)), "Module.init_optimizer", "step=%d" % factor_step)


def section_horovod(res: Results) -> None:
    import mxnet_mpi.horovod as hvd
    hvd.init()
    net, x, y = small_net_and_data(RANK)
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    lr = 0.2 if OTHER else 0.1
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": lr})
    expect_refusal(res, lambda: gluon_step(net, trainer, x, y), "DistributedTrainer.step 1",
                   "lr=%r" % lr)


def section_horovod_optimizer(res: Results) -> None:
    """mxnet_mpi.horovod.DistributedOptimizer (each rank applies its own, as in
    Horovod): equal settings pass the first comparison, also after every rank
    saves and loads the trainer's states (the optimizer pickled);
    set_learning_rate on one rank is refused within two comparison periods of
    updates."""
    import mxnet_mpi.horovod as hvd
    from mxnet_mpi.horovod import SETTINGS_UPDATES
    hvd.init()
    net, x, y = small_net_and_data(RANK)
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    opt = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1))
    trainer = mx.gluon.Trainer(net.collect_params(), opt, kvstore=None)
    for _ in range(2):
        gluon_step(net, trainer, x, y)
    mx.nd.waitall()
    path = "%s/hvd_opt%d.states" % (OUTDIR, RANK)
    trainer.save_states(path)
    trainer.load_states(path)
    gluon_step(net, trainer, x, y)
    if OTHER:
        trainer.set_learning_rate(0.5)

    def more() -> None:   # 4 parameters: 4 updates a step
        for _ in range(2 * SETTINGS_UPDATES // 4 + 2):
            gluon_step(net, trainer, x, y)
    expect_refusal(res, more, "DistributedOptimizer update", "lr=0.5" if OTHER else "lr=0.1")


def section_set_optimizer(res: Results) -> None:
    """The KVStore API's set_optimizer: every rank applies its own."""
    kv = mx.kv.create("mpi_" + MODE)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))   # equal: no error
    w = mx.nd.ones((3,))
    kv.init("w", w)
    kv.push("w", mx.nd.ones((3,)))
    kv.pull("w", out=w)
    res.equal(w, np.full((3,), 1 - 0.1 * SIZE, dtype="float32"), "weight after one update")
    lr = 0.2 if OTHER else 0.1
    expect_refusal(res, lambda: kv.set_optimizer(mx.optimizer.SGD(learning_rate=lr)),
                   "set_optimizer", "lr=%r" % lr)


def stale_gradient(trainer_of):
    """Rank 1 skips backward at the second step: MXNet's Trainer refuses the
    step there (a stale gradient); every other rank must refuse it too, or
    rank 1's weights fall one update behind. A third step trains on, and the
    weights stay identical (digest compared by the test)."""
    def section(res: Results) -> None:
        net, x, y = small_net_and_data(RANK)
        trainer = trainer_of(net)
        raised = []
        for step in range(3):
            if not (OTHER and step == 1):
                with mx.autograd.record():
                    loss = ((net(x) - y) ** 2).sum()
                loss.backward()
            try:
                trainer.step(8)
            except UserWarning as e:
                raised.append((step, str(e)))
        mx.nd.waitall()
        want = "has not been updated by backward"
        res.check([s for s, _ in raised] == [1] and want in raised[0][1]
                  and (OTHER or "1 other rank(s)" in raised[0][1]),
                  "refusals: %r" % raised)
        digests["stale_" + trainer_of.__name__] = hashlib.sha256(b"".join(
            p.data().asnumpy().tobytes() for p in net.collect_params().values())).hexdigest()
    return section


def ignore_stale(trainer_of, update_path: bool = False, scale_by_size: bool = False):
    """ignore_stale_grad=True with a head that only some ranks' batches use:
    at step s rank r uses head (s + r) % 2 of three (the third never). Every
    rank must update a head fresh on any rank, with the stale copies adding
    nothing to the sum, and skip the head fresh on none (weight decay would
    move it): the weights equal those of one process whose loss sums both
    ranks' heads (`scale_by_size`: Horovod's trainer averages over the ranks)."""
    def section(res: Results) -> None:
        heads = mx.gluon.nn.Sequential()
        for _ in range(3):
            heads.add(mx.gluon.nn.Dense(1, in_units=3, use_bias=False))
        heads.initialize(mx.init.Constant(0.5))
        ref = mx.gluon.nn.Sequential()
        for _ in range(3):
            ref.add(mx.gluon.nn.Dense(1, in_units=3, use_bias=False))
        ref.initialize(mx.init.Constant(0.5))
        opt = {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.1}
        trainer = trainer_of(heads, opt)
        ref_trainer = mx.gluon.Trainer(ref.collect_params(), "sgd", opt, kvstore=None)
        data = [mx.nd.array(np.random.RandomState(10 + r).randn(3, 8, 3)) for r in range(SIZE)]
        for s in range(3):
            with mx.autograd.record():
                loss = heads[(s + RANK) % 2](data[RANK][s]).sum()
            loss.backward()
            if update_path:
                trainer.allreduce_grads()
                trainer.update(8, ignore_stale_grad=True)
            else:
                trainer.step(8, ignore_stale_grad=True)
            with mx.autograd.record():
                total = sum(ref[(s + r) % 2](data[r][s]).sum() for r in range(SIZE))
            total.backward()
            ref_trainer.step(8 * SIZE if scale_by_size else 8, ignore_stale_grad=True)
        got = [h.weight.data().asnumpy() for h in heads]
        want = [h.weight.data().asnumpy() for h in ref]
        res.check((got[2] == 0.5).all(), "the head no rank used moved: %s" % got[2])
        res.check(all(np.allclose(g, w, rtol=1e-6, atol=0) for g, w in zip(got, want)),
                  "weights %s, one process on both ranks' batches %s" % (got, want))
        digests["ignore_stale_%s%s" % (trainer_of.__name__, "_update" if update_path else "")] = \
            hashlib.sha256(b"".join(g.tobytes() for g in got)).hexdigest()
    return section


def gluon_trainer(net, opt=SAME):
    return mx.gluon.Trainer(net.collect_params(), "sgd", opt, kvstore="mpi_" + MODE)


def hvd_trainer(net, opt=SAME):
    import mxnet_mpi.horovod as hvd
    hvd.init()
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    return hvd.DistributedTrainer(net.collect_params(), "sgd", opt)


def section_aggregate(res: Results) -> None:
    """How many parameters one update op takes (MXNET_OPTIMIZER_AGGREGATION_SIZE
    as the optimizer read it): LAMB's grouped update rounds differently."""
    net, x, y = small_net_and_data(RANK)
    opt = mx.optimizer.create("lamb", learning_rate=0.01)
    opt.aggregate_num = 4 if OTHER else 1
    trainer = mx.gluon.Trainer(net.collect_params(), opt, kvstore="mpi_" + MODE)
    expect_refusal(res, lambda: gluon_step(net, trainer, x, y), "Trainer.step 1",
                   "aggregate_num=%d" % opt.aggregate_num)


def _alike(res: Results, copies: list, what: str) -> None:
    """`copies`: this rank's device copies of one weight, alike on each
    device and every rank."""
    res.check(all(np.array_equal(c, copies[0]) for c in copies),
              "%s: rank %d's device copies differ" % (what, RANK))
    total = mx.nd.array(copies[0])
    mxnet_mpi.allreduce_(total)
    res.check(np.array_equal(total.asnumpy(), copies[0] * SIZE),
              "%s: the ranks' weights differ" % what)


def section_nadam_devices(res: Results) -> None:
    """Nadam, equal settings, rank 1 on two devices: its m_schedule advanced
    at each device copy's update, so rank 1's second copies and the ranks
    drifted apart (the settings check stopped the step). Each device now
    keeps a schedule of its own: the ranks and devices stay alike."""
    net, x, y = small_net_and_data(RANK)
    ctxs = [mx.cpu(0), mx.cpu(1)] if OTHER else [mx.cpu(0)]
    net.collect_params().reset_ctx(ctxs)
    trainer = mx.gluon.Trainer(net.collect_params(), "nadam", {"learning_rate": 0.01},
                               kvstore="mpi_" + MODE)
    for _ in range(3):
        xs = mx.gluon.utils.split_and_load(x, ctxs)
        ys = mx.gluon.utils.split_and_load(y, ctxs)
        with mx.autograd.record():
            losses = [((net(a) - b) ** 2).sum() for a, b in zip(xs, ys)]
        for loss in losses:
            loss.backward()
        trainer.step(8)
    _alike(res, [d.asnumpy() for d in net[0].weight.list_data()], "Trainer")


def section_module_nadam_devices(res: Results) -> None:
    """Module, Nadam, rank 1 on two devices: the ranks and devices stay
    alike (they drifted apart with exit 0)."""
    data = mx.sym.Variable("data")
    out = mx.sym.LinearRegressionOutput(mx.sym.FullyConnected(data, num_hidden=2, name="fc"),
                                        name="lro")
    ctxs = [mx.cpu(0), mx.cpu(1)] if OTHER else [mx.cpu(0)]
    mod = mx.mod.Module(out, data_names=["data"], label_names=["lro_label"], context=ctxs)
    mod.bind(data_shapes=[("data", (8, 3))], label_shapes=[("lro_label", (8, 2))])
    mod.init_params(mx.init.Constant(0.1))
    mod.init_optimizer(kvstore="mpi_" + MODE, optimizer="nadam",
                       optimizer_params={"learning_rate": 0.01})
    rng = np.random.RandomState(RANK)
    batch = mx.io.DataBatch([mx.nd.array(rng.randn(8, 3))], [mx.nd.array(rng.randn(8, 2))])
    for _ in range(3):
        mod.forward_backward(batch)
        mod.update()
    names = mod._exec_group.param_names
    weights = mod._exec_group.param_arrays[names.index("fc_weight")]
    _alike(res, [w.asnumpy() for w in weights], "Module")


def section_nadam_states(res: Results) -> None:
    """Nadam, rank 1 alone loads the states it saved after the first step:
    only its m_schedule differs, and the error says that loaded states are
    the cause."""
    net, x, y = small_net_and_data(RANK)
    trainer = mx.gluon.Trainer(net.collect_params(), "nadam", {"learning_rate": 0.01},
                               kvstore="mpi_" + MODE)
    path = "%s/nadam_states_%d" % (OUTDIR, RANK)
    gluon_step(net, trainer, x, y)
    trainer.save_states(path)
    gluon_step(net, trainer, x, y)
    if OTHER:
        trainer.load_states(path)
    try:
        gluon_step(net, trainer, x, y)
        mx.nd.waitall()
        res.check(False, "no error: rank 1 loaded other states")
    except mxnet_mpi.MPIKVStoreError as e:
        res.check("Only Nadam's m_schedule differs" in str(e) and "load_states" in str(e),
                  "unexpected message: %s" % str(e)[:700])


def section_nadam_lr(res: Results) -> None:
    """Nadam on one device per rank, rank 1 with another rate: the error names
    the rates, without the advice about loaded states (only m_schedule
    differing gets it)."""
    net, x, y = small_net_and_data(RANK)
    trainer = mx.gluon.Trainer(net.collect_params(), "nadam",
                               {"learning_rate": 0.02 if OTHER else 0.01}, kvstore="mpi_" + MODE)
    try:
        for _ in range(3):
            gluon_step(net, trainer, x, y)
        mx.nd.waitall()
        res.check(False, "no error: rank %d trained on with another rate" % RANK)
    except mxnet_mpi.MPIKVStoreError as e:
        text = str(e)
        res.check("lr=%r" % (0.02 if OTHER else 0.01) in text and "load_states" not in text,
                  "unexpected message: %s" % text[:600])


def _mult(net) -> None:
    if OTHER:
        net[1].weight.lr_mult = 2.0


SECTION_FNS = {
    "learning_rate": trainer_differs("sgd", {"learning_rate": 0.2 if OTHER else 0.1},
                                     "lr=%r" % (0.2 if OTHER else 0.1)),
    "optimizer": trainer_differs("adam" if OTHER else "sgd", {"learning_rate": 0.1},
                                 "Adam" if OTHER else "SGD"),
    "momentum": trainer_differs("sgd", {"learning_rate": 0.1, "momentum": 0.9 if OTHER else 0.0},
                                "momentum=%r" % (0.9 if OTHER else 0.0)),
    "weight_decay": trainer_differs("sgd", {"learning_rate": 0.1, "wd": 1e-4 if OTHER else 0.0},
                                    "wd=%r" % (1e-4 if OTHER else 0.0),
                                    where="Trainer.update", update_path=True),
    "lr_mult": trainer_differs("sgd", {"learning_rate": 0.1},
                               "[(3, 2.0, 1.0)]" if OTHER else "lr=0.1", before=_mult),
    "scheduler": trainer_differs("sgd", {"learning_rate": 0.1, "lr_scheduler":
                                         mx.lr_scheduler.FactorScheduler(step=100, factor=0.5)
                                         if OTHER else None},
                                 "FactorScheduler" if OTHER else "lr=0.1"),
    # a list setting: the rates agree until the first change, which was applied
    # on the ranks before they were compared
    "scheduler_peek": section_scheduler_peek,
    "numpy_rate": section_numpy_rate,
    "private_scheduler": section_private_scheduler,
    "nested_scheduler": section_nested_scheduler,
    "function_scheduler": section_function_scheduler,
    "scheduler_subclass": section_scheduler_subclass,
    "scheduler_steps": trainer_differs(
        "sgd", {"learning_rate": 0.1, "lr_scheduler": mx.lr_scheduler.MultiFactorScheduler(
            step=[3, 5] if OTHER else [2, 4], factor=0.5)},
        "step=%r" % ([3, 5] if OTHER else [2, 4])),
    "aggregate": section_aggregate,
    "nadam_devices": section_nadam_devices,
    "nadam_lr": section_nadam_lr,
    "nadam_states": section_nadam_states,
    "module_nadam_devices": section_module_nadam_devices,
    "rescale_grad": trainer_differs("sgd", {"learning_rate": 0.1,
                                            "rescale_grad": 0.5 if OTHER else 1.0},
                                    "trainer scale=%r" % (0.5 if OTHER else 1.0)),
    "set_learning_rate": section_set_learning_rate,
    "same": section_same,
    "module": section_module,
    "horovod": section_horovod,
    "horovod_optimizer": section_horovod_optimizer,
    "set_optimizer": section_set_optimizer,
    "stale_gradient": stale_gradient(gluon_trainer),
    "stale_gradient_horovod": stale_gradient(hvd_trainer),
    "ignore_stale": ignore_stale(gluon_trainer),
    "ignore_stale_update": ignore_stale(gluon_trainer, update_path=True),
    "ignore_stale_horovod": ignore_stale(hvd_trainer, scale_by_size=True),
}

res = Results(OUTDIR, RANK)
for name in SECTIONS:
    res.run(name, SECTION_FNS[name])
res.write(digests=digests)

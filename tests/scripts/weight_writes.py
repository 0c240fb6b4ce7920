"""Weights or optimizer states written on some ranks only, after the trainer
exists, end with an error at the next step, on every rank, before it is
applied; written alike on every rank, training goes on bit-identical.

  mpirun -np 2 python weight_writes.py MODE OUTDIR SECTION[,SECTION...]

Each "one rank" section writes on one rank only (set_data, load_parameters,
initialize(force_reinit=True), Trainer.load_states) and expects
MPIKVStoreError from the next step naming the step and what differs; most
then make the ranks alike again the way the message says and train on. The
"alike" sections write the same values on every rank and train on. Every
section records a digest of its weights at the end, which the test compares
across ranks. Writes rank<r>.json (tests/scripts/_common.py Results).
"""

from __future__ import annotations

import hashlib
import os
import sys
import warnings

import mxnet as mx
import numpy as np
from _common import Results, gluon_step, small_net_and_data

import mxnet_mpi

MODE, OUTDIR, SECTIONS = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
RANK, SIZE = mxnet_mpi.rank(), mxnet_mpi.size()
SGD = {"learning_rate": 0.1, "momentum": 0.9}
digests: dict = {}


def weights(net) -> list:
    return [p.data().asnumpy().copy() for p in net.collect_params().values()]


def step(net, trainer, x, y, update_path: bool = False) -> None:
    gluon_step(net, trainer, x, y, update_path)
    mx.nd.waitall()


def expect_refusal(res: Results, run, where: str, differs: str, remedy: str = "") -> None:
    """`run` must raise MPIKVStoreError naming the step `where`, `differs` and
    (if given) `remedy`."""
    try:
        run()
    except mxnet_mpi.MPIKVStoreError as e:
        text = str(e)
        res.check("wrote weights or optimizer states outside training" in text
                  and where in text and differs in text and "differ from rank 0" in text
                  and remedy in text,
                  "unexpected message (want %r, %r and %r): %s" % (where, differs, remedy,
                                                                   text[:900]))
        return
    res.check(False, "no error: the ranks trained on after rank-local writes")


def record(name: str, net, trained_only: bool = False) -> None:
    """A digest of `net`'s weights (`trained_only`: not the running statistics,
    which are each rank's own), compared across ranks by the test."""
    arrays = [p.data().asnumpy() for p in net.collect_params().values()
              if not trained_only or p.grad_req != "null"]
    digests[name] = hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()


def gluon(net):
    return mx.gluon.Trainer(net.collect_params(), "sgd", SGD, kvstore="mpi_" + MODE)


def hvd_trainer(net):
    import mxnet_mpi.horovod as hvd
    hvd.init()
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    return hvd.DistributedTrainer(net.collect_params(), "sgd", SGD)


def section_set_data(res: Results, update_path: bool = False) -> None:
    """Two steps, then set_data on rank 1: the third step is refused on every
    rank and changes nothing, and so is the next while they differ;
    check_consistency(action='broadcast') copies rank 0's weights, and
    training goes on."""
    net, x, y = small_net_and_data(RANK)
    trainer = gluon(net)
    for _ in range(2):
        step(net, trainer, x, y, update_path)
    if RANK == 1:
        net[1].weight.set_data(mx.nd.full((2, 4), 3.0))
    before = weights(net)
    where = "Trainer.%s 3" % ("update" if update_path else "step")
    expect_refusal(res, lambda: step(net, trainer, x, y, update_path), where,
                   "the weights of %r" % net[1].weight.name)
    res.check(all((a == b).all() for a, b in zip(before, weights(net))),
              "the refused step changed the weights")
    # caught and stepped again without making them alike: refused again (it
    # trained on apart, silently)
    expect_refusal(res, lambda: step(net, trainer, x, y, update_path), where[:-1],
                   "the weights of %r" % net[1].weight.name)
    res.check(all((a == b).all() for a, b in zip(before, weights(net))),
              "the second refused step changed the weights")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mxnet_mpi.check_consistency(trainer, action="broadcast")
    for _ in range(2):
        step(net, trainer, x, y, update_path)
    record("set_data_update" if update_path else "set_data", net)


def section_load_parameters(res: Results) -> None:
    """Rank 0 loads other weights after the Trainer exists, before the first
    step (a resume that loads on rank 0 only): the first step is refused."""
    net, x, y = small_net_and_data(RANK)
    trainer = gluon(net)
    path = os.path.join(OUTDIR, "other%d.params" % RANK)
    other, _, _ = small_net_and_data(RANK)
    other.initialize(mx.init.Constant(0.7), force_reinit=True)
    other.save_parameters(path)
    if RANK == 0:
        net.load_parameters(path)
    expect_refusal(res, lambda: step(net, trainer, x, y), "Trainer.step 1",
                   "the weights of ")


def section_deferred_before_trainer(res: Results) -> None:
    """Deferred initialisation, and before the Trainer exists rank 0 alone
    loads saved weights (a resume on rank 0 only, as scripts written for
    Horovod's broadcast_parameters do) or runs a forward pass (a summary):
    the Trainer gives rank 0's shapes and weights to every rank (the ranks
    broadcast different parameters and stopped, 'ranks disagree')."""
    def deferred_net():
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Dense(4, activation="tanh"), mx.gluon.nn.Dense(2))
        mx.random.seed(10 + RANK)
        net.initialize(mx.init.Uniform(1.0))
        return net
    x = mx.nd.array(np.random.RandomState(RANK).randn(5, 3))
    y = mx.nd.array(np.random.RandomState(RANK).randn(5, 2))
    saved = deferred_net()
    saved(x)
    for p in saved.collect_params().values():
        p.set_data(mx.nd.full(p.shape, 0.7))
    path = os.path.join(OUTDIR, "deferred%d.params" % RANK)
    saved.save_parameters(path)

    net = deferred_net()
    if RANK == 0:
        net.load_parameters(path)
    trainer = gluon(net)
    loaded = [p.data().asnumpy() for p in net.collect_params().values()]
    res.check(len(loaded) == 4 and all((a == np.float32(0.7)).all() for a in loaded),
              "after the Trainer, rank %d does not hold rank 0's loaded weights" % RANK)
    step(net, trainer, x, y)

    # the same through mxnet_mpi.horovod.broadcast_parameters
    import mxnet_mpi.horovod as hvd
    hvd.init()
    net = deferred_net()
    if RANK == 0:
        net.load_parameters(path)
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    loaded = [p.data().asnumpy() for p in net.collect_params().values()]
    res.check(len(loaded) == 4 and all((a == np.float32(0.7)).all() for a in loaded),
              "after broadcast_parameters, rank %d does not hold rank 0's loaded weights" % RANK)

    net = deferred_net()
    if RANK == 0:
        net(x)
    trainer = gluon(net)
    for _ in range(2):
        step(net, trainer, x, y)
    record("deferred_forward", net)


def section_load_states(res: Results) -> None:
    """Rank 0 loads optimizer states saved a step earlier (its momentum and
    update count go back): the next step is refused naming the state."""
    net, x, y = small_net_and_data(RANK)
    trainer = gluon(net)
    path = os.path.join(OUTDIR, "states%d" % RANK)
    for _ in range(2):
        step(net, trainer, x, y)
    trainer.save_states(path)
    step(net, trainer, x, y)
    if RANK == 0:
        trainer.load_states(path)
    # check_consistency finds no weights apart here, so it copies nothing: not advised
    expect_refusal(res, lambda: step(net, trainer, x, y), "Trainer.step 4",
                   "the optimizer state of ", "check_consistency compares weights, not "
                   "optimizer states")


def section_force_reinit(res: Results) -> None:
    """initialize(force_reinit=True) on rank 1 only."""
    net, x, y = small_net_and_data(RANK)
    trainer = gluon(net)
    step(net, trainer, x, y)
    if RANK == 1:
        net.initialize(mx.init.Constant(0.5), force_reinit=True)
    expect_refusal(res, lambda: step(net, trainer, x, y), "Trainer.step 2",
                   "the weights of ")


def section_alike(res: Results) -> None:
    """Every rank saves, trains on, and loads its own saved weights and
    states (equal on every rank): no error, the ranks stay identical. The net
    has a BatchNorm, whose running statistics are each rank's own (from its
    data) and are not compared."""
    net, x, y = small_net_and_data(RANK)
    net.add(mx.gluon.nn.BatchNorm(in_channels=2))
    net[-1].initialize()
    trainer = gluon(net)
    params, states = (os.path.join(OUTDIR, "alike%d.%s" % (RANK, s)) for s in ("params", "st"))
    for _ in range(2):
        step(net, trainer, x, y)
    net.save_parameters(params)
    trainer.save_states(states)
    step(net, trainer, x, y)
    net.load_parameters(params)
    trainer.load_states(states)
    for _ in range(2):
        step(net, trainer, x, y)
    means = net[-1].running_mean.data().asnumpy()
    res.check(means.any(), "the running mean did not move: %s" % means)
    # the running statistics differ (each rank's data); the check leaves them out
    res.check(mxnet_mpi.check_consistency(trainer, action="raise") == [], "check_consistency")
    record("alike", net, trained_only=True)


def section_horovod(res: Results) -> None:
    """DistributedTrainer: set_data on rank 1 is refused at the next step;
    broadcast_parameters, as the message says, makes the ranks alike again."""
    import mxnet_mpi.horovod as hvd
    net, x, y = small_net_and_data(RANK)
    trainer = hvd_trainer(net)
    step(net, trainer, x, y)
    if RANK == 1:
        net[0].bias.set_data(mx.nd.full((4,), -1.0))
    expect_refusal(res, lambda: step(net, trainer, x, y), "DistributedTrainer step 2",
                   "the weights of %r" % net[0].bias.name)
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    step(net, trainer, x, y)
    record("horovod", net)


def section_module(res: Results) -> None:
    """Module: set_params on rank 1 after init_optimizer is refused at the
    comparison that follows (read some updates later, never waiting); the
    same weights set on every rank train on."""
    from mxnet_mpi.store_glue import SETTINGS_COLLECTIVES
    data = mx.sym.Variable("data")
    out = mx.sym.LinearRegressionOutput(mx.sym.FullyConnected(data, num_hidden=2, name="fc"),
                                        name="lro")
    mod = mx.mod.Module(out, data_names=["data"], label_names=["lro_label"])
    mod.bind(data_shapes=[("data", (8, 3))], label_shapes=[("lro_label", (8, 2))])
    mod.init_params(mx.init.Constant(0.1 * (RANK + 1)))   # init_optimizer copies rank 0's
    mod.init_optimizer(kvstore="mpi_" + MODE, optimizer="sgd",
                       optimizer_params={"learning_rate": 0.1, "momentum": 0.9})
    rng = np.random.RandomState(RANK)
    batch = mx.io.DataBatch([mx.nd.array(rng.randn(8, 3))], [mx.nd.array(rng.randn(8, 2))])

    def updates(n: int) -> None:
        for _ in range(n):
            mod.forward_backward(batch)
            mod.update()
        mx.nd.waitall()
    # an update moves 2 gradients: a comparison within SETTINGS_COLLECTIVES / 2
    # updates of the write, read as many later
    period = SETTINGS_COLLECTIVES // 2 + 2
    updates(period)
    arg, aux = mod.get_params()
    mod.set_params({k: v * 1.0 for k, v in arg.items()}, aux)   # every rank, alike
    updates(2 * period)
    if RANK == 1:
        mod.set_params({k: v + 1.0 for k, v in arg.items()}, aux)
    expect_refusal(res, lambda: updates(2 * period), "Module.update", "the weights of 'fc_")


def section_module_fit(res: Results) -> None:
    """Module.fit, rank 1 calls set_params in a batch callback: named at the
    end of the epoch, before its checkpoint (the periodic comparison comes
    every 64/n updates: this 2-parameter model trains 3 updates, and the run
    ended with the ranks apart, exit 0)."""
    data = mx.sym.Variable("data")
    out = mx.sym.LinearRegressionOutput(mx.sym.FullyConnected(data, num_hidden=2, name="fcw"),
                                        name="lro")
    mod = mx.mod.Module(out, data_names=["data"], label_names=["lro_label"])
    rng = np.random.RandomState(RANK)
    it = mx.io.NDArrayIter(rng.randn(24, 3), rng.randn(24, 2), batch_size=8,
                           label_name="lro_label")

    def callback(param) -> None:
        if RANK == 1 and param.nbatch == 0:
            arg, aux = mod.get_params()
            mod.set_params({k: v + 1.0 for k, v in arg.items()}, aux)
    expect_refusal(res, lambda: mod.fit(
        it, num_epoch=1, kvstore="mpi_" + MODE, optimizer="sgd",
        optimizer_params={"learning_rate": 0.1}, initializer=mx.init.Constant(0.1),
        batch_end_callback=callback), "Module.fit: end of epoch", "the weights of 'fcw_")


STORE_SHAPES = {"sa": (4, 3), "sb": (5,)}


def store_grad(step: int, key: str, rank: int) -> np.ndarray:
    return np.random.RandomState(100 * step + 7 * rank + len(key)).randn(
        *STORE_SHAPES[key]).astype(np.float32)


def adam_store(kind: str):
    kv = mx.kv.create(kind)
    kv.set_optimizer(mx.optimizer.Adam(learning_rate=0.05, rescale_grad=1.0 / SIZE))
    for i, (k, shape) in enumerate(sorted(STORE_SHAPES.items())):
        kv.init(k, mx.nd.array(np.random.RandomState(i).rand(*shape)))
    return kv


def store_weights(kv) -> list:
    outs = [mx.nd.zeros(STORE_SHAPES[k]) for k in sorted(STORE_SHAPES)]
    for k, o in zip(sorted(STORE_SHAPES), outs):
        kv.pull(k, out=o)
    return [o.asnumpy() for o in outs]


def store_errors(kv) -> list:
    """The error of each key's last push (each read once, as MXNet raises it)."""
    errors = []
    for k in sorted(STORE_SHAPES):
        out = mx.nd.zeros(STORE_SHAPES[k])
        try:
            kv.pull(k, out=out)
            out.asnumpy()
        except mxnet_mpi.MPIKVStoreError as e:
            errors.append(str(e))
    return errors


def section_store_states(res: Results) -> None:
    """A store with an optimizer (set_optimizer, push, pull): states saved by
    rank 0 and loaded on every rank train on as one process does; loaded on
    rank 0 only (a resume that loads there alone), the next push is refused
    on every rank naming the load (the ranks trained on apart, exit 0)."""
    kv = adam_store("mpi_" + MODE)
    ref = adam_store("local")   # one process pushing the sum of every rank's gradients
    path = os.path.join(OUTDIR, "store.states")
    for step in range(5):
        if step == 3:
            if RANK == 0:
                kv.save_optimizer_states(path)
            mxnet_mpi.allreduce_(mx.nd.ones((1,))).wait_to_read()   # the file is written
            kv.load_optimizer_states(path)
        for k in sorted(STORE_SHAPES):
            kv.push(k, mx.nd.array(store_grad(step, k, RANK)))
            ref.push(k, mx.nd.array(sum(store_grad(step, k, r) for r in range(SIZE))))
    for got, want in zip(store_weights(kv), store_weights(ref)):
        res.check(np.allclose(got, want, rtol=1e-6, atol=1e-7),
                  "after a load on every rank: off by %g" % np.abs(got - want).max())
    digests["store_states"] = hashlib.sha256(b"".join(
        w.tobytes() for w in store_weights(kv))).hexdigest()
    if RANK == 0:
        kv.load_optimizer_states(path)
    for step in (5, 6):   # caught and pushed on: refused again (it trained on apart)
        for k in sorted(STORE_SHAPES):
            kv.push(k, mx.nd.array(store_grad(step, k, RANK)))
        errors = store_errors(kv)
        res.check(len(errors) == len(STORE_SHAPES) and all(
            "after load_optimizer_states, which not every rank called: load them on every "
            "rank" in e for e in errors), "push %d after a load on rank 0 only: %s"
            % (step, [e[:300] for e in errors]))
    if RANK != 0:   # as the message says
        kv.load_optimizer_states(path)
    for step in range(7, 12):
        for k in sorted(STORE_SHAPES):
            kv.push(k, mx.nd.array(store_grad(step, k, RANK)))
    digests["store_states_reloaded"] = hashlib.sha256(b"".join(
        w.tobytes() for w in store_weights(kv))).hexdigest()


def section_store_settings(res: Results) -> None:
    """A store with an optimizer whose learning rate one rank changes: named on
    every rank within 128 of the store's collectives (it trained on apart)."""
    kv = mx.kv.create("mpi_" + MODE)
    opt = mx.optimizer.SGD(learning_rate=0.1)
    kv.set_optimizer(opt)
    kv.init("w", mx.nd.zeros((3,)))
    try:
        for step in range(200):
            if step == 2 and RANK == 1:
                opt.set_learning_rate(0.2)
            kv.push("w", mx.nd.ones((3,)))
        mx.nd.waitall()
        res.check(False, "200 pushes with the learning rate changed on rank 1: no error")
    except mxnet_mpi.MPIKVStoreError as e:
        res.check("learning_rate" in str(e) or "lr" in str(e), str(e)[:600])


def section_store_join(res: Results) -> None:
    """A store with an optimizer, uneven pushes (rank 1 runs out first) and
    kv.join(): every rank then holds the weights and states of the rank that
    pushed most (rank 1 kept its own for good, exit 0), as one process pushing
    the ranks' sums (zeros from a joined rank) has them."""
    kv, ref = adam_store("mpi_" + MODE), adam_store("local")
    steps = [6, 3] + [6] * (SIZE - 2)   # pushes before the join

    def push(step: int) -> None:
        for k in sorted(STORE_SHAPES):
            kv.push(k, mx.nd.array(store_grad(step, k, RANK)))
    for step in range(steps[RANK]):
        push(step)
    kv.join()
    for step in (6, 7):
        push(step)
    for step in range(8):
        for k in sorted(STORE_SHAPES):
            ref.push(k, mx.nd.array(sum(store_grad(step, k, r) for r in range(SIZE)
                                        if step >= 6 or step < steps[r])))
    for got, want in zip(store_weights(kv), store_weights(ref)):
        res.check(np.allclose(got, want, rtol=1e-6, atol=1e-7),
                  "after the join: off by %g" % np.abs(got - want).max())
    digests["store_join"] = hashlib.sha256(b"".join(
        w.tobytes() for w in store_weights(kv))).hexdigest()


SECTION_FNS = {
    "store_join": section_store_join,
    "store_states": section_store_states,
    "store_settings": section_store_settings,
    "set_data": section_set_data,
    "set_data_update": lambda res: section_set_data(res, update_path=True),
    "load_parameters": section_load_parameters,
    "load_states": section_load_states,
    "deferred_before_trainer": section_deferred_before_trainer,
    "force_reinit": section_force_reinit,
    "alike": section_alike,
    "horovod": section_horovod,
    "module": section_module,
    "module_fit": section_module_fit,
}

res = Results(OUTDIR, RANK)
for name in SECTIONS:
    res.run(name, SECTION_FNS[name])
res.write(digests=digests)

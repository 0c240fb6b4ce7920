"""Ranks that pass different batch sizes to one step stay bit-identical and
follow the documented rule (docs/store.md, "Batch sizes"): every rank divides
the summed gradient by the mean batch size of the ranks,
rescale_grad = scale / ((b_0 + ... + b_{n-1}) / n).

  mpirun -np 2 python batch_sizes.py MODE OUTDIR SECTION[,SECTION...]

MODE "hybrid" (under mxnet_mpi.launch, ps-lite servers) runs the hybrid_*
sections on one dist_sync_mpi store with update_on_kvstore=False (ranks
update locally, the servers only sum).

Each section trains a small net on rank-dependent data and batch sizes (some
steps equal on every rank, some not) and compares its final weights, bit for
bit, with a one-process reference computed here: for each step, every rank's
gradient on the same weights and data, their sum (two ranks: the sum does
not depend on the order), then the optimizer with the rule's rescale_grad.
Writes rank<r>.json (tests/scripts/_common.py Results) with a digest of the
weights per section, which the test compares across ranks.
"""

from __future__ import annotations

import hashlib
import sys

import mxnet as mx
import numpy as np
from _common import Results

import mxnet_mpi

MODE, OUTDIR, SECTIONS = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
RANK, SIZE = mxnet_mpi.rank(), mxnet_mpi.size()
# batch size of (rank, step): equal at steps 0 and 3, different elsewhere
# (a short last batch on rank 1, as DataLoader(last_batch='keep') gives)
BATCHES = {0: [8, 8, 5, 8, 8], 1: [8, 3, 8, 8, 3]}
STEPS = 5
OPT = {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01}
digests: dict = {}


def batch_of(rank: int, step: int) -> int:
    return BATCHES[rank % 2][step] + (rank // 2)


def mean_batch(step: int) -> float:
    return sum(batch_of(r, step) for r in range(SIZE)) / SIZE


def data(rank: int, step: int, dtype="float32"):
    rng = np.random.RandomState(1000 * rank + step)
    b = batch_of(rank, step)
    return (mx.nd.array(rng.randn(b, 6), dtype=dtype),
            mx.nd.array(rng.randn(b, 3), dtype=dtype))


def initial(dtype: str) -> dict:
    rng = np.random.RandomState(5)
    return {"0.weight": rng.randn(10, 6) * 0.5, "0.bias": rng.randn(10) * 0.1,
            "1.weight": rng.randn(3, 10) * 0.5, "1.bias": rng.randn(3) * 0.1}


def mlp(dtype: str, ctx, values: dict | None):
    """Dense(10, relu) -> Dense(3), with `values` (or rank-dependent weights,
    which only the store's broadcast of rank 0's makes equal)."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(10, activation="relu", in_units=6),
            mx.gluon.nn.Dense(3, in_units=10))
    net.initialize(ctx=ctx)
    net.cast(dtype)
    for key, p in _params(net).items():
        v = values[key] if values is not None else np.full(p.shape, float(RANK + 1))
        p.set_data(mx.nd.array(v, dtype=dtype))
    return net


def _params(net) -> dict:
    """'0.weight' -> the first layer's weight, ... (names differ per net)."""
    return {"%d.%s" % (i, kind): getattr(net[i], kind) for i in range(len(net))
            for kind in ("weight", "bias")}


def loss_of(net, x, y):
    return ((net(x) - y) ** 2).sum()


def weights(net) -> dict:
    return {k: p.list_data()[0].asnumpy() for k, p in _params(net).items()}


def grads_on(net, rank: int, step: int, dtype: str, shards: int = 1) -> list:
    """Rank `rank`'s gradient at `step` (on `shards` sub-batches summed with
    add_n, as the store sums a rank's devices), one array per parameter."""
    x, y = data(rank, step, dtype)
    # the slices split_and_load(even_split=False) gives each device
    xs = mx.gluon.utils.split_data(x, shards, even_split=False)
    ys = mx.gluon.utils.split_data(y, shards, even_split=False)
    parts = []
    for xi, yi in zip(xs, ys):
        with mx.autograd.record():
            loss = loss_of(net, xi, yi)
        loss.backward()
        parts.append([p.grad().copy() for p in _params(net).values()])
    if shards == 1:
        return parts[0]
    return [mx.nd.add_n(*[part[i] for part in parts]) for i in range(len(parts[0]))]



def reference(dtype: str, *, average: bool = False, shards=1, scale: float = 1.0,
              start: dict | None = None) -> dict:
    """One process: each step, the ranks' gradients on the same weights, summed
    (divided by the ranks with `average`), and one update with the rule.
    `shards`: each rank's number of devices, or a function of the rank."""
    net = mlp(dtype, mx.cpu(), initial(dtype) if start is None else start)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", OPT)
    params = list(_params(net).values())
    for step in range(STEPS):
        per_rank = [grads_on(net, r, step, dtype, shards(r) if callable(shards) else shards)
                    for r in range(SIZE)]
        for i, p in enumerate(params):
            total = per_rank[0][i]
            for g in per_rank[1:]:
                total = total + g[i]
            if average:
                total = total / SIZE
            p.grad()[:] = total
        # Trainer.step(b) sets rescale_grad = 1 / b: pass b = mean / scale
        trainer.step(mean_batch(step) / scale)
    return weights(net)


def record(res: Results, name: str, got: dict, want: dict | None, start: dict) -> None:
    """Compare with the reference; keep a digest (the test compares ranks')."""
    h = hashlib.sha256()
    for k in sorted(got):
        h.update(got[k].tobytes())
        if want is not None:
            res.equal(got[k], want[k], "%s %s" % (name, k))
    digests[name] = h.hexdigest()
    moved = all(not np.allclose(got[k], np.asarray(start[k], dtype=got[k].dtype)) for k in got)
    res.check(moved, "%s: training did not move every weight" % name)


def train(res: Results, net, trainer, dtype: str, step_fn, shards: int = 1,
          scale: float = 1.0) -> None:
    ctxs = list(net.collect_params().values())[0].list_ctx()
    for step in range(STEPS):
        x, y = data(RANK, step, dtype)
        xs = mx.gluon.utils.split_and_load(x, ctxs, even_split=False) if shards > 1 else [x]
        ys = mx.gluon.utils.split_and_load(y, ctxs, even_split=False) if shards > 1 else [y]
        with mx.autograd.record():
            losses = [loss_of(net, xi, yi) for xi, yi in zip(xs, ys)]
        for loss in losses:
            loss.backward()
        step_fn(trainer, batch_of(RANK, step))
        want = scale / mean_batch(step)
        res.check(trainer._optimizer.rescale_grad == want,
                  "step %d: rescale_grad %r, want %r" % (step, trainer._optimizer.rescale_grad,
                                                        want))
        if batch_of(0, step) == batch_of(1, step) and SIZE == 2:
            # equal batch sizes: exactly what one rank dividing by its own gives
            res.check(trainer._optimizer.rescale_grad == scale / batch_of(RANK, step),
                      "step %d: equal batch sizes changed rescale_grad" % step)


def plain_step(trainer, b) -> None:
    trainer.step(b)


def split_step(trainer, b) -> None:
    trainer.allreduce_grads()
    trainer.update(b)


def section_trainer(res: Results, dtype: str, step_fn=plain_step) -> None:
    net = mlp(dtype, mx.cpu(), initial(dtype) if RANK == 0 else None)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", OPT, kvstore="mpi_" + MODE)
    train(res, net, trainer, dtype, step_fn)
    record(res, "trainer_%s_%s" % (dtype, step_fn.__name__), weights(net), reference(dtype),
           initial(dtype))


def section_cast_after_trainer(res: Results) -> None:
    """net.cast('float64') after the Trainer was made (MXNet's own stores come at
    the first step, so this works there; float16 likewise, where MXNet has
    float16 layers): the keys take the new dtype. The start is exact in
    float32, so the reference starts from the same values."""
    start = {k: v.astype(np.float32).astype(np.float64) for k, v in initial("").items()}
    net = mlp("float32", mx.cpu(), start if RANK == 0 else None)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", OPT, kvstore="mpi_" + MODE)
    net.cast("float64")
    train(res, net, trainer, "float64", plain_step)
    record(res, "cast_after_trainer", weights(net), reference("float64", start=start), start)


def section_two_devices(res: Results) -> None:
    """Several devices per rank: their sum is reduced in the Trainer's plan."""
    ctxs = [mx.cpu(0), mx.cpu(1)]
    net = mlp("float32", ctxs, initial("float32") if RANK == 0 else None)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", OPT, kvstore="mpi_" + MODE)
    train(res, net, trainer, "float32", plain_step, shards=2)
    for p in net.collect_params().values():
        res.equal(p.list_data()[1], p.list_data()[0].asnumpy(), "device copies of " + p.name)
    record(res, "two_devices", weights(net), reference("float32", shards=2), initial("float32"))


def devices_of(rank: int) -> int:
    return 2 if rank == 0 else 1


def uneven_devices(step_fn):
    """Two devices on rank 0, one on the others: the same collectives on every
    rank (a rank with several devices reduces their sum in the same plan)."""
    def section(res: Results) -> None:
        ctxs = [mx.cpu(d) for d in range(devices_of(RANK))]
        net = mlp("float32", ctxs, initial("float32") if RANK == 0 else None)
        trainer = mx.gluon.Trainer(net.collect_params(), "sgd", OPT, kvstore="mpi_" + MODE)
        train(res, net, trainer, "float32", step_fn, shards=len(ctxs))
        for p in net.collect_params().values():
            res.equal(p.list_data()[-1], p.list_data()[0].asnumpy(), "device copies of " + p.name)
        record(res, "uneven_devices_" + step_fn.__name__, weights(net),
               reference("float32", shards=devices_of), initial("float32"))
    return section


def section_horovod_uneven_devices(res: Results) -> None:
    """mxnet_mpi.horovod with two devices on rank 0, one on the others:
    broadcast_parameters fills every device, DistributedTrainer reduces the
    sum over a rank's devices (Horovod reduces the first device's gradient
    only, and broadcasts into it only)."""
    import mxnet_mpi.horovod as hvd
    hvd.init()
    ctxs = [mx.cpu(d) for d in range(devices_of(RANK))]
    net = mlp("float32", ctxs, initial("float32") if RANK == 0 else None)
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", OPT)
    train(res, net, trainer, "float32", plain_step, shards=len(ctxs), scale=1.0 / SIZE)
    for p in net.collect_params().values():
        res.equal(p.list_data()[-1], p.list_data()[0].asnumpy(), "device copies of " + p.name)
    record(res, "horovod_uneven_devices", weights(net),
           reference("float32", shards=devices_of, scale=1.0 / SIZE), initial("float32"))


def section_average(res: Results) -> None:
    """kv.average (Horovod-style sums): averaged groups cannot carry the sum."""
    kv = mx.kv.create("mpi_" + MODE)
    kv.average = True
    net = mlp("float32", mx.cpu(), initial("float32") if RANK == 0 else None)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", OPT, kvstore=kv)
    train(res, net, trainer, "float32", plain_step)
    record(res, "average", weights(net), reference("float32", average=True),
           initial("float32"))


def section_fp16_compression(res: Results) -> None:
    """fp16 on the wire cannot carry the sum exactly: a collective of its own.
    No reference (the wire rounds the gradients); ranks must stay identical."""
    net = mlp("float32", mx.cpu(), initial("float32") if RANK == 0 else None)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", OPT, kvstore="mpi_" + MODE,
                               compression_params={"type": "fp16"})
    train(res, net, trainer, "float32", plain_step)
    record(res, "fp16_compression", weights(net), None, initial("float32"))


def section_horovod(res: Results) -> None:
    """mxnet_mpi.horovod.DistributedTrainer: its scale includes 1/size."""
    import mxnet_mpi.horovod as hvd
    hvd.init()
    net = mlp("float32", mx.cpu(), initial("float32") if RANK == 0 else None)
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", OPT)
    train(res, net, trainer, "float32", plain_step, scale=1.0 / SIZE)
    record(res, "horovod", weights(net), reference("float32", scale=1.0 / SIZE),
           initial("float32"))


# ---------------------------------------------------------------- Module
MODULE_BATCHES = {0: [8, 8, 8, 8], 1: [3, 3, 2, 3]}   # bound 8 / 3; one short batch
MODULE_OPT = {"learning_rate": 0.1, "momentum": 0.9}


def _symbol():
    data = mx.sym.Variable("data")
    net = mx.sym.FullyConnected(data, num_hidden=10, name="fc1")
    net = mx.sym.Activation(net, act_type="relu")
    net = mx.sym.FullyConnected(net, num_hidden=3, name="fc2")
    return mx.sym.LinearRegressionOutput(net, name="lro")


def _module_batch(rank: int, step: int):
    rng = np.random.RandomState(77 + 1000 * rank + step)
    b = MODULE_BATCHES[rank][step]
    return mx.io.DataBatch([mx.nd.array(rng.randn(b, 6))], [mx.nd.array(rng.randn(b, 3))])


def _module(rank: int, kvstore, args: dict | None):
    mod = mx.mod.Module(_symbol(), data_names=["data"], label_names=["lro_label"])
    b = MODULE_BATCHES[rank][0]
    mod.bind(data_shapes=[("data", (b, 6))], label_shapes=[("lro_label", (b, 3))])
    mod.init_params(initializer=mx.init.Constant(0.1 * (RANK + 1)), arg_params=args,
                    allow_missing=args is None, force_init=True)
    if kvstore is not None:
        mod.init_optimizer(kvstore=kvstore, optimizer="sgd", optimizer_params=MODULE_OPT)
    return mod


def section_module(res: Results) -> None:
    """Module: rescale_grad = 1 / (sum of the ranks' bound batch sizes), fixed
    at init_optimizer (as MXNet's 1 / (batch_size x workers)); a re-bound short
    batch keeps it."""
    rng = np.random.RandomState(3)
    args = {"fc1_weight": rng.randn(10, 6) * 0.5, "fc1_bias": rng.randn(10) * 0.1,
            "fc2_weight": rng.randn(3, 10) * 0.5, "fc2_bias": rng.randn(3) * 0.1}
    args = {k: mx.nd.array(v) for k, v in args.items()}
    total = sum(MODULE_BATCHES[r][0] for r in range(SIZE))
    mod = _module(RANK, "mpi_" + MODE, args if RANK == 0 else None)
    res.check(mod._optimizer.rescale_grad == 1.0 / total,
              "Module rescale_grad %r, want 1/%d" % (mod._optimizer.rescale_grad, total))
    for step in range(len(MODULE_BATCHES[0])):
        mod.forward_backward(_module_batch(RANK, step))
        mod.update()
    got = {k: v.asnumpy() for k, v in mod.get_params()[0].items()}
    # reference: per-rank gradients of modules without a store, summed, then
    # the update Module makes (its updater, one call per device)
    refs = [_module(r, None, args) for r in range(SIZE)]
    weights_ = {k: v.copy() for k, v in args.items()}
    updater = mx.optimizer.get_updater(mx.optimizer.create(
        "sgd", rescale_grad=1.0 / total, **MODULE_OPT))
    names = refs[0]._exec_group.param_names
    for step in range(len(MODULE_BATCHES[0])):
        grads = []
        for r, m in enumerate(refs):
            m.set_params(weights_, {}, force_init=True)
            m.forward_backward(_module_batch(r, step))
            grads.append([g[0].copy() for g in m._exec_group.grad_arrays])
        total_grads = [grads[0][i] + grads[1][i] for i in range(len(names))]
        updater(list(range(len(names))), total_grads, [weights_[n] for n in names])
    record(res, "module", got, {k: v.asnumpy() for k, v in weights_.items()},
           {k: v.asnumpy() for k, v in args.items()})


# ---------------------------------------------------------------- hybrid store
_hybrid = []


def hybrid_store():
    """The process's one dist_sync_mpi store (ps-lite: one worker per process)."""
    if not _hybrid:
        _hybrid.append(mx.kv.create("dist_sync_mpi"))
    return _hybrid[0]


def _hybrid_train(res: Results, name: str, ctxs: list) -> None:
    """Local updates on the hybrid store: the rule over the whole world."""
    net = mlp("float32", ctxs, initial("float32") if RANK == 0 else None)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", OPT, kvstore=hybrid_store(),
                               update_on_kvstore=False)
    train(res, net, trainer, "float32", plain_step, shards=len(ctxs))
    res.check(trainer._update_on_kvstore is False, "update_on_kvstore was not kept False")
    for p in net.collect_params().values():
        for d in range(1, len(ctxs)):
            res.equal(p.list_data()[d], p.list_data()[0].asnumpy(), "device copies of " + p.name)
    record(res, name, weights(net), reference("float32", shards=len(ctxs)), initial("float32"))


def section_hybrid_trainer(res: Results) -> None:
    _hybrid_train(res, "hybrid_trainer", [mx.cpu()])


def section_hybrid_two_devices(res: Results) -> None:
    _hybrid_train(res, "hybrid_two_devices", [mx.cpu(0), mx.cpu(1)])


def section_hybrid_nightly(res: Results) -> None:
    """MXNet's nightly dist_device_sync_kvstore.py pattern: str keys on the
    store (init, then pull), then a Trainer (int keys) with two devices and
    update_on_kvstore=False on the same store."""
    kv = hybrid_store()
    for shape in ((2, 3), (1200, 1200)):
        keys = ["%d_%d" % (shape[0], i) for i in range(3)]
        for i, key in enumerate(keys):
            kv.init(key, [mx.nd.ones(shape) * i])
            out = mx.nd.zeros(shape)
            kv.pull(key, out=out)
            res.equal(out, np.full(shape, i, dtype=np.float32), "pull of str key " + key)
    _hybrid_train(res, "hybrid_nightly", [mx.cpu(0), mx.cpu(1)])
    # str keys still work beside the int ones
    out = mx.nd.zeros((2, 3))
    kv.pull("2_1", out=out)
    res.equal(out, np.full((2, 3), 1, dtype=np.float32), "pull of str key 2_1 after training")


def section_hybrid_optimizer(res: Results) -> None:
    """The nightly's Trainer type check (update_on_kvstore True, then None):
    the optimizer goes to the servers; but keys 0 to 3 hold what the earlier
    sections' nets left there (local-update sums), which the servers would
    update as this net's weights (its own never reach them), so its step is
    refused, naming that; a later local-update Trainer on the same store is
    refused (the servers would return weights, not sums)."""
    kv = hybrid_store()
    for update_on_kv in (True, None):
        net = mlp("float32", [mx.cpu(0), mx.cpu(1)], initial("float32"))
        head = mx.gluon.nn.Dense(3, in_units=3)
        head.initialize(mx.init.Constant(0.5), ctx=[mx.cpu(0), mx.cpu(1)])
        net.add(head)
        trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                                   kvstore=kv, update_on_kvstore=update_on_kv)
        trainer._init_kvstore()
        res.check(trainer._kv_initialized and trainer._update_on_kvstore is True,
                  "update_on_kvstore=%r gave %r" % (update_on_kv, trainer._update_on_kvstore))
        x, y = data(RANK, 0, "float32")   # 8 samples on every rank
        xs = mx.gluon.utils.split_and_load(x, head.weight.list_ctx(), even_split=False)
        ys = mx.gluon.utils.split_and_load(y, head.weight.list_ctx(), even_split=False)
        with mx.autograd.record():
            losses = [loss_of(net, xi, yi) for xi, yi in zip(xs, ys)]
        for loss in losses:
            loss.backward()
        try:
            trainer.step(1)
            res.check(False, "the servers updated local-update sums as this net's weights")
        except mxnet_mpi.MPIKVStoreError as e:
            res.check("key 0 holds the weight of an earlier Trainer's parameter" in str(e)
                      and "update_on_kvstore=False" in str(e), str(e))
    net = mlp("float32", [mx.cpu()], initial("float32"))
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", OPT, kvstore=kv,
                               update_on_kvstore=False)
    x, y = data(RANK, 0, "float32")
    with mx.autograd.record():
        loss = loss_of(net, x, y)
    loss.backward()
    try:
        trainer.step(batch_of(RANK, 0))
        res.check(False, "a local-update Trainer ran on servers holding an optimizer")
    except mxnet_mpi.MPIKVStoreError as e:
        res.check("already runs an optimizer on its servers" in str(e), str(e))


SECTION_FNS = {
    "trainer": lambda res: section_trainer(res, "float32"),
    "trainer_float64": lambda res: section_trainer(res, "float64"),
    "split": lambda res: section_trainer(res, "float32", split_step),
    "cast_after_trainer": section_cast_after_trainer,
    "two_devices": section_two_devices,
    "uneven_devices": uneven_devices(plain_step),
    "uneven_devices_split": uneven_devices(split_step),
    "horovod_uneven_devices": section_horovod_uneven_devices,
    "average": section_average,
    "fp16_compression": section_fp16_compression,
    "horovod": section_horovod,
    "module": section_module,
    "hybrid_trainer": section_hybrid_trainer,
    "hybrid_two_devices": section_hybrid_two_devices,
    "hybrid_nightly": section_hybrid_nightly,
    "hybrid_optimizer": section_hybrid_optimizer,
}

res = Results(OUTDIR, RANK)
for name in SECTIONS:
    res.run(name, SECTION_FNS[name])
res.write(digests=digests)

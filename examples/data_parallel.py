"""The data-parallel harness the example trainers share.

Ranks, devices, the kvstore, cross-rank sums, and `fit`: the training loop
with learning-rate schedule, progress bar, validation over all ranks,
checkpoints and the machine-readable result lines.

`setup(kvstore, mode, devices)` returns a `Dist` for any of

  mpi, mpi_chained, mpi_funneled, mpi_concurrent   our stores, under mpirun
  dist_sync, dist_device_sync                      MXNet's ps-lite (DMLC_* env,
                                                   not under mpirun)
  horovod                                          Horovod's DistributedTrainer,
                                                   under mpirun
  device, local, none                              no communication between
                                                   processes: under mpirun each
                                                   rank trains alone (a control)

Gradient semantics. Our stores and dist_sync *sum* gradients over ranks;
Horovod's DistributedTrainer averages them. `Dist.step_batch(b)` is what to
pass to `trainer.step` so that every store applies the gradient averaged
over the global batch; the learning rate is then scaled linearly with the
global batch (Goyal et al., "Accurate, Large Minibatch SGD", 2017).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from tqdm import tqdm

OUR_STORES = ("mpi", "mpi_chained", "mpi_funneled", "mpi_concurrent")
# integer keys for the reductions, far above Trainer's 0..n-1 and below the
# hybrid stores' limit for int keys on their servers (1 << 17)
KEY_BASE = 1 << 16
IMAGENET_TRAIN_IMAGES = 1281167


def _count(low: int):
    """An argparse type: an integer >= `low`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError("not an integer: %r" % text) from None
        if value < low:
            raise argparse.ArgumentTypeError("must be >= %d, got %d" % (low, value))
        return value
    return parse


def _epochs(text: str) -> str:
    """An argparse type: comma-separated epoch numbers (kept as text)."""
    try:
        [float(e) for e in text.split(",") if e.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("comma-separated numbers, got %r" % text) from None
    return text


def add_store_args(ap) -> None:
    """The command-line options every example shares."""
    ap.add_argument("--kvstore", default="mpi",
                    help="mpi, mpi_chained, mpi_funneled, mpi_concurrent, dist_sync, "
                         "horovod, device, local or none")
    ap.add_argument("--mode", choices=("chained", "funneled", "concurrent"),
                    help="mode of kvstore 'mpi' (sets MXNET_MPI_MODE)")
    ap.add_argument("--devices", type=_count(1), default=1,
                    help="devices per rank: GPUs local_rank*N .. +N-1 when GPUs exist, "
                         "else N CPU contexts")


class Reducer:
    """In-place sums over ranks of small host arrays (counts, BN statistics).

    Uses the training store itself where it can (ours, dist_*), Horovod's
    allreduce for horovod, and an mpi_chained store over the MPI world for
    stores that do not communicate (device/local/none), so metrics still
    cover every rank's shard."""

    def __init__(self, kind: str, kv=None) -> None:
        self.kind, self.kv = kind, kv
        self._keys: dict = {}

    def sum_(self, name: str, arr: mx.nd.NDArray) -> mx.nd.NDArray:
        return self.sum_many([(name, arr)])[0]

    def sum_many(self, items: list) -> list:
        """Sum each (name, array) of `items` over ranks, in place; one call for
        all, so MXNet's stores initialise the new keys with a single barrier."""
        arrays = [a for _, a in items]
        if self.kind == "horovod":
            import horovod.mxnet as hvd
            for name, arr in items:
                hvd.allreduce_(arr, name="reduce_" + name, op=hvd.Sum)
            return arrays
        new = [(n, a) for n, a in items if n not in self._keys]
        for n, _ in new:
            self._keys[n] = KEY_BASE + len(self._keys)
        if new:   # MXNet's stores need init before pushpull; ours accept it
            self.kv.init([self._keys[n] for n, _ in new],
                         [mx.nd.zeros(a.shape, ctx=a.context, dtype=a.dtype) for _, a in new])
        self.kv.pushpull([self._keys[n] for n, _ in items], arrays, out=arrays)
        return arrays

    def sum_numpy(self, name: str, values) -> np.ndarray:
        arr = mx.nd.array(np.asarray(values, dtype=np.float64), dtype="float64")
        return self.sum_(name, arr).asnumpy()

    def gather_ints(self, name: str, value: int, rank: int, size: int) -> list:
        """Every rank's `value`, via a sum of one-hot vectors (no gather needed)."""
        v = np.zeros(size)
        v[rank] = value
        return [int(round(x)) for x in self.sum_numpy(name, v)]


@dataclass
class Dist:
    kvstore: str            # the name asked for
    rank: int
    size: int               # processes in the job
    comm_size: int          # processes whose gradients are combined (1 for device/none)
    local_rank: int
    contexts: list
    trainer_kv: object      # what to give gluon.Trainer (object, string or None)
    reducer: Reducer
    horovod: bool = False
    info: dict = field(default_factory=dict)

    def make_trainer(self, net, optimizer: str, opt_params: dict) -> gluon.Trainer:
        """A Trainer of the trained parameters of `net` over this store. The
        BatchNorm statistics are left out (no gradient, nothing to reduce per
        step; `sync_aux` averages them when it matters)."""
        named = {n: p for n, p in sorted(net.collect_params().items()) if p.grad_req != "null"}
        if self.horovod:
            import horovod.mxnet as hvd
            hvd.broadcast_parameters(net.collect_params(), root_rank=0)
            return hvd.DistributedTrainer(named, optimizer, opt_params)
        params = list(named.values())
        # update_on_kvstore=False: every store then sums gradients and each rank
        # runs the same update locally, so the store also serves our reductions
        # (on dist_sync, an optimizer on the servers would treat them as gradients).
        if not self.kvstore.startswith("dist"):
            return gluon.Trainer(params, optimizer, opt_params, kvstore=self.trainer_kv)
        trainer = gluon.Trainer(params, optimizer, opt_params, kvstore=self.trainer_kv,
                                update_on_kvstore=False)
        # MXNet 1.9.1's dist kvstore points its send buffer for a key at whatever
        # CPU array was last pushed, so ops of one key on different arrays carry
        # no engine dependency: the first step's pushpull of a gradient can reach
        # the server before the Trainer's initial broadcast (init + pull of the
        # weight) is answered, and the pull then returns the gradient sum. Do
        # that broadcast now and wait for it (Trainer would do it in step 1).
        trainer._init_kvstore()
        trainer._init_params()
        mx.nd.waitall()
        return trainer

    def step_batch(self, per_rank_batch: int) -> int:
        """Batch size for trainer.step: the gradient is averaged over the global batch."""
        return per_rank_batch if self.horovod else per_rank_batch * self.comm_size

    def broadcast_params(self, net) -> None:
        """Rank 0's parameter values on every rank, as a sum of rank 0's values
        and zeros (exact). For MXNet's dist_* stores: their Trainer broadcasts
        only at the first step, after the first gradient was computed on each
        rank's own initial weights. (Our stores broadcast at Trainer
        construction; Horovod has broadcast_parameters.)"""
        items = []
        for i, (_, param) in enumerate(sorted(net.collect_params().items())):
            buf = param.data(self.contexts[0]).copyto(mx.cpu())
            if self.rank != 0:
                buf[:] = 0
            items.append(("init%d" % i, buf))
        self.reducer.sum_many(items)
        for (_, param), (_, buf) in zip(sorted(net.collect_params().items()), items):
            param.set_data(buf)

    def sync_aux(self, net) -> None:
        """Average the non-trained parameters (BatchNorm running statistics) over
        devices and ranks, so that validation and checkpoints use the same model
        on every rank."""
        n = len(self.contexts) * self.comm_size
        aux = [(i, param) for i, (_, param) in enumerate(sorted(net.collect_params().items()))
               if param.grad_req == "null"]
        items = []
        for i, param in aux:
            arrays = param.list_data()
            total = mx.nd.add_n(*[a.as_in_context(mx.cpu()) for a in arrays]) \
                if len(arrays) > 1 else arrays[0].copyto(mx.cpu())
            items.append(("aux%d" % i, total))
        if self.comm_size > 1 and items:
            self.reducer.sum_many(items)
        for (_, param), (_, total) in zip(aux, items):
            param.set_data(total / n)

    def checksum(self, net) -> float:
        return float(sum(p.data(self.contexts[0]).asnumpy().astype(np.float64).sum()
                         for p in net.collect_params().values()))


def _contexts(local_rank: int, devices: int) -> list:
    if mx.context.num_gpus() > 0:
        first = local_rank * devices
        if first + devices > mx.context.num_gpus():
            raise SystemExit("local rank %d wants GPUs %d..%d but this host has %d"
                             % (local_rank, first, first + devices - 1, mx.context.num_gpus()))
        return [mx.gpu(first + i) for i in range(devices)]
    return [mx.cpu(i) for i in range(devices)]


def setup(kvstore: str, mode: str | None = None, devices: int = 1) -> Dist:
    """Ranks, devices, the training store and the reducer for `kvstore`."""
    name = kvstore = kvstore.lower()   # Dist tests it too (DIST_SYNC skipped its set-up)
    if mode is not None:
        if name != "mpi":
            raise SystemExit("--mode applies to --kvstore mpi only (got %r)" % kvstore)
        os.environ["MXNET_MPI_MODE"] = mode
    if devices < 1:
        raise SystemExit("--devices must be >= 1")

    if name == "horovod":
        try:
            import horovod.mxnet as hvd  # optional: benchmarks/setup_horovod.sh
        except ImportError as exc:
            raise SystemExit("--kvstore horovod needs Horovod's MXNet binding (%s): build it "
                             "with benchmarks/setup_horovod.sh, or use --kvstore mpi" % exc
                             ) from None
        hvd.init()
        if devices != 1:
            raise SystemExit("horovod runs one device per process: use --devices 1")
        rank, size, local = hvd.rank(), hvd.size(), hvd.local_rank()
        return Dist(kvstore, rank, size, size, local, _contexts(local, 1), None,
                    Reducer("horovod"), horovod=True)

    import mxnet_mpi  # registers our stores (MPI itself starts lazily)

    if name.startswith("dist"):
        if "async" in name:
            raise SystemExit("%s is not supported here: its servers apply the updates, so "
                             "ranks do not hold the same weights; use dist_sync" % kvstore)
        kv = mx.kv.create(name)
        rank, size = kv.rank, kv.num_workers
        ngpu = mx.context.num_gpus()
        local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", rank % max(ngpu, 1)))
        return Dist(kvstore, rank, size, size, local, _contexts(local, devices), kv,
                    Reducer("kv", kv))
    if name in OUR_STORES:
        kv = mx.kv.create(name)
        local = mxnet_mpi.local_rank()
        return Dist(kvstore, kv.rank, kv.num_workers, kv.num_workers, local,
                    _contexts(local, devices), kv, Reducer("kv", kv),
                    info={"store_type": kv.type})
    if name in ("device", "local", "none"):
        rank, size, local = mxnet_mpi.rank(), mxnet_mpi.size(), mxnet_mpi.local_rank()
        reducer = Reducer("kv", mx.kv.create("mpi_chained"))
        return Dist(kvstore, rank, size, 1, local, _contexts(local, devices),
                    None if name == "none" else name, reducer)
    raise SystemExit("unknown --kvstore %r; choose one of %s, dist_sync, horovod, device, "
                     "local, none" % (kvstore, ", ".join(OUR_STORES)))


def shard_range(n: int, parts: int, index: int) -> tuple:
    """Items [lo, hi) of part `index` of `parts`: ceil(n/parts) each, the last
    part shorter (how ImageRecordIter splits an indexed .rec)."""
    step = (n + parts - 1) // parts
    return min(n, index * step), min(n, (index + 1) * step)


def agree_steps(dist: Dist, shard_size: int, batch: int) -> int:
    """Batches per epoch that every rank can feed: min over ranks of shard // batch.

    Ranks must run the same number of steps (each step is a collective), so a
    rank with a bigger shard may not run longer than the others."""
    counts = dist.reducer.gather_ints("shard_sizes", shard_size, dist.rank, dist.size) \
        if dist.size > 1 else [shard_size]
    return min(counts) // batch


def lr_at(step: int, base_lr: float, warmup_from: float, warmup_steps: int,
          total_steps: int, mode: str, decay_steps: list, decay: float) -> float:
    """Linear warm-up from `warmup_from` to `base_lr`, then step or cosine decay."""
    if step < warmup_steps:
        return warmup_from + (base_lr - warmup_from) * step / warmup_steps
    if mode == "cosine":
        span = max(1, total_steps - warmup_steps)
        return 0.5 * base_lr * (1 + np.cos(np.pi * min(1.0, (step - warmup_steps) / span)))
    return base_lr * decay ** sum(step >= s for s in decay_steps)


# ------------------------------------------------------------------ training
def add_train_args(ap, *, batch: int, lr: float, lr_batch: int, epochs: int,
                   warmup: float, decay_epochs: str, wd: float) -> None:
    """Optimisation, schedule, logging and checkpoint options (defaults per example)."""
    ap.add_argument("--batch-size", type=_count(1), default=batch,
                    help="per rank (all its devices)")
    ap.add_argument("--epochs", type=_count(1), default=epochs)
    ap.add_argument("--max-steps", type=_count(0), default=0,
                    help="stop after this many steps (0: no limit)")
    ap.add_argument("--lr", type=float, default=lr,
                    help="learning rate for a global batch of --lr-batch-size images, "
                         "scaled linearly to the real global batch")
    ap.add_argument("--lr-batch-size", type=_count(1), default=lr_batch)
    ap.add_argument("--warmup-epochs", type=float, default=warmup,
                    help="linear warm-up from the one-rank learning rate")
    ap.add_argument("--lr-mode", choices=("step", "cosine"), default="step")
    ap.add_argument("--lr-decay-epochs", type=_epochs, default=decay_epochs)
    ap.add_argument("--lr-decay", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--wd", type=float, default=wd)
    ap.add_argument("--no-wd", action="store_true", help="no weight decay on BN and biases")
    ap.add_argument("--label-smoothing", type=float, default=0.0, help="e.g. 0.1")
    ap.add_argument("--no-val", action="store_true")
    ap.add_argument("--no-hybridize", action="store_true")
    ap.add_argument("--syncbn", action="store_true",
                    help="BatchNorm over the global batch (mxnet_mpi.SyncBatchNorm; models "
                         "taking gluoncv's norm_layer, e.g. resnet*_v1b; runs imperatively)")
    ap.add_argument("--save-dir", help="rank 0 writes <model>-<epoch>.params/.states here")
    ap.add_argument("--save-every", type=int, default=1, help="epochs between checkpoints")
    ap.add_argument("--timing-skip", type=int, default=2,
                    help="first steps left out of the images/s in THROUGHPUT/RESULT "
                         "(graph building, warm caches)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true", help="no progress bar")


def build_net(model: str, classes: int, image_size: int, args, dist: Dist):
    """A gluoncv model_zoo network on the rank's devices, every parameter shaped."""
    from gluoncv.model_zoo import get_model

    mx.random.seed(args.seed + dist.rank)  # different per rank: rank 0's weights must win
    kwargs, refusal = {}, ()
    syncbn = getattr(args, "syncbn", False)
    if syncbn:
        if dist.kvstore.lower() not in OUR_STORES + ("dist_sync_mpi",):
            raise SystemExit("--syncbn needs an MPI store (--kvstore mpi, mpi_<mode> or "
                             "dist_sync_mpi), got %r" % dist.kvstore)
        import mxnet_mpi
        kwargs["norm_layer"] = mxnet_mpi.SyncBatchNorm
        refusal = mxnet_mpi.MPIKVStoreError
    try:
        net = get_model(model, classes=classes, pretrained=False, **kwargs)
    except TypeError as exc:
        if kwargs:
            raise SystemExit("--syncbn: model %r takes no norm_layer (%s); use a model that "
                             "does, e.g. resnet50_v1b" % (model, exc)) from None
        raise
    net.initialize(mx.init.MSRAPrelu(), ctx=dist.contexts)
    # Shapes of deferred-init parameters are known after one forward. Run it in
    # training mode: an inference forward lets oneDNN reorder conv weights in
    # place, and a collective on such a weight then hangs in mxnet_mpi 0.1.0.
    # With SyncBatchNorm on several devices every device must run it.
    dummies = [mx.nd.zeros((2, 3, image_size, image_size), ctx=c) for c in dist.contexts]
    try:
        with autograd.record():
            for d in dummies:
                net(d)
        mx.nd.waitall()
    except refusal as exc:   # e.g. SyncBatchNorm on several CPU contexts
        raise SystemExit("--syncbn: %s" % exc) from None
    if args.no_wd:
        for name, p in net.collect_params().items():
            if name.endswith(("_beta", "_gamma", "_bias")):
                p.wd_mult = 0.0
    if not args.no_hybridize and not syncbn:
        net.hybridize(static_alloc=True, static_shape=True)
    if dist.kvstore.startswith("dist"):
        dist.broadcast_params(net)
    return net


def endless(iterable):
    """Batches forever, across epoch boundaries: a rank whose shard runs out
    before the agreed number of steps starts it again (reset, reshuffled), so it
    never leaves its peers waiting; records left over at an epoch's end come
    first in the next."""
    while True:
        got = False
        for batch in iterable:
            got = True
            yield batch
        if not got:
            raise SystemExit("empty training shard")
        iterable.reset()


def evaluate(net, make_val, dist: Dist, classes: int) -> dict:
    """Top-1/top-5 over all ranks' validation shards: every rank counts on its
    own shard (`make_val()` gives a fresh iterable of DataBatch, padding in
    `.pad`), and the counts are summed over ranks."""
    k = min(5, classes)
    counts = np.zeros(3)   # correct@1, correct@k, images
    for batch in make_val():
        n = batch.data[0].shape[0] - batch.pad
        if n <= 0:
            continue
        data = batch.data[0][:n].as_in_context(dist.contexts[0])
        label = batch.label[0][:n].asnumpy().astype(np.int64)
        top = mx.nd.topk(net(data), k=k, axis=1).asnumpy().astype(np.int64)
        counts[0] += (top[:, 0] == label).sum()
        counts[1] += (top == label[:, None]).any(axis=1).sum()
        counts[2] += n
    if dist.size > 1:
        counts = dist.reducer.sum_numpy("val_counts", counts)
    total = max(counts[2], 1)
    return {"top1": counts[0] / total, "top%d" % k: counts[1] / total,
            "correct1": int(counts[0]), "correct%d" % k: int(counts[1]),
            "val_images": int(counts[2])}


def fit(args, dist: Dist, net, train, shard_size: int, make_val, classes: int,
        name: str, describe: str = "", projection: tuple = ("ImageNet-1K",
                                                            IMAGENET_TRAIN_IMAGES)) -> dict:
    """Train `net` data-parallel on this rank's shard `train` (an iterable of
    DataBatch with reset()), validate after every epoch, and print the result.
    `projection`: (name, images) of the full dataset whose epoch time is
    projected from the measured images/s.

    Returns the RESULT dict (on every rank; rank 0 prints it)."""
    rank0 = dist.rank == 0
    log = logging.getLogger(name)
    log.setLevel(logging.INFO if rank0 else logging.WARNING)
    steps_per_epoch = agree_steps(dist, shard_size, args.batch_size)
    if steps_per_epoch < 1:
        raise SystemExit("the smallest training shard is smaller than one batch (%d); "
                         "use a smaller --batch-size" % args.batch_size)
    schedule_steps = total_steps = steps_per_epoch * args.epochs
    if args.max_steps:   # only cuts the run short; the schedule stays that of --epochs
        total_steps = min(total_steps, args.max_steps)

    global_batch = args.batch_size * dist.comm_size
    base_lr = args.lr * global_batch / args.lr_batch_size
    warmup_from = args.lr * args.batch_size / args.lr_batch_size   # what one rank would use
    warmup_steps = int(args.warmup_epochs * steps_per_epoch)
    decay_steps = [int(float(e) * steps_per_epoch) for e in args.lr_decay_epochs.split(",")
                   if e.strip()]
    trainer = dist.make_trainer(net, "sgd", {
        "learning_rate": warmup_from if warmup_steps else base_lr,
        "momentum": args.momentum, "wd": args.wd})
    eps = args.label_smoothing
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=eps <= 0)
    step_batch = dist.step_batch(args.batch_size)
    images_per_step = args.batch_size * dist.size

    log.info("%s: kvstore=%s%s, %d rank(s) x %d %s device(s), batch %d/rank (global %d), "
             "lr %.4g (warm-up %d steps from %.4g), %d steps/epoch%s",
             args.model, args.kvstore, " (%s)" % dist.info["store_type"]
             if "store_type" in dist.info else "", dist.size, len(dist.contexts),
             dist.contexts[0].device_type, args.batch_size, global_batch, base_lr,
             warmup_steps, warmup_from, steps_per_epoch, describe)

    step, history = 0, []
    batches = endless(train)
    timed_s, timed_steps = 0.0, 0   # steady state: the steps after --timing-skip
    t_train = time.perf_counter()
    for epoch in range(args.epochs):
        if step >= total_steps:
            break
        n_steps = min(steps_per_epoch, total_steps - step)
        loss_sum = mx.nd.zeros((1,), ctx=dist.contexts[0])
        bar = tqdm(total=n_steps, desc="epoch %d" % epoch, unit="step", file=sys.stderr,
                   disable=not rank0 or args.quiet, dynamic_ncols=True)
        t_epoch = time.perf_counter()
        timed_from = t_epoch if step >= args.timing_skip else None
        prev = None
        for _ in range(n_steps):
            batch = next(batches)
            trainer.set_learning_rate(lr_at(step, base_lr, warmup_from, warmup_steps,
                                             schedule_steps, args.lr_mode, decay_steps,
                                             args.lr_decay))
            data = gluon.utils.split_and_load(batch.data[0], dist.contexts, even_split=True)
            label = gluon.utils.split_and_load(batch.label[0], dist.contexts, even_split=True)
            if eps > 0:
                label = [mx.nd.one_hot(y, classes, on_value=1 - eps + eps / classes,
                                       off_value=eps / classes) for y in label]
            with autograd.record():
                losses = [loss_fn(net(x), y) for x, y in zip(data, label)]
            autograd.backward(losses)
            trainer.step(step_batch)
            cur = mx.nd.add_n(*[lo.sum().as_in_context(dist.contexts[0]) for lo in losses])
            loss_sum += cur
            if prev is not None:   # waiting for the previous step keeps one step in flight
                elapsed = time.perf_counter() - t_epoch
                bar.set_postfix(loss="%.3f" % (prev.asscalar() / args.batch_size),
                                lr="%.3g" % trainer.learning_rate,
                                img_s="%.1f" % (bar.n * images_per_step / max(elapsed, 1e-9)))
            prev = cur
            bar.update(1)
            step += 1
            if timed_from is not None:
                timed_steps += 1
            elif step == args.timing_skip:
                mx.nd.waitall()
                timed_from = time.perf_counter()
        mx.nd.waitall()
        bar.close()
        t_end = time.perf_counter()
        if timed_from is not None:
            timed_s += t_end - timed_from
        epoch_time = t_end - t_epoch
        throughput = n_steps * images_per_step / epoch_time
        train_loss = loss_sum.asscalar() / (n_steps * args.batch_size)
        dist.sync_aux(net)
        rec = {"epoch": epoch, "steps": n_steps, "time_s": epoch_time,
               "images_per_sec": throughput, "train_loss_rank0": train_loss,
               "lr": trainer.learning_rate}
        if make_val is not None and not args.no_val:
            rec.update(evaluate(net, make_val, dist, classes))
        history.append(rec)
        k = min(5, classes)
        log.info("epoch %d: %d steps in %.2fs, %.1f images/s (all ranks), train loss %.4f%s%s",
                 epoch, n_steps, epoch_time, throughput, train_loss,
                 ", val top-1 %.4f top-%d %.4f on %d images"
                 % (rec["top1"], k, rec["top%d" % k], rec["val_images"])
                 if "top1" in rec else "",
                 "" if n_steps == steps_per_epoch else " (stopped by --max-steps)")
        if args.save_dir and rank0 and ((epoch + 1) % args.save_every == 0
                                        or step >= total_steps or epoch + 1 == args.epochs):
            os.makedirs(args.save_dir, exist_ok=True)
            prefix = os.path.join(args.save_dir, "%s-%04d" % (args.model, epoch))
            net.save_parameters(prefix + ".params")
            trainer.save_states(prefix + ".states")
            log.info("saved %s.params and %s.states", prefix, prefix)
    mx.nd.waitall()
    wall = time.perf_counter() - t_train
    if timed_steps > 0:
        steady, how = timed_steps * images_per_step / timed_s, \
            "%d steps timed after the first %d" % (timed_steps, args.timing_skip)
    else:
        steady, how = step * images_per_step / wall, "all %d steps timed" % step
    result = {"model": args.model, "kvstore": args.kvstore,
              "store_type": dist.info.get("store_type", args.kvstore), "ranks": dist.size,
              "devices_per_rank": len(dist.contexts), "batch_per_rank": args.batch_size,
              "steps": step, "steps_per_epoch": steps_per_epoch, "images_per_sec": steady,
              "timed_steps": timed_steps, "wall_s": wall,
              "projected_epoch_dataset": projection[0],
              "projected_epoch_images": projection[1],
              "projected_epoch_s": projection[1] / steady, "epochs": history}
    if rank0:
        print("THROUGHPUT %.2f images/s over %d rank(s) (%s); projected time of one "
              "%s epoch (%d images) at this rate: %.1f min"
              % (steady, dist.size, how, projection[0], projection[1],
                 projection[1] / steady / 60), flush=True)
        print("RESULT " + json.dumps(result), flush=True)
    print("FINAL_WEIGHTS_CHECKSUM %d %r" % (dist.rank, dist.checksum(net)), flush=True)
    return result

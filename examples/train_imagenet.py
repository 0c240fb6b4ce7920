"""Data-parallel ImageNet training of a gluoncv model_zoo network under mpirun.

    mpirun -np 4 python examples/train_imagenet.py --rec-train train.rec \
        --rec-val val.rec --model resnet50_v1b --batch-size 64 --epochs 90
    mpirun -np 2 python examples/train_imagenet.py --synthetic --model resnet18_v1 \
        --image-size 64 --max-steps 20                      # no data needed

Every rank reads its own shard of the RecordIO files (`.idx` beside each
`.rec`; `mx.io.ImageRecordIter` with num_parts=ranks, part_index=rank), or
generates a synthetic batch (--synthetic). One GPU per rank, chosen by local
rank, when GPUs exist (`--devices N`: N per rank); CPU otherwise.

Optimisation: momentum SGD on the gradient averaged over the global batch
(ranks x --batch-size); the learning rate --lr is for a global batch of
--lr-batch-size images and is scaled linearly to the real global batch, after
a linear warm-up from the one-rank rate over --warmup-epochs; then step
(--lr-decay-epochs) or cosine decay. Optional --label-smoothing.

All ranks run the same number of steps per epoch: the minimum over ranks of
shard size // batch, agreed through the kvstore. At each epoch end the
BatchNorm statistics are averaged over ranks and the model is validated on
every rank's shard of the validation set; correct and total counts are summed
over ranks, so top-1/top-5 cover the whole set. Rank 0 shows a progress bar,
logs epoch time, images/s and accuracy, and saves checkpoints (--save-dir).

Machine-readable lines at the end: rank 0 prints `RESULT {json}`; every rank
prints `FINAL_WEIGHTS_CHECKSUM <rank> <sum of all parameters>`; ranks that
trained together print the same number.
"""

from __future__ import annotations

import argparse
import logging
import math
import os

import mxnet as mx
import numpy as np
from data_parallel import (
    IMAGENET_TRAIN_IMAGES,
    Dist,
    add_store_args,
    add_train_args,
    build_net,
    fit,
    setup,
    shard_range,
)

MEAN_RGB = (123.68, 116.779, 103.939)
STD_RGB = (58.393, 57.12, 57.375)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_store_args(ap)
    ap.add_argument("--model", default="resnet50_v1b", help="any gluoncv.model_zoo name")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--rec-train", help="train .rec (with .idx beside it)")
    ap.add_argument("--rec-val", help="val .rec (with .idx beside it)")
    ap.add_argument("--data-threads", type=int, default=0,
                    help="decoding threads per rank (0: cores / ranks)")
    ap.add_argument("--synthetic", action="store_true", help="random data, no files")
    ap.add_argument("--synthetic-train-images", type=int, default=IMAGENET_TRAIN_IMAGES,
                    help="epoch size with --synthetic")
    ap.add_argument("--synthetic-val-images", type=int, default=1000)
    add_train_args(ap, batch=32, lr=0.1, lr_batch=256, epochs=90, warmup=5.0,
                   decay_epochs="30,60,80", wd=1e-4)
    args = ap.parse_args()
    if not args.synthetic and not args.rec_train:
        ap.error("give --rec-train (and --rec-val) or --synthetic")
    if args.batch_size % args.devices:
        ap.error("--batch-size must be a multiple of --devices")
    return args


def count_records(rec: str) -> int:
    idx = os.path.splitext(rec)[0] + ".idx"
    if not os.path.exists(idx):
        raise SystemExit("%s needs its index %s (im2rec.py / make_imagenet_rec.py write it)"
                         % (rec, idx))
    with open(idx) as f:
        return sum(1 for line in f if line.strip())


def record_iter(rec: str, args, dist: Dist, train: bool) -> mx.io.DataIter:
    """This rank's shard of an indexed .rec: ImageRecordIter gives part i of n
    the records [i*ceil(N/n), (i+1)*ceil(N/n)) (see shard_range)."""
    s = args.image_size
    threads = args.data_threads or max(1, (os.cpu_count() or 1) // max(1, dist.size))
    common = dict(
        path_imgrec=rec, path_imgidx=os.path.splitext(rec)[0] + ".idx",
        data_shape=(3, s, s), batch_size=args.batch_size, num_parts=dist.size,
        part_index=dist.rank, preprocess_threads=threads, round_batch=True, verbose=False,
        mean_r=MEAN_RGB[0], mean_g=MEAN_RGB[1], mean_b=MEAN_RGB[2],
        std_r=STD_RGB[0], std_g=STD_RGB[1], std_b=STD_RGB[2])
    if train:
        return mx.io.ImageRecordIter(
            shuffle=True, seed=args.seed + dist.rank, seed_aug=args.seed + dist.rank,
            random_resized_crop=True, min_random_area=0.08, max_random_area=1.0,
            min_aspect_ratio=3.0 / 4, max_aspect_ratio=4.0 / 3, rand_mirror=True,
            brightness=0.4, contrast=0.4, saturation=0.4, pca_noise=0.1, **common)
    return mx.io.ImageRecordIter(shuffle=False, resize=int(math.ceil(s / 0.875)),
                                 rand_crop=False, **common)


class Synthetic:
    """One random batch per rank, served for `n_images` images (the last batch padded)."""

    def __init__(self, args, dist: Dist, n_images: int) -> None:
        rng = np.random.RandomState(args.seed + dist.rank)
        b, s = args.batch_size, args.image_size
        self.data = mx.nd.array(rng.randn(b, 3, s, s).astype(np.float32))
        self.label = mx.nd.array(rng.randint(0, args.classes, size=b).astype(np.float32))
        self.n_images, self.batch = n_images, b

    def __iter__(self):
        for lo in range(0, self.n_images, self.batch):
            pad = max(0, lo + self.batch - self.n_images)
            yield mx.io.DataBatch([self.data], [self.label], pad=pad)

    def reset(self) -> None:
        pass


def make_data(args, dist: Dist):
    """(train iterable, its shard size, validation factory or None).

    The validation iterator is made afresh for every evaluation: after reset(),
    ImageRecordIter with round_batch=True starts where the last padded batch
    wrapped to, and with round_batch=False it reports no padding, so neither
    visits each record exactly once on a second pass."""
    if args.synthetic:
        lo, hi = shard_range(args.synthetic_train_images, dist.size, dist.rank)
        vlo, vhi = shard_range(args.synthetic_val_images, dist.size, dist.rank)
        return Synthetic(args, dist, hi - lo), hi - lo, \
            (lambda: Synthetic(args, dist, vhi - vlo))
    lo, hi = shard_range(count_records(args.rec_train), dist.size, dist.rank)
    train = record_iter(args.rec_train, args, dist, train=True)
    val = None
    if args.rec_val:
        val = lambda: record_iter(args.rec_val, args, dist, train=False)  # noqa: E731
    return train, hi - lo, val


def main() -> None:
    args = parse()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    dist = setup(args.kvstore, args.mode, args.devices)
    train, shard, make_val = make_data(args, dist)
    net = build_net(args.model, args.classes, args.image_size, args, dist)
    fit(args, dist, net, train, shard, make_val, args.classes, "train_imagenet",
        ", %dx%d images from %s" % (args.image_size, args.image_size,
                                    "synthetic data" if args.synthetic else args.rec_train))


if __name__ == "__main__":
    main()

"""Data-parallel CIFAR-10 training of a gluoncv CIFAR ResNet under mpirun.

    mpirun -np 2 python examples/train_cifar10.py --data-dir data --epochs 200
    python examples/make_cifar10.py --out data      # a small generated stand-in

Reads the standard CIFAR-10 files under --data-dir: the python version
(cifar-10-batches-py/data_batch_1..5 and test_batch, pickled dicts with
b'data' uint8 (N, 3072) and b'labels'), or else the binary version
(cifar-10-batches-bin/data_batch_1.bin .. test_batch.bin). Every epoch the
training set is shuffled identically on all ranks and each rank takes its own
contiguous part of it; the test set is split the same way and accuracy is
summed over ranks. Standard augmentation (4-pixel zero padding, random 32x32
crop, horizontal flip) and per-channel normalisation.

Same kvstore, mode, device, schedule and output options as
train_imagenet.py (see `--help`); prints `RESULT {json}` (rank 0) and
`FINAL_WEIGHTS_CHECKSUM <rank> <sum>` (every rank) at the end.
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle

import mxnet as mx
import numpy as np
from data_parallel import Dist, add_store_args, add_train_args, build_net, fit, setup, shard_range

MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32).reshape(1, 3, 1, 1) * 255
STD = np.array([0.2023, 0.1994, 0.2010], dtype=np.float32).reshape(1, 3, 1, 1) * 255
TRAIN_FILES = ["data_batch_%d" % i for i in range(1, 6)]


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_store_args(ap)
    ap.add_argument("--data-dir", default="data",
                    help="holds cifar-10-batches-py/ (or cifar-10-batches-bin/)")
    ap.add_argument("--model", default="cifar_resnet20_v1", help="a gluoncv CIFAR model")
    add_train_args(ap, batch=128, lr=0.1, lr_batch=128, epochs=200, warmup=1.0,
                   decay_epochs="100,150", wd=1e-4)
    args = ap.parse_args()
    if args.batch_size % args.devices:
        ap.error("--batch-size must be a multiple of --devices")
    return args


# ----------------------------------------------------------------------- files
def _load_python(path: str) -> tuple:
    with open(path, "rb") as f:
        d = pickle.load(f, encoding="bytes")
    data = np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    return data, np.asarray(d[b"labels"], dtype=np.int64)


def _load_binary(path: str) -> tuple:
    raw = np.fromfile(path, dtype=np.uint8).reshape(-1, 3073)
    return raw[:, 1:].reshape(-1, 3, 32, 32), raw[:, 0].astype(np.int64)


def load_cifar10(data_dir: str) -> tuple:
    """((train images (N,3,32,32) uint8, labels), (test images, labels))."""
    py, binary = (os.path.join(data_dir, "cifar-10-batches-py"),
                  os.path.join(data_dir, "cifar-10-batches-bin"))
    if os.path.exists(os.path.join(py, "data_batch_1")):
        load, files = _load_python, [os.path.join(py, n) for n in TRAIN_FILES + ["test_batch"]]
    elif os.path.exists(os.path.join(binary, "data_batch_1.bin")):
        load, files = _load_binary, [os.path.join(binary, n + ".bin")
                                     for n in TRAIN_FILES + ["test_batch"]]
    else:
        raise SystemExit("no CIFAR-10 under %s: expected %s/data_batch_1 or "
                         "%s/data_batch_1.bin (examples/make_cifar10.py writes a small one)"
                         % (data_dir, py, binary))
    parts = [load(f) for f in files[:5]]
    train = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    return train, load(files[5])


def normalise(images: np.ndarray) -> mx.nd.NDArray:
    return mx.nd.array((images.astype(np.float32) - MEAN) / STD)


class TrainShard:
    """This rank's part of the training set; reshuffled (identically on every
    rank, so the parts stay disjoint) on each reset(). Full batches only."""

    def __init__(self, images, labels, dist: Dist, batch: int, seed: int) -> None:
        self.images, self.labels, self.dist, self.batch = images, labels, dist, batch
        self.seed, self.epoch = seed, 0
        self.lo, self.hi = shard_range(len(labels), dist.size, dist.rank)
        self.rng = np.random.RandomState(seed + 1000 + dist.rank)   # augmentation

    def __len__(self) -> int:
        return self.hi - self.lo

    def reset(self) -> None:
        self.epoch += 1

    def __iter__(self):
        order = np.random.RandomState(self.seed + self.epoch).permutation(len(self.labels))
        mine = order[self.lo:self.hi]
        for start in range(0, len(mine) - self.batch + 1, self.batch):
            idx = mine[start:start + self.batch]
            padded = np.pad(self.images[idx], ((0, 0), (0, 0), (4, 4), (4, 4)))
            ys, xs = self.rng.randint(0, 9, size=(2, len(idx)))
            flip = self.rng.rand(len(idx)) < 0.5
            out = np.empty((len(idx), 3, 32, 32), dtype=np.uint8)
            for i in range(len(idx)):
                crop = padded[i, :, ys[i]:ys[i] + 32, xs[i]:xs[i] + 32]
                out[i] = crop[:, :, ::-1] if flip[i] else crop
            yield mx.io.DataBatch([normalise(out)],
                                  [mx.nd.array(self.labels[idx].astype(np.float32))], pad=0)


def val_batches(images, labels, dist: Dist, batch: int):
    """This rank's contiguous part of the test set; the last batch zero-padded."""
    lo, hi = shard_range(len(labels), dist.size, dist.rank)
    for start in range(lo, hi, batch):
        stop = min(start + batch, hi)
        x = np.zeros((batch, 3, 32, 32), dtype=np.uint8)
        y = np.zeros(batch, dtype=np.float32)
        x[:stop - start], y[:stop - start] = images[start:stop], labels[start:stop]
        yield mx.io.DataBatch([normalise(x)], [mx.nd.array(y)], pad=batch - (stop - start))


def main() -> None:
    args = parse()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    dist = setup(args.kvstore, args.mode, args.devices)
    (x_train, y_train), (x_test, y_test) = load_cifar10(args.data_dir)
    train = TrainShard(x_train, y_train, dist, args.batch_size, args.seed)
    net = build_net(args.model, 10, 32, args, dist)
    fit(args, dist, net, train, len(train),
        lambda: val_batches(x_test, y_test, dist, args.batch_size), 10, "train_cifar10",
        ", CIFAR-10 from %s (%d train / %d test images)"
        % (args.data_dir, len(y_train), len(y_test)), projection=("CIFAR-10", 50000))


if __name__ == "__main__":
    main()

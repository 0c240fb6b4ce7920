"""Write a small generated dataset in CIFAR-10's exact file format (nothing downloaded).

    python examples/make_cifar10.py --out data --train-images 5000 --test-images 1000

Writes OUT/cifar-10-batches-py/ with data_batch_1 .. data_batch_5, test_batch
and batches.meta, the pickles of the official "CIFAR-10 python version": each
batch is a dict with b'batch_label', b'labels' (list of int), b'data' (uint8
array of shape (N, 3072): 1024 red, then 1024 green, then 1024 blue values,
row-major 32x32) and b'filenames'. With --binary it also writes
OUT/cifar-10-batches-bin/ (data_batch_1.bin .. test_batch.bin: records of one
label byte and 3072 pixel bytes, and batches.meta.txt). Images are the
class-dependent coloured shapes of make_imagenet_rec.py at 32x32, so a
network can learn them.
"""

from __future__ import annotations

import argparse
import os
import pickle

import cv2
import numpy as np
from make_imagenet_rec import draw

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
           "truck")


def make_images(n: int, rng: np.random.RandomState) -> tuple:
    """(uint8 (n, 3072) in CIFAR's channel-planar RGB layout, labels list)."""
    labels = np.arange(n) % len(CLASSES)
    rng.shuffle(labels)
    data = np.empty((n, 3072), dtype=np.uint8)
    for i, label in enumerate(labels):
        bgr = cv2.resize(draw(int(label), len(CLASSES), 32, rng), (32, 32),
                         interpolation=cv2.INTER_AREA)
        rgb = bgr[:, :, ::-1]
        data[i] = rgb.transpose(2, 0, 1).reshape(-1)   # R plane, G plane, B plane
    return data, [int(x) for x in labels]


def write_python(folder: str, name: str, batch_label: str, data, labels) -> None:
    with open(os.path.join(folder, name), "wb") as f:
        pickle.dump({b"batch_label": batch_label.encode(), b"labels": labels, b"data": data,
                     b"filenames": [b"gen_%s_%05d.png" % (name.encode(), i)
                                    for i in range(len(labels))]}, f, protocol=2)


def write_binary(folder: str, name: str, data, labels) -> None:
    records = np.concatenate([np.asarray(labels, dtype=np.uint8)[:, None], data], axis=1)
    records.tofile(os.path.join(folder, name + ".bin"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="data", help="parent of cifar-10-batches-py/")
    ap.add_argument("--train-images", type=int, default=5000,
                    help="split evenly over data_batch_1..5 (50000 in the real set)")
    ap.add_argument("--test-images", type=int, default=1000, help="10000 in the real set")
    ap.add_argument("--binary", action="store_true", help="also write cifar-10-batches-bin/")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.train_images < 5 or args.test_images < 1:
        ap.error("need at least 5 train images (5 batches) and 1 test image")

    rng = np.random.RandomState(args.seed)
    py_dir = os.path.join(args.out, "cifar-10-batches-py")
    bin_dir = os.path.join(args.out, "cifar-10-batches-bin")
    os.makedirs(py_dir, exist_ok=True)
    if args.binary:
        os.makedirs(bin_dir, exist_ok=True)
    sizes = [len(a) for a in np.array_split(np.arange(args.train_images), 5)]
    splits = [("data_batch_%d" % (i + 1), "training batch %d of 5" % (i + 1), n)
              for i, n in enumerate(sizes)] + [("test_batch", "testing batch 1 of 1",
                                                args.test_images)]
    for name, label, n in splits:
        data, labels = make_images(n, rng)
        write_python(py_dir, name, label, data, labels)
        if args.binary:
            write_binary(bin_dir, name, data, labels)
    with open(os.path.join(py_dir, "batches.meta"), "wb") as f:
        pickle.dump({"label_names": list(CLASSES), "num_cases_per_batch": sizes[0],
                     "num_vis": 3072}, f, protocol=2)
    if args.binary:
        with open(os.path.join(bin_dir, "batches.meta.txt"), "w") as f:
            f.write("\n".join(CLASSES) + "\n")
    print("wrote %d train images (5 batches of %s) and %d test images, 10 classes, to %s%s"
          % (args.train_images, "/".join(map(str, sizes)), args.test_images, py_dir,
             " and " + bin_dir if args.binary else ""), flush=True)


if __name__ == "__main__":
    main()

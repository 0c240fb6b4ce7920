"""Write a small generated image set in ImageNet's RecordIO layout (nothing downloaded).

    python examples/make_imagenet_rec.py --out data/imagenet-small \
        --train-images 1280 --val-images 256 --classes 10 --image-size 64

Writes OUT/train.rec + OUT/train.idx and OUT/val.rec + OUT/val.idx, the files
`im2rec.py` makes for ImageNet and that `mx.io.ImageRecordIter` and
`gluon.data.vision.ImageRecordDataset` read: every record is an
`mx.recordio.pack_img` JPEG with its class id as the (float) label, indexed by
`mx.recordio.MXIndexedRecordIO`. Images are learnable on purpose: class c has
its own hue and its own shape (disc, square, triangle, stripes, ring, cross),
drawn at a random place and scale on a noisy background of random size (so
the reader's resize/crop augmentations have work to do). Labels are
balanced (record i has class i % C before shuffling). Prints one summary line
per split and writes OUT/meta.txt (counts, classes, size).
"""

from __future__ import annotations

import argparse
import os

import cv2
import mxnet as mx
import numpy as np

SHAPES = ("disc", "square", "triangle", "stripes", "ring", "cross")


def class_style(label: int, classes: int) -> tuple:
    """(BGR colour, shape) of a class: hues spread round the colour wheel."""
    hue = int(180 * label / max(classes, 1)) % 180
    hsv = np.uint8([[[hue, 200 + 55 * (label % 2), 230]]])
    bgr = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0]
    return tuple(int(c) for c in bgr), SHAPES[label % len(SHAPES)]


def draw(label: int, classes: int, size: int, rng: np.random.RandomState) -> np.ndarray:
    """One HxWx3 uint8 BGR image of class `label`, about `size` pixels a side."""
    h = int(size * rng.uniform(1.0, 1.3))
    w = int(size * rng.uniform(1.0, 1.3))
    img = rng.randint(0, 90, size=(h, w, 3)).astype(np.uint8)       # dark noise
    colour, shape = class_style(label, classes)
    r = int(min(h, w) * rng.uniform(0.22, 0.38))
    cy, cx = int(rng.uniform(r, h - r)), int(rng.uniform(r, w - r))
    if shape == "disc":
        cv2.circle(img, (cx, cy), r, colour, -1)
    elif shape == "square":
        cv2.rectangle(img, (cx - r, cy - r), (cx + r, cy + r), colour, -1)
    elif shape == "triangle":
        pts = np.array([[cx, cy - r], [cx - r, cy + r], [cx + r, cy + r]], np.int32)
        cv2.fillPoly(img, [pts], colour)
    elif shape == "stripes":
        for k in range(-r, r, max(2, r // 3)):
            cv2.line(img, (cx + k, cy - r), (cx + k, cy + r), colour, max(1, r // 6))
    elif shape == "ring":
        cv2.circle(img, (cx, cy), r, colour, max(2, r // 3))
    else:  # cross
        t = max(2, r // 3)
        cv2.rectangle(img, (cx - r, cy - t), (cx + r, cy + t), colour, -1)
        cv2.rectangle(img, (cx - t, cy - r), (cx + t, cy + r), colour, -1)
    noise = rng.randint(-20, 21, size=img.shape)
    return np.clip(img.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def write_split(prefix: str, n: int, classes: int, size: int, quality: int,
                rng: np.random.RandomState) -> np.ndarray:
    """Write prefix.rec/.idx with n shuffled records; returns their labels."""
    labels = np.arange(n) % classes
    rng.shuffle(labels)
    rec = mx.recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    try:
        for i, label in enumerate(labels):
            header = mx.recordio.IRHeader(0, float(label), i, 0)
            img = draw(int(label), classes, size, rng)
            rec.write_idx(i, mx.recordio.pack_img(header, img, quality=quality,
                                                  img_fmt=".jpg"))
    finally:
        rec.close()
    return labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="data/imagenet-small", help="output directory")
    ap.add_argument("--train-images", type=int, default=1280)
    ap.add_argument("--val-images", type=int, default=256)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--image-size", type=int, default=64,
                    help="shorter side of the stored images is about this (up to 1.3x)")
    ap.add_argument("--quality", type=int, default=90, help="JPEG quality")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.classes < 1 or args.train_images < 1 or args.val_images < 1:
        ap.error("--classes, --train-images and --val-images must be >= 1")

    os.makedirs(args.out, exist_ok=True)
    rng = np.random.RandomState(args.seed)
    for split, n in (("train", args.train_images), ("val", args.val_images)):
        prefix = os.path.join(args.out, split)
        labels = write_split(prefix, n, args.classes, args.image_size, args.quality, rng)
        print("%s: %d images, %d classes (%d..%d per class), %.1f KB -> %s.rec / %s.idx"
              % (split, n, args.classes, np.bincount(labels, minlength=args.classes).min(),
                 np.bincount(labels, minlength=args.classes).max(),
                 os.path.getsize(prefix + ".rec") / 1024, prefix, prefix), flush=True)
    with open(os.path.join(args.out, "meta.txt"), "w") as f:
        f.write("train_images %d\nval_images %d\nclasses %d\nimage_size %d\n"
                % (args.train_images, args.val_images, args.classes, args.image_size))


if __name__ == "__main__":
    main()

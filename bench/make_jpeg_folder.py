#!/usr/bin/env python3
"""Writes an ImageFolder tree of JPEG files shaped like ImageNet's: sizes
around its typical 400x350 (widths 320..500, heights 240..400), quality 90,
photo-like content (smooth colour fields, edges and grain, so the files are
as big as photographs of that size: ~30-60 KB), deterministic from --seed.
Synthetic on purpose: the scale benchmark needs tens of thousands of files,
and what it measures is I/O and access, where content only sets the size.

Usage: make_jpeg_folder.py OUT --images N [--classes 100] [--seed 1]
"""
import argparse, os
import numpy as np
from PIL import Image

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--images", type=int, required=True)
p.add_argument("--classes", type=int, default=100)
p.add_argument("--seed", type=int, default=1)
a = p.parse_args()
if a.images < 1 or a.classes < 1:
    p.error("--images and --classes must be at least 1")

rng = np.random.default_rng(a.seed)
# A pool of textures to crop from: building each image from scratch is the slow part.
pool = []
for _ in range(16):
    h, w = 512, 640
    coarse = rng.integers(0, 256, size=(h // 32 + 2, w // 32 + 2, 3)).astype(np.uint8)
    field = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC), dtype=np.int16)
    grain = rng.normal(0, 10, size=(h, w, 3)).astype(np.int16)
    img = field + grain
    for _ in range(6):  # a few hard edges: rectangles of another colour
        y, x = rng.integers(0, h - 64), rng.integers(0, w - 64)
        img[y:y + rng.integers(32, 200), x:x + rng.integers(32, 200)] += rng.integers(-80, 80, size=3).astype(np.int16)
    pool.append(np.clip(img, 0, 255).astype(np.uint8))

for c in range(a.classes):
    os.makedirs(os.path.join(a.out, "class_%03d" % c), exist_ok=True)
for i in range(a.images):
    c = i % a.classes
    w, h = int(rng.integers(320, 501)), int(rng.integers(240, 401))
    src = pool[int(rng.integers(len(pool)))]
    y, x = int(rng.integers(0, src.shape[0] - h + 1)), int(rng.integers(0, src.shape[1] - w + 1))
    tile = src[y:y + h, x:x + w]
    if rng.integers(2):
        tile = tile[:, ::-1]
    Image.fromarray(np.ascontiguousarray(tile)).save(
        os.path.join(a.out, "class_%03d" % c, "img_%07d.jpg" % i), quality=90)

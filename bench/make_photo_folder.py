#!/usr/bin/env python3
"""Writes an ImageFolder tree of JPEG photographs shaped like ImageNet's, from
the real photographs Debian's python3-skimage and python3-sklearn ship
(astronaut, coffee, chelsea, rocket, china, flower, ...): each file is a
random window of one of them, scaled to a size like ImageNet's (sides
250..640, aspect 3:5..5:3), saved at quality 85..95, 4:2:0 (one in ten
4:4:4, as some cameras write). Deterministic from --seed.

With --by-photo, the class is the photograph a window was cut from (one
class per photograph, --classes ignored), so that a model can learn them.

Usage: make_photo_folder.py OUT --images N [--classes 10 | --by-photo] [--seed 1]
"""
import argparse, io, os, warnings
import numpy as np
from PIL import Image

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--images", type=int, required=True)
p.add_argument("--classes", type=int, default=10)
p.add_argument("--seed", type=int, default=1)
p.add_argument("--by-photo", action="store_true", help="one class per photograph")
a = p.parse_args()
if a.images < 1 or a.classes < 1:
    p.error("--images and --classes must be at least 1")


def photographs():
    """The colour photographs the two packages hold on disk (no download)."""
    out = []
    warnings.simplefilter("ignore")
    from skimage import data
    for name in ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "hubble_deep_field",
                 "retina", "colorwheel", "logo"):
        try:
            img = np.asarray(getattr(data, name)())
        except Exception:  # not shipped in this version, or needs a download
            continue
        if img.ndim == 3 and img.shape[2] >= 3 and min(img.shape[:2]) >= 256:
            out.append(Image.fromarray(img[:, :, :3].astype(np.uint8)))
    try:
        from sklearn.datasets import load_sample_image
        for name in ("china.jpg", "flower.jpg"):
            out.append(Image.fromarray(load_sample_image(name)))
    except Exception:
        pass
    if len(out) < 4:
        raise SystemExit("make_photo_folder.py: fewer than 4 photographs found; "
                         "install python3-skimage and python3-sklearn")
    return out


photos = photographs()
rng = np.random.default_rng(a.seed)
if a.by_photo:
    a.classes = len(photos)
for c in range(a.classes):
    os.makedirs(os.path.join(a.out, "class_%03d" % c), exist_ok=True)
for i in range(a.images):
    src = photos[i % len(photos)]
    W, H = src.size
    # The output's size: ImageNet's sides are mostly 250..640.
    aspect = float(np.exp(rng.uniform(np.log(3 / 5), np.log(5 / 3))))
    longer = int(rng.integers(320, 641))
    w, h = (longer, max(250, int(longer / aspect))) if aspect >= 1 else (max(250, int(longer * aspect)), longer)
    # A window of the photograph with that aspect, 40..100% of what fits.
    fit = min(W / w, H / h)
    f = fit * float(rng.uniform(0.4, 1.0))
    cw, ch = max(1, int(w * f)), max(1, int(h * f))
    x, y = int(rng.integers(0, W - cw + 1)), int(rng.integers(0, H - ch + 1))
    img = src.crop((x, y, x + cw, y + ch)).resize((w, h), Image.LANCZOS)
    quality = int(rng.integers(85, 96))
    subsampling = 0 if rng.random() < 0.1 else 2  # 4:4:4 or 4:2:0
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality, subsampling=subsampling)
    c = i % len(photos) if a.by_photo else i % a.classes
    with open(os.path.join(a.out, "class_%03d" % c, "img_%07d.jpg" % i), "wb") as fh:
        fh.write(buf.getvalue())

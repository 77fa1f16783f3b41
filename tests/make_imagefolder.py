"""Writes an ImageFolder of small images in many PNG and JPEG kinds with Pillow.

Usage: make_imagefolder.py ROOT
"""
import io, os, sys
import numpy as np
from PIL import Image

root = sys.argv[1]
rng = np.random.default_rng(1)


def rgb(w=23, h=17):
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x * y) % 256], -1)
    return (a + rng.integers(0, 30, a.shape)).clip(0, 255).astype(np.uint8)


def save(cls, name, im, **kw):
    d = os.path.join(root, cls)
    os.makedirs(d, exist_ok=True)
    im.save(os.path.join(d, name), **kw)


base = Image.fromarray(rgb())
# class_a: PNG colour types and depths
save("class_a", "rgb.png", base)
save("class_a", "rgba.png", base.convert("RGBA"))
save("class_a", "gray.png", base.convert("L"))
save("class_a", "gray_alpha.png", base.convert("LA"))
save("class_a", "bilevel.png", base.convert("1"))
save("class_a", "palette.png", base.convert("P", palette=Image.ADAPTIVE, colors=50))
p = base.convert("P", palette=Image.ADAPTIVE, colors=16)
save("class_a", "palette_trns.png", p, transparency=3)
save("class_a", "palette_4bit.png", base.convert("P", palette=Image.ADAPTIVE, colors=12), bits=4)
g16 = Image.fromarray((np.asarray(base.convert("L")).astype(np.uint16) * 3 - 100).clip(0, 65535).astype(np.uint16))
save("class_a", "gray16.png", g16)
save("class_a", "interlaced_is_not_writable_by_pil.png", base.convert("RGB"), optimize=True)
# class_b: JPEG kinds
save("class_b", "q90_420.jpg", base, quality=90)
save("class_b", "q95_444.JPG", base, quality=95, subsampling=0)
save("class_b", "q85_422.jpeg", base, quality=85, subsampling=1)
save("class_b", "progressive.jpg", base, quality=90, progressive=True)
save("class_b", "gray.jpg", base.convert("L"), quality=90)
save("class_b", "cmyk.jpg", base.convert("CMYK"), quality=95)
# class_c: nested directories and a non-image file (ignored by both)
save("class_c", "top.png", base.transpose(Image.FLIP_LEFT_RIGHT))
save("class_c/sub", "inner.png", base.rotate(90, expand=True))
save("class_c/sub/deeper", "deep.jpg", base.rotate(180))
with open(os.path.join(root, "class_c", "notes.txt"), "w") as f:
    f.write("not a sample\n")

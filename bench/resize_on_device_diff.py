"""How far `trainer --resize-on device` pixels are from the loader's resize.

The loader resizes with Pillow's bilinear filter (exactly; tests check it)
and rounds to uint8; --resize-on device sends the 32x32 source through the
ring and resizes the float tensor with LibTorch's bilinear interpolation
(align_corners=False, no antialias: upsampling needs none). This script
takes N training images of a shard set, writes the loader's resized images
with `loader preview --image-size S`, resizes the sources (`--image-size 32`)
with torch.nn.functional.interpolate as the trainer does, and prints the
differences on the 0..255 scale.

  python3 bench/resize_on_device_diff.py build/bin/loader SHARD_SET [N] [SIZES...]
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image


def preview(loader, data, size, indices, out):
    subprocess.run([loader, "preview", "--data", data, "--indices", ",".join(map(str, indices)),
                    "--image-size", str(size), "--out", out], check=True, stdout=subprocess.DEVNULL)
    return np.stack([np.asarray(Image.open(os.path.join(out, "%d.png" % i)).convert("RGB"))
                     for i in indices])


def main():
    loader, data = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    sizes = [int(s) for s in sys.argv[4:]] or [64, 224]
    indices = list(range(n))
    with tempfile.TemporaryDirectory() as tmp:
        src = preview(loader, data, 32, indices, os.path.join(tmp, "32"))
        x = torch.from_numpy(src).permute(0, 3, 1, 2).float()
        for s in sizes:
            ref = preview(loader, data, s, indices, os.path.join(tmp, str(s))).astype(np.float64)
            dev = F.interpolate(x, size=(s, s), mode="bilinear", align_corners=False)
            dev = dev.permute(0, 2, 3, 1).double().numpy()
            d = np.abs(dev - ref)
            print("%dx%d from 32x32, %d images: mean |diff| %.3f, 99th percentile %.2f, max %.2f "
                  "(0..255 scale; the loader's own uint8 rounding alone is up to 0.5)"
                  % (s, s, n, d.mean(), np.percentile(d, 99), d.max()))


if __name__ == "__main__":
    main()

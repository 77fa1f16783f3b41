"""`loader preview` (eval transform) against torchvision on the PIL image.

Packs an ImageFolder of images of many sizes (up- and downscaling, both
orientations), previews every sample with each resize mode and size, and
compares with torchvision's Resize((S, S)) (squash), Resize(S) +
CenterCrop(S) (shorter-crop) and Resize(round(S / 0.875)) + CenterCrop(S)
(shorter-crop with --resize-size: ImageNet's eval). The contract is agreement within 1 per channel
value; the largest difference seen is printed.

Usage: check_preview_against_torchvision.py PACK_TOOL LOADER SCRATCH
"""
import os, subprocess, sys
import numpy as np
from PIL import Image
from torchvision import transforms as T

pack_tool, loader, scratch = sys.argv[1:4]
root = os.path.join(scratch, "imf")
rng = np.random.default_rng(5)
sizes = [(32, 32), (37, 23), (23, 37), (224, 224), (300, 200), (200, 301), (500, 375), (17, 250), (640, 480)]
for i, (w, h) in enumerate(sizes):
    d = os.path.join(root, f"c{i % 2}")
    os.makedirs(d, exist_ok=True)
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x * 7 + y * 3) % 256], -1)
    a = (a + rng.integers(0, 60, a.shape)).clip(0, 255).astype(np.uint8)
    Image.fromarray(a).save(os.path.join(d, f"{i:02d}.png"))
packed = os.path.join(scratch, "packed")
subprocess.check_call([pack_tool, "imagefolder", root, packed], stdout=subprocess.DEVNULL)
samples = [p for p, _ in __import__("torchvision").datasets.ImageFolder(root).samples]

worst = 0
for size in (224, 64):
    for mode in ("squash", "shorter-crop", "center"):
        out = os.path.join(scratch, f"{mode}-{size}")
        r = round(size / 0.875)
        flags = ["--resize", "shorter-crop", "--resize-size", str(r)] if mode == "center" else ["--resize", mode]
        subprocess.check_call([loader, "preview", "--data", packed, "--indices",
                               ",".join(str(i) for i in range(len(samples))), "--out", out,
                               "--image-size", str(size)] + flags, stdout=subprocess.DEVNULL)
        ref = (T.Resize((size, size)) if mode == "squash" else
               T.Compose([T.Resize(size if mode == "shorter-crop" else r), T.CenterCrop(size)]))
        for i, path in enumerate(samples):
            want = np.asarray(ref(Image.open(path).convert("RGB")), dtype=np.int16)
            got = np.asarray(Image.open(os.path.join(out, f"{i}.png")).convert("RGB"), dtype=np.int16)
            assert got.shape == want.shape, (path, mode, size, got.shape, want.shape)
            diff = int(np.abs(got - want).max())
            worst = max(worst, diff)
            if diff > 1:
                print(f"FAIL {path} {Image.open(path).size} {mode} {size}: max diff {diff}")
print(f"{len(samples)} images x 3 modes x 2 sizes: largest difference from torchvision {worst}")
sys.exit(0 if worst <= 1 else 1)

"""Checks a packed ImageFolder against the reference pipeline users come from.

For every sample i: the path and label at i equal torchvision's
ImageFolder(root).samples[i] (when torchvision is installed; otherwise the
same rules written out here), and `pack_tool export` gives exactly the pixels
of PIL.Image.open(path).convert("RGB").

Usage: check_against_pillow.py PACK_TOOL IMAGEFOLDER SHARDSET SCRATCH
"""
import json, os, subprocess, sys
import numpy as np
from PIL import Image

pack_tool, root, packed, scratch = sys.argv[1:5]
os.makedirs(scratch, exist_ok=True)

try:
    from torchvision.datasets import ImageFolder
    samples = ImageFolder(root).samples
    ref = "torchvision"
except ImportError:
    exts = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = []
    for label, c in enumerate(classes):
        for r, _, files in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            for f in sorted(files):
                if f.lower().endswith(exts):
                    samples.append((os.path.join(r, f), label))
    ref = "the ImageFolder rules (torchvision not installed)"

info = json.loads(subprocess.check_output([pack_tool, "info", "--json", packed]))
assert info["splits"]["train"]["num_samples"] == len(samples), "sample count differs"
bad = 0
for i, (path, label) in enumerate(samples):
    out = os.path.join(scratch, f"{i}.png")
    msg = subprocess.check_output([pack_tool, "export", packed, "--split", "train",
                                   "--index", str(i), "--out", out], text=True)
    got_label = int(msg.rsplit("label ", 1)[1])
    want = np.asarray(Image.open(path).convert("RGB"))
    got = np.asarray(Image.open(out).convert("RGB"))
    if got_label != label or got.shape != want.shape or not (got == want).all():
        diff = int(np.abs(got.astype(int) - want.astype(int)).max()) if got.shape == want.shape else -1
        print(f"sample {i} {path}: label {got_label} vs {label}, max pixel diff {diff}")
        bad += 1
print(f"{len(samples)} samples compared with {ref} and Pillow, {bad} differ")
sys.exit(1 if bad else 0)

"""Checks a packed ImageFolder against the reference pipeline users come from.

For every sample i: the path and label at i equal torchvision's
ImageFolder(root).samples[i] (when torchvision is installed; otherwise the
same rules written out here), and `pack_tool export` gives exactly the pixels
of PIL.Image.open(path).convert("RGB"); with MAX_SIDE (a set packed with
--max-side MAX_SIDE and a lossless encoding), of that image resized as
Pillow does, resize((round(w*N/L), round(h*N/L)), BILINEAR) where its longer
side L exceeds N, and the manifest's original size is the file's.

Usage: check_against_pillow.py PACK_TOOL IMAGEFOLDER SHARDSET SCRATCH [MAX_SIDE]
"""
import json, os, subprocess, sys
import numpy as np
from PIL import Image

pack_tool, root, packed, scratch = sys.argv[1:5]
max_side = int(sys.argv[5]) if len(sys.argv) > 5 else 0


def fit(w, h, n):
    """MaxSideSize: round(w * n / L) x round(h * n / L), halves up, at least 1."""
    L = max(w, h)
    if n == 0 or L <= n:
        return w, h
    return max(1, (2 * w * n + L) // (2 * L)), max(1, (2 * h * n + L) // (2 * L))
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
originals = None
if max_side:
    import base64, struct
    manifest = json.load(open(os.path.join(packed, "manifest.json")))
    split = manifest["splits"]["train"]
    assert split["max_side"] == max_side, split.get("max_side")
    raw = base64.b64decode(split["original_sizes"])
    originals = [struct.unpack_from("<II", raw, 8 * i) for i in range(len(samples))]
bad = 0
for i, (path, label) in enumerate(samples):
    out = os.path.join(scratch, f"{i}.png")
    msg = subprocess.check_output([pack_tool, "export", packed, "--split", "train",
                                   "--index", str(i), "--out", out], text=True)
    got_label = int(msg.rsplit("label ", 1)[1])
    src = Image.open(path).convert("RGB")
    if originals is not None:
        if tuple(originals[i]) != src.size:
            print(f"sample {i} {path}: manifest's original size {originals[i]} but the file is {src.size}")
            bad += 1
        size = fit(src.size[0], src.size[1], max_side)
        if size != src.size:
            src = src.resize(size, Image.BILINEAR)
    want = np.asarray(src)
    got = np.asarray(Image.open(out).convert("RGB"))
    if got_label != label or got.shape != want.shape or not (got == want).all():
        diff = int(np.abs(got.astype(int) - want.astype(int)).max()) if got.shape == want.shape else -1
        print(f"sample {i} {path}: label {got_label} vs {label}, max pixel diff {diff}")
        bad += 1
print(f"{len(samples)} samples compared with {ref} and Pillow, {bad} differ")
sys.exit(1 if bad else 0)

#!/usr/bin/env python3
"""The baselines of bench/jpeg_compare.sh, one core each, over an ImageFolder
of JPEGs: prints images/s as one JSON line.

  torchvision   ImageFolder + PIL decode + the transform + PILToTensor,
                a DataLoader without workers (batches of 64)
  pil-draft     PIL with draft(): libjpeg's DCT scaling to the smallest
                scale that keeps the crop at least the output size
  opencv        cv2.imdecode (full decode) + crop + cv2.resize (INTER_AREA)
                + flip: FFCV's method
  decode-only   cv2.imdecode alone: the floor of every full-decode loader

Transforms (--transform): train = RandomResizedCrop(S) + horizontal flip;
eval256 = Resize(256) + CenterCrop(S); eval = Resize(S) + CenterCrop(S).

Usage: photo_pipelines.py --root DIR --pipeline NAME [--transform train]
                          [--images 1000] [--size 224]
"""
import argparse, json, os, random, time

p = argparse.ArgumentParser()
p.add_argument("--root", required=True)
p.add_argument("--pipeline", required=True, choices=["torchvision", "pil-draft", "opencv", "decode-only"])
p.add_argument("--transform", default="train", choices=["train", "eval256", "eval"])
p.add_argument("--images", type=int, default=1000)
p.add_argument("--size", type=int, default=224)
a = p.parse_args()
if a.images < 1 or a.size < 1:
    p.error("--images and --size must be at least 1")

files = sorted(os.path.join(d, f) for d, _, fs in os.walk(a.root) for f in fs if f.endswith(".jpg"))
if not files:
    raise SystemExit("photo_pipelines.py: no .jpg under " + a.root)
random.seed(0)
random.shuffle(files)
order = [files[i % len(files)] for i in range(a.images + 64)]  # 64 to warm up
S = a.size
resize_to = 256 if a.transform == "eval256" else S


def rrc_params(w, h):
    """torchvision's RandomResizedCrop.get_params (scale 0.08-1, ratio 3/4-4/3)."""
    import math
    area = w * h
    for _ in range(10):
        target = area * random.uniform(0.08, 1.0)
        ar = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = int(round(math.sqrt(target * ar))), int(round(math.sqrt(target / ar)))
        if 0 < cw <= w and 0 < ch <= h:
            return random.randint(0, w - cw), random.randint(0, h - ch), cw, ch
    return 0, 0, w, h


def centre(w, h):
    """Resize(resize_to) then CenterCrop(S), as a box of the source."""
    sc = resize_to / min(w, h)
    cw, ch = min(w, S / sc), min(h, S / sc)
    return (w - cw) / 2, (h - ch) / 2, cw, ch


def run_torchvision():
    import torch
    from torch.utils.data import DataLoader, Dataset
    from torchvision import transforms as T
    from PIL import Image
    torch.set_num_threads(1)
    if a.transform == "train":
        tf = T.Compose([T.RandomResizedCrop(S), T.RandomHorizontalFlip(), T.PILToTensor()])
    else:
        tf = T.Compose([T.Resize(resize_to), T.CenterCrop(S), T.PILToTensor()])

    class Files(Dataset):
        def __len__(self):
            return len(order)

        def __getitem__(self, i):
            with open(order[i], "rb") as f:
                return tf(Image.open(f).convert("RGB")), 0
    n, t0 = 0, None
    for x, _ in DataLoader(Files(), batch_size=64, num_workers=0):
        if t0 is None:
            t0 = time.perf_counter()
            continue
        n += x.shape[0]
    return n, time.perf_counter() - t0


def run_each(one):
    t0 = None
    for i, f in enumerate(order):
        if i == 64:
            t0 = time.perf_counter()
        with open(f, "rb") as fh:
            one(fh.read())
    return a.images, time.perf_counter() - t0


def pil_draft(data):
    import io
    from PIL import Image
    img = Image.open(io.BytesIO(data))
    w, h = img.size
    x, y, cw, ch = rrc_params(w, h) if a.transform == "train" else centre(w, h)
    # The smallest DCT scale that keeps the crop at least S x S.
    img.draft("RGB", (max(1, int(w * S / cw)), max(1, int(h * S / ch))))
    fx, fy = img.size[0] / w, img.size[1] / h
    out = img.convert("RGB").resize((S, S), Image.BILINEAR, box=(x * fx, y * fy, (x + cw) * fx, (y + ch) * fy))
    if a.transform == "train" and random.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return out.tobytes()


def opencv(data):
    import cv2
    import numpy as np
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if a.pipeline == "decode-only":
        return img
    h, w = img.shape[:2]
    x, y, cw, ch = rrc_params(w, h) if a.transform == "train" else centre(w, h)
    x, y, cw, ch = int(x), int(y), max(1, int(cw)), max(1, int(ch))
    out = cv2.resize(img[y:y + ch, x:x + cw], (S, S), interpolation=cv2.INTER_AREA)
    if a.transform == "train" and random.random() < 0.5:
        out = out[:, ::-1]
    return cv2.cvtColor(np.ascontiguousarray(out), cv2.COLOR_BGR2RGB)


if a.pipeline in ("opencv", "decode-only"):
    import cv2
    cv2.setNumThreads(1)
if a.pipeline == "torchvision":
    n, secs = run_torchvision()
elif a.pipeline == "pil-draft":
    n, secs = run_each(pil_draft)
else:
    n, secs = run_each(opencv)
print(json.dumps({"pipeline": a.pipeline, "transform": a.transform, "images": n,
                  "images_per_s": n / secs}))

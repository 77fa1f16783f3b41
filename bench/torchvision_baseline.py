#!/usr/bin/env python3
"""The incident's own input pipeline, as the baseline: torchvision ImageFolder
of PNGs, PIL decode, Resize(224), ToTensor, Normalize, a DataLoader with
worker processes and a DistributedSampler. Prints images/s and images/s per
core (cores = worker processes, or 1 with --workers 0) as one JSON line.

Usage: torchvision_baseline.py --root IMAGEFOLDER [--workers 1] [--batch-size 64]
                               [--max-images N] [--image-size 224] [--squash]
"""
import argparse, json, time
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms as T

p = argparse.ArgumentParser()
p.add_argument("--root", required=True)
p.add_argument("--workers", type=int, default=1)
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--max-images", type=int, default=0)
p.add_argument("--image-size", type=int, default=224)
p.add_argument("--squash", action="store_true",
               help="Resize((S, S)), as the loader's --resize squash, instead of the shorter side to S "
                    "(needed where images differ in shape: a batch stacks equal sizes)")
a = p.parse_args()
torch.set_num_threads(1)

tf = T.Compose([T.Resize((a.image_size, a.image_size) if a.squash else a.image_size), T.ToTensor(),
                T.Normalize((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))])
ds = datasets.ImageFolder(a.root, transform=tf)
sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
dl = DataLoader(ds, batch_size=a.batch_size, sampler=sampler, num_workers=a.workers)
images, t0, first = 0, None, True
for x, y in dl:
    if first:  # start the clock after the first batch: worker start-up is not throughput
        t0, first = time.perf_counter(), False
        continue
    images += x.shape[0]
    if a.max_images and images >= a.max_images:
        break
secs = time.perf_counter() - t0
cores = max(a.workers, 1)
print(json.dumps({"pipeline": "torchvision ImageFolder + PIL + Resize + ToTensor + Normalize",
                  "images": images, "seconds": secs, "images_per_s": images / secs,
                  "images_per_s_per_core": images / secs / cores, "workers": a.workers}))

#!/usr/bin/env python3
"""Writes the images of a CIFAR-100 binary file (pack_tool fake-cifar100's
train.bin) as an ImageFolder tree of PNGs: OUT/class_NNN/IIIII.png, the
fine label as the class. The benchmarks' torchvision baselines read it.

Usage: cifar_folder.py TRAIN_BIN OUT
"""
import os
import sys

import numpy as np
from PIL import Image

recs = np.fromfile(sys.argv[1], dtype=np.uint8).reshape(-1, 3074)
for i, r in enumerate(recs):
    d = os.path.join(sys.argv[2], f"class_{r[1]:03d}")
    os.makedirs(d, exist_ok=True)
    Image.fromarray(r[2:].reshape(3, 32, 32).transpose(1, 2, 0)).save(os.path.join(d, f"{i:05d}.png"))

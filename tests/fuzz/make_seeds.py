"""Seed corpora for the fuzz targets, made from valid inputs of each kind.

Usage: make_seeds.py OUT_DIR   (writes OUT_DIR/<target>/seed-*)
"""
import base64, io, json, os, struct, subprocess, sys, tarfile, tempfile
import lmdb
import numpy as np
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import nl_record  # noqa: E402

out = sys.argv[1]
rng = np.random.default_rng(7)


def put(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def record(encoding, w, h, payload, label=3):
    return nl_record.record(payload, enc=encoding, label=label, w=w, h=h)


def image(mode, w, h):
    a = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    return Image.fromarray(a).convert(mode)


def saved(img, fmt, **kw):
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    return b.getvalue()


pngs = {"rgb": saved(image("RGB", 9, 7), "PNG"), "gray": saved(image("L", 5, 4), "PNG"),
        "palette": saved(image("P", 6, 6), "PNG", transparency=1), "rgba": saved(image("RGBA", 4, 3), "PNG"),
        "interlaced": saved(image("RGB", 8, 8), "PNG", interlace=1),
        "gray16": saved(Image.fromarray((rng.integers(0, 65535, (4, 5))).astype(np.int32)).convert("I;16"), "PNG")}
jpegs = {"420": saved(image("RGB", 17, 9), "JPEG", quality=80), "444": saved(image("RGB", 8, 8), "JPEG", subsampling=0),
         "gray": saved(image("L", 8, 8), "JPEG"), "progressive": saved(image("RGB", 16, 16), "JPEG", progressive=True),
         "cmyk": saved(image("CMYK", 8, 8), "JPEG")}
# With restart markers (libjpeg-turbo-progs' jpegtran, which fuzz.sh
# installs): at every row of MCUs, and every 2 MCUs across rows.
for name, src, every in (("420_rows", "420", "1"), ("420_every2", "420", "2B"), ("444_rows", "444", "1")):
    with tempfile.NamedTemporaryFile(suffix=".jpg") as f:
        f.write(jpegs[src])
        f.flush()
        jpegs[name] = subprocess.run(["jpegtran", "-restart", every, f.name], check=True,
                                     capture_output=True).stdout
    assert b"\xff\xdd" in jpegs[name], name
for k, v in pngs.items():
    put("png_fuzz", k, v)
for k, v in jpegs.items():
    put("jpeg_fuzz", k, v)

put("record_fuzz", "raw", record(0, 4, 3, bytes(rng.integers(0, 256, 36, dtype=np.uint8))))
put("record_fuzz", "png", record(1, 9, 7, pngs["rgb"]))
put("record_fuzz", "jpeg", record(2, 17, 9, jpegs["420"]))

manifest = {
    "format_version": 1,
    "source": {"kind": "cifar100", "path": "/data/cifar-100-binary", "label_kind": "fine"},
    "classes": ["apple", "b\\xff", "c"],
    "splits": {"train": {"source": "/data/train.bin", "num_samples": 5, "encoding": "raw", "shape": [32, 32, 3],
                         "shards": [{"path": "train/shard-00000", "count": 3, "bytes": 12345},
                                    {"path": "train/shard-00001", "count": 2, "bytes": 999}],
                         "skipped": [{"path": "x/y.jpg", "reason": "truncated"}]}},
}
put("manifest_fuzz", "cifar", json.dumps(manifest, indent=2))
# What manifest_fuzz found (UB converting it to int), replayed by every run.
put("manifest_fuzz", "float-version", '{\n  "format_version": 4444444444244444442444444488.8888889 }')

for i, s in enumerate(["0-3,8-11", "0-9;10-19", "1,2,3", "0.5,1.5,2", "7", "0-63:2", ""]):
    put("cli_lists_fuzz", str(i), s)
for i, s in enumerate([b"\x03\x10\x00\x20\x00\x00", b"\x00\x01\x00\x01\x00\x07", b"\x01\x01\x00\x01\x00\x04" + bytes(8)]):
    put("ring_header_fuzz", str(i), s)

# CIFAR: the first byte picks the form (0: directory, 1: .tar.gz, 2: .tar).
recs = b"".join(bytes([i % 20, i % 100]) + bytes(rng.integers(0, 256, 3072, dtype=np.uint8)) for i in range(3))
put("cifar_fuzz", "dir", b"\x00" + recs)
names = {"fine_label_names.txt": "".join(f"f{i}\n" for i in range(100)),
         "coarse_label_names.txt": "".join(f"c{i}\n" for i in range(20))}
for form, mode in ((1, "w:gz"), (2, "w")):
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode=mode) as t:
        for name, data in [("train.bin", recs), ("test.bin", recs[:3074])] + [(k, v.encode()) for k, v in names.items()]:
            info = tarfile.TarInfo("cifar-100-binary/" + name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    put("cifar_fuzz", "tar" + str(form), bytes([form]) + b.getvalue())
# What cifar_fuzz found in CI (a gzip stream cut inside its header: libarchive
# gives a null error string, which was appended to a std::string), replayed by
# every run.
put("cifar_fuzz", "cut-gzip-header", base64.b64decode("AR+LCAAQaxcnCR1r4HQAAA=="))

put("imagefolder_fuzz", "tree", "cat/a.png!\ncat/b.png!\ndog/c.jpg\ndog/sub/d.png!\n@dog/loop>..\n")
put("imagefolder_fuzz", "odd", b"caf\xe9/x.png!\n#locked/y\n@link>/etc\nempty/\n")

# Shards: data.mdb files as pack_tool writes them (records in key order):
# a few records inline in a leaf page, records in overflow pages, and enough
# small ones for a branch page above several leaves.

def shard(name, values):
    with tempfile.TemporaryDirectory() as d:
        env = lmdb.open(d, map_size=1 << 22, lock=False, subdir=True)
        with env.begin(write=True) as txn:
            for i, v in enumerate(values):
                txn.put(struct.pack(">Q", i), v, append=True)
        env.close()
        put("shard_fuzz", name, open(os.path.join(d, "data.mdb"), "rb").read())


shard("inline", [record(0, 2, 2, bytes(12), label=i) for i in range(3)])
shard("overflow", [record(0, 1000, 1, bytes(rng.integers(0, 256, 3000, dtype=np.uint8))) for _ in range(4)])
shard("branch", [record(0, 2, 1, bytes(6), label=i % 100) for i in range(300)])

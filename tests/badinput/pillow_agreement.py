"""Damaged PNG and JPEG files, decided by Pillow and by our decoder, file by file.

A dataset that loads under torchvision must pack here with the same samples:
where Pillow's Image.open(f).convert("RGB") loads a file, our decoder must
load it with the same pixels; where Pillow refuses, ours must refuse. This
script writes a corpus of damaged files made from valid ones (truncations at
many offsets, a bit flipped in every header byte and in compressed data,
missing or cut end chunks, bad checksums, libjpeg warnings of several kinds,
images above Pillow's pixel warnings), asks Pillow and DECODE_PROBE about
each, and prints every disagreement. Exit 0 when all agree.

Usage: pillow_agreement.py DECODE_PROBE SCRATCH [--report FILE.md] [--big]
  --big: also the 81-megapixel image Pillow loads with a warning (a few s).
"""
import io, json, os, struct, subprocess, sys, warnings, zlib
import numpy as np
from PIL import Image

probe, scratch = sys.argv[1], sys.argv[2]
report = sys.argv[sys.argv.index("--report") + 1] if "--report" in sys.argv else None
big = "--big" in sys.argv
os.makedirs(scratch, exist_ok=True)
rng = np.random.default_rng(20261203)
corpus = []  # (name, kind, bytes)


def add(name, kind, data):
    corpus.append((name, kind, bytes(data)))


def picture(w, h):
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // max(1, w - 1)), (y * 255 // max(1, h - 1)), ((x + y) * 7) % 256], -1)
    return (img + rng.integers(0, 40, img.shape)).clip(0, 255).astype(np.uint8)


def encoded(img, fmt, **kw):
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    return b.getvalue()


# --- PNG chunk surgery ---------------------------------------------------------
def chunks(data):
    out, pos = [], 8
    while pos + 8 <= len(data):
        n = struct.unpack(">I", data[pos:pos + 4])[0]
        out.append((data[pos + 4:pos + 8], pos, n))
        pos += 12 + n
    return out


def chunk(cid, body, crc=None):
    c = zlib.crc32(cid + body) if crc is None else crc
    return struct.pack(">I", len(body)) + cid + body + struct.pack(">I", c & 0xFFFFFFFF)


def split_idat(data, parts):
    """The same PNG with its image data in `parts` IDAT chunks."""
    cs = chunks(data)
    idat = b"".join(data[p + 8:p + 8 + n] for cid, p, n in cs if cid == b"IDAT")
    first = next(p for cid, p, n in cs if cid == b"IDAT")
    end = next(p for cid, p, n in cs if cid == b"IEND")
    step = max(1, len(idat) // parts)
    body = b"".join(chunk(b"IDAT", idat[i:i + step]) for i in range(0, len(idat), step))
    return data[:first] + body + data[end:]


def with_text_chunks(data):
    cs = chunks(data)
    first = next(p for cid, p, n in cs if cid == b"IDAT")
    end = next(p for cid, p, n in cs if cid == b"IEND")
    return (data[:first] + chunk(b"tEXt", b"Comment\x00before") + data[first:end] +
            chunk(b"tEXt", b"Comment\x00after") + data[end:])


pngs = {
    "png-rgb": encoded(Image.fromarray(picture(37, 23)), "PNG"),
    "png-gray": encoded(Image.fromarray(picture(29, 19)[..., 0]), "PNG"),
    "png-gray16": encoded(Image.fromarray((picture(21, 17)[..., 0].astype(np.int32) * 300)).convert("I;16"), "PNG"),
    "png-rgba": encoded(Image.fromarray(np.dstack([picture(25, 18), picture(25, 18)[..., :1]])), "PNG"),
    "png-palette": encoded(Image.fromarray(picture(31, 21)).convert("P", palette=Image.ADAPTIVE, colors=16), "PNG", transparency=3),
    "png-interlaced": encoded(Image.fromarray(picture(33, 27)), "PNG", interlace=1),
}
pngs["png-multi-idat"] = split_idat(pngs["png-rgb"], 6)
pngs["png-text"] = with_text_chunks(pngs["png-rgb"])

def add_truncations(name, data):
    """Cuts every ~len/24 bytes, and at each of the last 16."""
    n = len(data)
    for o in sorted(set(list(range(0, n, max(1, n // 24))) + list(range(max(0, n - 16), n)))):
        add(f"{name}-cut{o}", "truncated", data[:o])


for name, data in pngs.items():
    add(name, "valid", data)
    n = len(data)
    add_truncations(name, data)
    # a bit flipped in every byte before the first IDAT's data, and in 24 bytes of image data
    cs = chunks(data)
    first_idat = next(p for cid, p, nn in cs if cid == b"IDAT")
    for o in range(8, min(first_idat + 8, n)):
        b = bytearray(data)
        b[o] ^= 1 << (o % 8)
        add(f"{name}-flip{o}", "header bit flip", b)
    idats = [(p, nn) for cid, p, nn in cs if cid == b"IDAT"]
    for k in range(24):
        p, nn = idats[k % len(idats)]
        o = p + 8 + int(rng.integers(0, max(1, nn)))
        b = bytearray(data)
        b[o] ^= 1 << int(rng.integers(0, 8))
        add(f"{name}-dflip{o}", "data bit flip", b)
    end = next(p for cid, p, nn in cs if cid == b"IEND")
    add(f"{name}-noiend", "end chunk", data[:end])
    add(f"{name}-iendcut", "end chunk", data[:end + 6])
    add(f"{name}-trailing", "end chunk", data + b"garbage after IEND")
    add(f"{name}-badiendcrc", "checksum", data[:end] + chunk(b"IEND", b"", crc=1))
    p, nn = idats[-1]
    b = bytearray(data)
    b[p + 8 + nn] ^= 0x55  # the last IDAT's CRC
    add(f"{name}-badidatcrc", "checksum", b)
    b = bytearray(data)
    b[p + 8 + nn - 1] ^= 0x01  # zlib's adler32 (the stream's last byte)
    add(f"{name}-badadler", "checksum", b)
    add(f"{name}-badtextcrc-before", "checksum",
        data[:first_idat] + chunk(b"tEXt", b"k\x00v", crc=7) + data[first_idat:])
    add(f"{name}-badtextcrc-after", "checksum", data[:end] + chunk(b"tEXt", b"k\x00v", crc=7) + data[end:])
    add(f"{name}-unknown-ancillary", "chunk", data[:first_idat] + chunk(b"abCd", b"xyz") + data[first_idat:])
    add(f"{name}-unknown-critical", "chunk", data[:first_idat] + chunk(b"ABCD", b"xyz") + data[first_idat:])
    add(f"{name}-empty-idat", "chunk", data[:first_idat] + chunk(b"IDAT", b"") + data[first_idat:])
    add(f"{name}-extra-zlib", "chunk", data[:end] + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + data[end:])

# --- JPEG --------------------------------------------------------------------
def segments(data):
    """(marker, offset) of each marker segment up to the first SOS."""
    out, pos = [], 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        m = data[pos + 1]
        out.append((m, pos))
        if m == 0xDA:
            break
        pos += 2 + struct.unpack(">H", data[pos + 2:pos + 4])[0]
    return out


base = picture(45, 31)
jpegs = {
    "jpg-420": encoded(Image.fromarray(base), "JPEG", quality=90),
    "jpg-444": encoded(Image.fromarray(base), "JPEG", quality=90, subsampling=0),
    "jpg-gray": encoded(Image.fromarray(base[..., 0]), "JPEG", quality=85),
    "jpg-progressive": encoded(Image.fromarray(base), "JPEG", quality=85, progressive=True),
    "jpg-cmyk": encoded(Image.fromarray(base).convert("CMYK"), "JPEG", quality=90),
}
for name, data in jpegs.items():
    add(name, "valid", data)
    n = len(data)
    add_truncations(name, data)
    segs = segments(data)
    sos = segs[-1][1]
    for o in range(2, min(sos + 14, n), 3):  # every third header byte
        b = bytearray(data)
        b[o] ^= 1 << (o % 8)
        add(f"{name}-flip{o}", "header bit flip", b)
    for k in range(24):
        o = int(rng.integers(sos + 14, n - 2))
        b = bytearray(data)
        b[o] ^= 1 << int(rng.integers(0, 8))
        add(f"{name}-dflip{o}", "data bit flip", b)
    add(f"{name}-noeoi", "end marker", data[:-2])
    add(f"{name}-trailing", "end marker", data + b"garbage after EOI")
    add(f"{name}-extraneous", "warning", data[:sos] + b"\x00\x11\x22" + data[sos:])
    app0 = next((o for m, o in segs if m == 0xE0), None)
    if app0 is not None and data[app0 + 4:app0 + 9] == b"JFIF\x00":
        b = bytearray(data)
        b[app0 + 9], b[app0 + 10] = 3, 7  # JFIF revision 3.07: libjpeg warns
        add(f"{name}-jfif-revision", "warning", b)

# --- sizes around Pillow's limits --------------------------------------------
def raw_png(w, h, color_type, bpp):
    row = b"\x00" + b"\x00" * (w * bpp)
    z = zlib.compressobj(9)
    body = b"".join(z.compress(row) for _ in range(h)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", w, h, 8, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


add("png-over-bomb-limit-14000x13000", "size", raw_png(14000, 13000, 0, 1))  # 182 MP > 2 x 89,478,485
if big:
    add("png-81mp-9000x9000", "size", raw_png(9000, 9000, 0, 1))  # Pillow warns, loads

# --- decide ------------------------------------------------------------------
paths = []
for name, kind, data in corpus:
    p = os.path.join(scratch, name + (".png" if name.startswith("png") else ".jpg"))
    with open(p, "wb") as f:
        f.write(data)
    paths.append(p)


def pillow(path):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(path) as im:
                a = np.asarray(im.convert("RGB"))
        return {"ok": True, "width": a.shape[1], "height": a.shape[0], "crc32": zlib.crc32(a.tobytes())}
    except Exception as e:  # Pillow refuses: any exception from open or load
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


ours = subprocess.run([probe], input="\n".join(paths) + "\n", capture_output=True, text=True, check=True)
ours = [json.loads(l) for l in ours.stdout.splitlines()]
assert len(ours) == len(paths), (len(ours), len(paths))

rows, disagree = {}, []
for (name, kind, _), path, o in zip(corpus, paths, ours):
    pl = pillow(path)
    if pl["ok"] and o["ok"]:
        same = (pl["width"], pl["height"], pl["crc32"]) == (o["width"], o["height"], o["crc32"])
        verdict = "both load, same pixels" if same else "both load, pixels differ"
    elif pl["ok"] != o["ok"]:
        same, verdict = False, "Pillow loads, we refuse" if pl["ok"] else "Pillow refuses, we load"
    else:
        same, verdict = True, "both refuse"
    r = rows.setdefault(kind, {"files": 0, "pillow loads": 0, "agree": 0})
    r["files"] += 1
    r["pillow loads"] += pl["ok"]
    r["agree"] += same
    if not same:
        disagree.append((name, verdict, pl.get("error", ""), o.get("error", "")))

total = sum(r["files"] for r in rows.values())
agree = sum(r["agree"] for r in rows.values())
lines = ["| kind | files | Pillow loads | agree |", "|---|---:|---:|---:|"]
for kind, r in rows.items():
    lines.append(f"| {kind} | {r['files']} | {r['pillow loads']} | {r['agree']} |")
lines.append(f"| **all** | **{total}** | **{sum(r['pillow loads'] for r in rows.values())}** | **{agree}** |")
print("\n".join(lines))
for name, verdict, pe, oe in disagree:
    print(f"DISAGREE {name}: {verdict}; Pillow: {pe or 'loads'}; ours: {oe or 'loads'}")
print(f"{agree} of {total} files agree with Pillow")
if report:
    with open(report, "w") as f:
        f.write("\n".join(lines) + "\n")
sys.exit(0 if not disagree else 1)

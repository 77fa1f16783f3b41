#!/usr/bin/env bash
# Hostile inputs end to end: bad images that must not poison the next ones,
# damaged shard sets that must be reported (never a signal or an uncaught
# exception), and command-line counts out of range.
# Usage: hostile_input_cli_test.sh PACK_TOOL
set -uo pipefail
PT=$1
. "$(dirname "$0")/cli_lib.sh"

# A shard set written by Python (lmdb module) from crafted records, so it can
# hold what pack_tool refuses to write: make_shard_set.py OUT SPEC.json
cat >"$W/make_shard_set.py" <<'PYEOF'
import json, os, struct, sys, lmdb
POLY = 0x82F63B78
TABLE = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ POLY if c & 1 else c >> 1
    TABLE.append(c)
def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
def record(enc, label, w, h, payload, length=None):
    length = len(payload) if length is None else length
    head = struct.pack("<4sHBBIIIII", b"NLRC", 1, enc, 3, label, w, h, length, crc32c(payload))
    return head + struct.pack("<I", crc32c(head)) + payload
out, spec = sys.argv[1], json.load(open(sys.argv[2]))
recs = []
for r in spec["records"]:
    payload = open(r["file"], "rb").read()
    if "cut" in r:
        payload = payload[: r["cut"]]
    recs.append(record(r.get("enc", 2), r.get("label", 0), r["w"], r["h"], payload, r.get("length")))
os.makedirs(out + "/train/shard-00000")
env = lmdb.open(out + "/train/shard-00000", map_size=1 << 28, lock=False, subdir=True)
crc = 0
with env.begin(write=True) as txn:
    for i, v in enumerate(recs):
        k = struct.pack(">Q", i)
        txn.put(k, v, append=True)
        crc = crc32c(k + v, crc)
env.sync(True)
env.close()
size = os.path.getsize(out + "/train/shard-00000/data.mdb")
m = {"format_version": 1, "source": {"kind": "imagefolder", "path": "x", "label_kind": "class_dirs"},
     "classes": ["a", "b"],
     "splits": {"train": {"source": "x", "num_samples": len(recs), "encoding": spec.get("encoding", "jpeg"),
                          "shape": None, "shards": [{"path": "train/shard-00000", "first_index": 0,
                          "count": len(recs), "bytes": size, "checksum": "crc32c:%08x" % crc}],
                          "skipped": []}}}
json.dump(m, open(out + "/manifest.json", "w"), indent=2)
PYEOF

# --- a bad JPEG does not poison the thread's decoder ----------------------
expect_rc 0 "make good and bad JPEGs" $PY - "$W/alt" <<'PYEOF'
import io, os, sys
from PIL import Image
root = sys.argv[1]
os.makedirs(root + "/cls")
img = Image.new("RGB", (40, 30))
img.putdata([(x * 6, y * 8, (x + y) * 3) for y in range(30) for x in range(40)])
buf = io.BytesIO(); img.save(buf, "JPEG", quality=90); good = buf.getvalue()
sos = good.index(b"\xff\xda")
dqt = good.index(b"\xff\xdb") + 4
bad_dqt = bytearray(good); bad_dqt[dqt] |= 0x0F
bads = [bytes(bad_dqt), good[:sos], good[: len(good) // 2], good[: len(good) - 20]]
for i in range(8):
    open("%s/cls/%02d_good.jpg" % (root, 2 * i), "wb").write(good)
    open("%s/cls/%02d_bad.jpg" % (root, 2 * i + 1), "wb").write(bads[i % 4])
open(root + "/good.jpg", "wb").write(good)
PYEOF
expect_rc 0 "imagefolder --skip-bad --threads 1 on alternating good and bad JPEGs" \
  "$PT" imagefolder "$W/alt" "$W/alt_packed" --skip-bad --threads 1
expect_out "packed .*: 8 samples .*, 8 skipped" "all 8 good JPEGs packed, the 8 bad ones skipped"
cp "$W/out" "$W/alt_summary"
expect_rc 0 "each skip reason is the file's own (as when packed alone)" $PY - "$W/alt_summary" "$PT" "$W" <<'PYEOF'
import os, re, subprocess, sys
summary, pt, w = sys.argv[1:4]
reasons = dict(re.findall(r"skipped (\S+): (.*)", open(summary).read()))
assert len(reasons) == 8, reasons
for i, path in enumerate(sorted(reasons)):
    assert "_bad" in path, path
    alone = w + "/alone%d" % i
    os.makedirs(alone + "/cls")
    os.link(path, alone + "/cls/x.jpg")
    os.link(w + "/alt/good.jpg", alone + "/cls/y.jpg")
    out = subprocess.run([pt, "imagefolder", alone, alone + "_p", "--skip-bad", "--threads", "1"],
                         capture_output=True, text=True).stdout
    want = [r.replace(alone + "/cls/x.jpg", path) for r in re.findall(r"skipped \S+: (.*)", out)]
    assert want == [reasons[path]], (path, want, reasons[path])
assert "Bogus DQT index 15" in reasons[sorted(reasons)[0]], reasons
PYEOF

# verify --threads 1 on a shard set where every 4th record is a truncated JPEG
expect_rc 0 "shard set with every 4th record a truncated JPEG" $PY - "$W" <<'PYEOF'
import json, sys
w = sys.argv[1]
good = w + "/alt/good.jpg"
n = len(open(good, "rb").read())
recs = [{"file": good, "w": 40, "h": 30, "cut": n // 2 if i % 4 == 3 else n} for i in range(16)]
json.dump({"records": recs}, open(w + "/trunc.json", "w"))
PYEOF
expect_rc 0 "write it" $PY "$W/make_shard_set.py" "$W/trunc" "$W/trunc.json"
expect_rc_stdout 1 "verify --threads 1 finds the truncated JPEGs" "$PT" verify --threads 1 "$W/trunc"
cp "$W/out" "$W/verify_out"
expect_rc 0 "exactly records 3, 7, 11 and 15 are reported" $PY - "$W/verify_out" <<'PYEOF'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
idx = sorted(int(m.group(1)) for l in lines for m in [re.match(r"train/shard-00000 index (\d+): ", l)] if m)
assert idx == [3, 7, 11, 15] and len(lines) == 4, lines
PYEOF

finish

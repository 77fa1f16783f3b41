#!/usr/bin/env bash
# Hostile inputs end to end: bad images that must not poison the next ones,
# damaged shard sets that must be reported (never a signal or an uncaught
# exception), and command-line counts out of range.
# Usage: hostile_input_cli_test.sh PACK_TOOL LOADER_BENCH
set -uo pipefail
PT=$1
LB=$2
. "$(dirname "$0")/cli_lib.sh"
export NL_SUPPORT=$(cd "$(dirname "$0")/support" && pwd)  # nl_record.py for the scripts below

# A shard set written by Python (lmdb module) from crafted records, so it can
# hold what pack_tool refuses to write: make_shard_set.py OUT SPEC.json
cat >"$W/make_shard_set.py" <<'PYEOF'
import json, os, struct, sys, lmdb
sys.path.insert(0, os.environ["NL_SUPPORT"])
from nl_record import crc32c, record as make_record
def record(enc, label, w, h, payload, length=None):
    return make_record(payload, enc=enc, label=label, w=w, h=h, length=length)
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
# The loader's decode threads share the decoder the same way.
expect_rc_stdout 0 "loader_bench --on-bad-record skip, one thread, in index order" \
  "$LB" --data "$W/trunc" --on-bad-record skip --threads-per-rank 1 --batch-size 4 --image-size 32 \
  --bind off --no-shuffle --json
expect_out '"skipped":4[,}]' "exactly the 4 truncated records are skipped"
expect_out '"images":16[,}]' "every position is filled (each bad one by the next good one)"

# --- truncated and empty data.mdb: Corruption naming the shard, never SIGBUS ---
"$PT" fake-cifar100 "$W/c" --train 200 --test 10 >/dev/null && "$PT" cifar100 "$W/c" "$W/p" >/dev/null 2>&1
full=$(stat -c %s "$W/p/train/shard-00000/data.mdb")
for cut in 0 8191 8192 12288 $((full - 4096)); do
  rm -rf "$W/cut" && cp -r "$W/p" "$W/cut" && truncate -s "$cut" "$W/cut/train/shard-00000/data.mdb"
  for mode in "" --quick; do
    expect_rc 1 "verify $mode on data.mdb cut at $cut: exit 1, no signal" "$PT" verify $mode "$W/cut"
    expect_text "train/shard-00000: Corruption: cannot open shard train/shard-00000" "verify $mode names the shard (cut at $cut)"
    if [ "$cut" -eq 0 ]; then want="data.mdb is empty (0 bytes)"; else want="the shard is truncated"; fi
    expect_text "$want" "verify $mode says why (cut at $cut)"
  done
  expect_rc 1 "export from data.mdb cut at $cut: exit 1, no signal" "$PT" export "$W/cut" --split train --index 3 --out "$W/x.png"
  expect_text "cannot open shard train/shard-00000" "export names the shard (cut at $cut)"
done

# --- lying manifests ---
edit_manifest() {  # edit_manifest DIR PYTHON-STATEMENT (on the parsed JSON `m`)
  $PY -c "import json,sys; p=sys.argv[1]+'/manifest.json'; m=json.load(open(p)); $2; json.dump(m, open(p,'w'))" "$1"
}
rm -rf "$W/lie" && cp -r "$W/p" "$W/lie"
edit_manifest "$W/lie" "s=m['splits']['test']; s['shards'][0]['count']=2**63; s['num_samples']=2**63"
expect_rc 1 "a count of 2^63: export refuses" "$PT" export "$W/lie" --split test --index 0 --out "$W/x.png"
expect_text "the manifest says 9223372036854775808 records but the shard holds 10" "the count is checked against LMDB's"
rm -rf "$W/lie" && cp -r "$W/p" "$W/lie" && edit_manifest "$W/lie" "m['classes']=[]"
expect_rc 1 "\"classes\": [] fails verify" "$PT" verify --quick "$W/lie"
expect_text "class list is empty" "verify says the class list is empty"
rm -rf "$W/lie" && cp -r "$W/p" "$W/lie" && edit_manifest "$W/lie" "m['splits']['test']['shards'][0]['bytes']=-1"
expect_rc 1 "negative bytes fails verify" "$PT" verify --quick "$W/lie"
expect_text "field 'bytes' must be a non-negative integer, not -1" "the field and its text are named"
rm -rf "$W/lie" && cp -r "$W/p" "$W/lie" && edit_manifest "$W/lie" "m['splits']['test']['shards'][0]['path']='test\\u0000/shard-00000'"
expect_rc 1 "a NUL in a shard path fails verify" "$PT" verify --quick "$W/lie"
expect_text 'unsafe path "test\u0000/shard-00000"' "the path is shown with its NUL"

# --- a record whose header claims another size than its payload ---
expect_rc 0 "shard set with a lying header" $PY - "$W" <<'PYEOF'
import json, sys
w = sys.argv[1]
good = w + "/alt/good.jpg"  # 40x30
json.dump({"records": [{"file": good, "w": 40, "h": 30}, {"file": good, "w": 20, "h": 10}]},
          open(w + "/lying.json", "w"))
PYEOF
expect_rc 0 "write it" $PY "$W/make_shard_set.py" "$W/lying" "$W/lying.json"
expect_rc 1 "export refuses a payload whose size differs from the header's" \
  "$PT" export "$W/lying" --split train --index 1 --out "$W/x.png"
expect_text "split 'train', shard train/shard-00000, index 1: image decodes to 40x30 but the header says 20x10" \
  "the error names split, shard, index and both sizes"
[ ! -e "$W/x.png" ] && ok "nothing written" || fail "export wrote a PNG"
expect_rc 0 "the honest record exports" "$PT" export "$W/lying" --split train --index 0 --out "$W/ok.png"

# --- one pixel limit: verify and export use 64 megapixels unless told ---
expect_rc 0 "a PNG declaring 1048576 x 1048576" $PY - "$W" <<'PYEOF'
import json, struct, sys, zlib
w = sys.argv[1]
def chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1 << 20, 1 << 20, 8, 2, 0, 0, 0))
       + chunk(b"IDAT", zlib.compress(b"\0" * 4096)) + chunk(b"IEND", b""))
open(w + "/huge.png", "wb").write(png)
json.dump({"encoding": "png", "records": [{"file": w + "/huge.png", "enc": 1, "w": 1024, "h": 1024}]},
          open(w + "/huge.json", "w"))
PYEOF
expect_rc 0 "write it" $PY "$W/make_shard_set.py" "$W/huge" "$W/huge.json"
expect_rc 1 "verify refuses it from its header (no bad_alloc)" "$PT" verify "$W/huge"
expect_text "PNG of 1048576x1048576 pixels exceeds the limit of 178956970 pixels" "verify uses the default limit (Pillow's, 178956970 pixels)"
expect_rc 1 "export refuses it from its header" "$PT" export "$W/huge" --split train --index 0 --out "$W/x.png"
expect_text "exceeds the limit of 178956970 pixels" "export uses the default limit"
expect_rc 1 "verify --max-megapixels 2" "$PT" verify --max-megapixels 2 "$W/huge"
expect_text "PNG of 1048576x1048576 pixels exceeds the limit of 2097152 pixels" "verify uses the flag's limit"
expect_rc 1 "export --max-megapixels 2" "$PT" export "$W/huge" --split train --index 0 --out "$W/x.png" --max-megapixels 2
expect_text "exceeds the limit of 2097152 pixels" "export uses the flag's limit"

# --- counts from the command line: refused with their range, before any work ---
expect_rc 1 "--threads 2147483647" "$PT" imagefolder "$W/alt" "$W/t1" --threads 2147483647
expect_out "--threads 2147483647 is out of range: give 0 \(all allowed cores\) to [0-9]+" "the range is given"
expect_rc 1 "--threads 100000 for verify" "$PT" verify --threads 100000 "$W/p"
expect_out "--threads 100000 is out of range" "verify's --threads is bounded too"
expect_rc 1 "--threads -1" "$PT" imagefolder "$W/alt" "$W/t1" --threads -1
expect_text "--threads -1 is negative" "a negative count is named as such"
expect_rc 1 "--shards 4294967297" "$PT" cifar100 "$W/c" "$W/t1" --shards 4294967297
expect_out "--shards 4294967297 is out of range: give 0 .* to [0-9]+" "shards bounded"
expect_rc 1 "fake-cifar100 --train -1" "$PT" fake-cifar100 "$W/t2" --train -1
expect_text "--train -1 is negative: give a whole number from 1 to 1000000" "train bounded"
expect_rc 1 "fake-cifar100 --test 100000000000" "$PT" fake-cifar100 "$W/t2" --test 100000000000
expect_text "--test 100000000000 is out of range: give 1 to 1000000" "test bounded"
for v in -1 99999999999999999999 0; do
  expect_rc 1 "--max-megapixels $v refused" "$PT" imagefolder "$W/alt" "$W/t1" --max-megapixels "$v"
  expect_out "--max-megapixels $v is (out of range|negative).* 1 to [0-9]+" "the range is given ($v)"
done
expect_rc 1 "export --index -1" "$PT" export "$W/p" --split test --index -1 --out "$W/x.png"
expect_text "--index -1 is negative: it must be 0 or more" "a negative index is named as such"
expect_rc 0 "--help states the bounds" "$PT" imagefolder --help
expect_out "--threads .*0 to 1024" "help: threads bound"
expect_out "--max-megapixels .*1 to [0-9]+" "help: megapixels bound"
[ ! -e "$W/t1" ] && [ ! -e "$W/t2" ] && ok "nothing written by refused commands" || fail "output left behind"

finish

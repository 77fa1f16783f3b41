#!/usr/bin/env bash
# End-to-end checks of the pack_tool command line on data made here:
# real files, real LMDB, real processes. Usage: pack_tool_cli_test.sh PACK_TOOL
set -uo pipefail
PT=$1
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/cli_lib.sh"

# --- CIFAR-100: fake data, pack, verify, info, export ---------------------
expect_rc 0 "fake-cifar100 writes a dataset" "$PT" fake-cifar100 "$W/c100" --train 600 --test 100 --seed 7
expect_rc 0 "pack cifar100" "$PT" cifar100 "$W/c100" "$W/packed" --shards 2
expect_out "packed .*700 samples" "summary counts both splits"
expect_rc 0 "verify an intact shard set" "$PT" verify "$W/packed"
expect_rc 0 "verify --quick" "$PT" verify --quick "$W/packed"
expect_rc 0 "info" "$PT" info "$W/packed"
expect_out "split train +600 samples, encoding raw, shape 32x32x3, 2 shards" "info describes the train split"
expect_rc 0 "info --json" "$PT" info --json "$W/packed"
cp "$W/out" "$W/info.json"
expect_rc 0 "info --json parses" $PY -c "import json; j=json.load(open('$W/info.json')); assert j['splits']['test']['num_samples']==100 and len(j['classes'])==100"

# export gives back the source pixels exactly (checked against train.bin itself)
expect_rc 0 "export index 321" "$PT" export "$W/packed" --split train --index 321 --out "$W/321.png"
expect_rc 0 "exported pixels equal train.bin record 321" $PY - "$W/c100/train.bin" "$W/321.png" 321 <<'PYEOF'
import sys, numpy as np
from PIL import Image
rec = np.fromfile(sys.argv[1], dtype=np.uint8).reshape(-1, 3074)[int(sys.argv[3])]
want = rec[2:].reshape(3, 32, 32).transpose(1, 2, 0)
got = np.asarray(Image.open(sys.argv[2]).convert("RGB"))
assert got.shape == want.shape and (got == want).all(), "pixels differ"
PYEOF
expect_rc 1 "export out of range" "$PT" export "$W/packed" --split test --index 100 --out "$W/x.png"
expect_out "index 100 out of range: split 'test' has 100 samples" "out-of-range export names the split and size"

# real LMDB: python3-lmdb and mdb_stat open the shards
expect_rc 0 "python3-lmdb reads a shard" $PY - "$W/packed/train/shard-00001" <<'PYEOF'
import sys, struct, lmdb
env = lmdb.open(sys.argv[1], readonly=True, lock=False, subdir=True)
with env.begin() as txn:
    first = next(iter(txn.cursor()))
    key, val = first
    assert struct.unpack(">Q", key)[0] == 300, key
    assert val[:4] == b"NLRC" and len(val) == 32 + 3072
    assert env.stat()["entries"] == 300
PYEOF
expect_rc 0 "mdb_stat reads a shard" mdb_stat "$W/packed/train/shard-00000"
expect_out "Entries: 300" "mdb_stat counts the records"

# deterministic: same input, byte-identical shards
expect_rc 0 "pack again" "$PT" cifar100 "$W/c100" "$W/packed2" --shards 2 --threads 1
expect_rc 0 "byte-identical shards" cmp "$W/packed/train/shard-00001/data.mdb" "$W/packed2/train/shard-00001/data.mdb"

expect_rc 1 "--encoding keep is refused for CIFAR-100" "$PT" cifar100 "$W/c100" "$W/keep" --encoding keep
expect_out "CIFAR-100 takes raw, png or jpeg" "the refusal says what works"

# existing OUT refused without --force
expect_rc 1 "existing OUT refused" "$PT" cifar100 "$W/c100" "$W/packed"
expect_out "already exists \(use --force" "refusal says how to override"
expect_rc 0 "--force replaces" "$PT" cifar100 "$W/c100" "$W/packed" --force --label coarse

# the official tarball, read without unpacking
mkdir -p "$W/tar/cifar-100-binary" && cp "$W/c100"/* "$W/tar/cifar-100-binary/"
tar -C "$W/tar" -czf "$W/cifar-100-binary.tar.gz" cifar-100-binary
expect_rc 0 "pack from cifar-100-binary.tar.gz" "$PT" cifar100 "$W/cifar-100-binary.tar.gz" "$W/from_tar" --shards 2
expect_rc 0 "tarball gives the same shards" cmp "$W/packed2/test/shard-00000/data.mdb" "$W/from_tar/test/shard-00000/data.mdb"

# a CIFAR file of the wrong size
mkdir -p "$W/badc" && cp "$W/c100"/* "$W/badc/" && printf 'xyz' >>"$W/badc/test.bin"
expect_rc 1 "wrong-size test.bin fails" "$PT" cifar100 "$W/badc" "$W/badc_out"
expect_out "test.bin is 307403 bytes, not a multiple of the 3074-byte record size: the record at byte offset 307400" "error gives the byte offset"
[ ! -e "$W/badc_out" ] && ok "no OUT after a failed pack" || fail "OUT exists after a failed pack"

# kill -9 mid-pack: no OUT, and the next pack cleans the temporary up
"$PT" cifar100 "$W/c100" "$W/killed" --test-kill-after 500 --threads 1 >"$W/out" 2>&1
rc=$?
[ $rc -eq 137 ] && ok "pack killed by SIGKILL" || fail "pack was not killed (exit $rc)"
[ ! -e "$W/killed" ] && ok "no OUT after kill -9" || fail "OUT exists after kill -9"
ls -d "$W"/killed.tmp-* >/dev/null 2>&1 && ok "temporary left behind by the killed pack" || fail "no temporary?"
expect_rc 0 "pack after a killed pack" "$PT" cifar100 "$W/c100" "$W/killed"
ls -d "$W"/killed.tmp-* >/dev/null 2>&1 && fail "stale temporary not removed" || ok "stale temporary removed"
expect_rc 0 "verify after recovery" "$PT" verify "$W/killed"

# Ctrl-C mid-pack: exit 130, nothing left behind
expect_rc 130 "pack interrupted by SIGINT" "$PT" cifar100 "$W/c100" "$W/interrupted" --test-interrupt-after 500 --threads 1
expect_out "interrupted" "interruption is reported"
ls -d "$W"/interrupted* >/dev/null 2>&1 && fail "an interrupted pack left files" || ok "an interrupted pack leaves nothing"

# disk full (simulated with a file-size limit): a clear error, nothing left behind
expect_rc 1 "pack into a full disk fails" bash -c "ulimit -f 2048; exec '$PT' cifar100 '$W/c100' '$W/full'"
expect_out "cannot (write|commit) .*shard-00000.*: (Input/output error|File too large|No space left)" "the error names the shard and the cause"
ls -d "$W"/full* >/dev/null 2>&1 && fail "a failed pack left files" || ok "a failed pack leaves nothing"

# verify finds damage: flip bytes in the middle of a shard file
cp -r "$W/packed2" "$W/damaged"
$PY - "$W/damaged/train/shard-00000/data.mdb" <<'PYEOF'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
for off in range(len(b) // 2, len(b) // 2 + 64, 8): b[off] ^= 0x5A
open(p, "wb").write(bytes(b))
PYEOF
expect_rc 1 "verify fails on a damaged shard" "$PT" verify "$W/damaged"
expect_out "^train/shard-00000( index [0-9]+)?: " "problems are named by shard (and index)"

# --- ImageFolder: Pillow and torchvision as the reference ------------------
expect_rc 0 "make an ImageFolder of many image kinds (Pillow)" $PY "$HERE/make_imagefolder.py" "$W/imf"
expect_rc 0 "pack imagefolder (keep)" "$PT" imagefolder "$W/imf" "$W/imf_packed"
expect_rc 0 "verify imagefolder pack" "$PT" verify "$W/imf_packed"
expect_rc 0 "decoded pixels and order equal Pillow/torchvision" $PY "$HERE/check_against_pillow.py" "$PT" "$W/imf" "$W/imf_packed" "$W/exp"
cat "$W/out" | sed 's/^/    /'
expect_rc 0 "add a val split (raw)" "$PT" imagefolder "$W/imf" "$W/imf_packed" --split val --encoding raw
expect_rc 0 "verify with two splits" "$PT" verify "$W/imf_packed"
expect_rc 1 "same split again refused" "$PT" imagefolder "$W/imf" "$W/imf_packed" --split val

# --max-side: the 23x17 images stored at 12x9 (Pillow's bilinear resize),
# their original sizes in the manifest; verify holds each record to them.
expect_rc 0 "pack with --max-side 12 --encoding png" "$PT" imagefolder "$W/imf" "$W/imf_small" --max-side 12 --encoding png
expect_rc 0 "verify the --max-side pack" "$PT" verify "$W/imf_small"
expect_rc 0 "--max-side: Pillow's resize of every image; the manifest's original sizes are the files'" \
  $PY "$HERE/check_against_pillow.py" "$PT" "$W/imf" "$W/imf_small" "$W/exp_small" 12
expect_rc 0 "info names --max-side" "$PT" info "$W/imf_small"
expect_out "packed with --max-side 12 \(the manifest keeps each original size\)" "info says how it was packed"
expect_rc 0 "--max-side with keep: resized images re-encoded in their own format" \
  "$PT" imagefolder "$W/imf" "$W/imf_small_keep" --max-side 12 --quality 80
expect_rc 0 "verify it" "$PT" verify "$W/imf_small_keep"
expect_rc 0 "--encoding jpeg --max-side 16" "$PT" imagefolder "$W/imf" "$W/imf_jpeg" --encoding jpeg --max-side 16
expect_rc 0 "verify it" "$PT" verify "$W/imf_jpeg"

# --jpeg-restarts: every sequential JPEG stored (kept and re-encoded) has a
# restart marker at each row of MCUs and still decodes to Pillow's pixels;
# progressive ones and PNGs are the files' bytes; without it keep stores the
# files' bytes.
expect_rc 0 "pack with --jpeg-restarts" "$PT" imagefolder "$W/imf" "$W/imf_rst" --jpeg-restarts
expect_rc 0 "verify it" "$PT" verify "$W/imf_rst"
expect_rc 0 "--jpeg-restarts: pixels and order equal Pillow/torchvision" \
  $PY "$HERE/check_against_pillow.py" "$PT" "$W/imf" "$W/imf_rst" "$W/exp_rst"
expect_rc 1 "--jpeg-restarts with --encoding png refused" "$PT" imagefolder "$W/imf" "$W/imf_rst_png" --jpeg-restarts --encoding png
expect_out "--jpeg-restarts rewrites the JPEGs stored, and --encoding png stores none" "the refusal says why"
expect_rc 0 "info names --jpeg-restarts" "$PT" info "$W/imf_rst"
expect_out "packed with --jpeg-restarts" "info says how it was packed"
expect_rc 0 "the records: restarts in every sequential JPEG with the flag, the files' bytes without" \
  $PY - "$W/imf_packed/train/shard-00000" "$W/imf_rst/train/shard-00000" "$W/imf_rst/manifest.json" <<'PYEOF'
import json, lmdb, sys
def payloads(path):
    with lmdb.open(path, readonly=True, lock=False, subdir=True) as env, env.begin() as t:
        return [bytes(v[32:]) for _, v in t.cursor()]
def restart_interval(jpg):  # DRI's value in the header, 0 when none
    i = 2
    while i + 4 <= len(jpg) and jpg[i] == 0xFF:
        m, n = jpg[i + 1], int.from_bytes(jpg[i + 2:i + 4], "big")
        if m == 0xDD: return int.from_bytes(jpg[i + 4:i + 6], "big")
        if m == 0xDA: return 0
        i += 2 + n
    return 0
kept, rst = payloads(sys.argv[1]), payloads(sys.argv[2])
assert len(kept) == len(rst) > 0
jpegs = 0
for a, b in zip(kept, rst):
    if not a.startswith(b"\xff\xd8"):
        assert a == b, "a PNG changed"; continue
    assert restart_interval(a) == 0, "the kept file already restarts?"
    progressive = any(a[i] == 0xFF and a[i + 1] == 0xC2 for i in range(len(a) - 1))
    if progressive:
        assert a == b, "a progressive JPEG changed"; continue
    assert restart_interval(b) > 0 and b.count(b"\xff\xd0") >= 1, "no restarts"
    jpegs += 1
assert jpegs >= 5, jpegs
assert json.load(open(sys.argv[3]))["splits"]["train"]["jpeg_restarts"] is True
print(f"{jpegs} sequential JPEGs restart at every row")
PYEOF
sed -i 's/"max_side": 12,/"max_side": 13,/' "$W/imf_small/manifest.json"
expect_rc 1 "verify finds records that do not fit the manifest's max_side" "$PT" verify "$W/imf_small"
expect_out "image is 12x9 but --max-side 13 of its original 23x17 \(manifest\) gives 13x10" "the problem names both sizes"
for bad in "--max-side -1" "--max-side 1048577" "--max-side x" "--quality 0" "--quality 101"; do
  # shellcheck disable=SC2086
  expect_rc 1 "$bad refused" "$PT" imagefolder "$W/imf" "$W/imf_refused" $bad
done
expect_out "--quality 101 is (out of range|outside)" "the refusal names the flag"

# bad files: stop with a named error, or skip and count
printf 'not an image' >"$W/imf/class_b/zzz_bad.jpg"
expect_rc 1 "a bad file stops the pack" "$PT" imagefolder "$W/imf" "$W/imf_bad"
expect_out "class_b/zzz_bad.jpg: not an image" "error names the file and the reason"
[ ! -e "$W/imf_bad" ] && ok "no OUT after the bad file" || fail "OUT exists after the bad file"
expect_rc 0 "--skip-bad packs the rest" "$PT" imagefolder "$W/imf" "$W/imf_bad" --skip-bad
expect_out ", 1 skipped," "summary counts the skipped file"
expect_out "skipped .*zzz_bad.jpg" "summary lists the skipped file"

finish

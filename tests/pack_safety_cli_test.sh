#!/usr/bin/env bash
# pack_tool against hostile use: concurrent packs into one OUT, --force aimed
# at the source or at something that is not a shard set, names that are not
# UTF-8, a full disk, an address-space limit. Real processes, real files.
# Usage: pack_safety_cli_test.sh PACK_TOOL
# Parts (NL_TEST_PART, see cli_lib.sh): main, disk-full (mounts a tmpfs),
# address-limit (ulimit -v; not under AddressSanitizer).
set -uo pipefail
PT=$1
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/cli_lib.sh"

# An ImageFolder of 3 classes x 150 small PNGs, so packs take a moment.
setup "make an ImageFolder" $PY - "$W/imf" <<'PYEOF'
import os, sys
import numpy as np
from PIL import Image
rng = np.random.default_rng(3)
for c in ("a", "b", "c"):
    d = os.path.join(sys.argv[1], c)
    os.makedirs(d)
    for i in range(150):
        Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)).save(f"{d}/{i:03d}.png")
PYEOF

setup "make a CIFAR-100" "$PT" fake-cifar100 "$W/c100" --train 3000 --test 10

splits_of() {  # prints the sorted split names of a shard set's manifest
  $PY -c "import json,sys; print(' '.join(sorted(json.load(open(sys.argv[1]+'/manifest.json'))['splits'])))" "$1"
}

if part main; then
# --- concurrent packs into one OUT ------------------------------------------
pids=()
for i in 0 1 2 3; do
  "$PT" imagefolder "$W/imf" "$W/multi" --split "s$i" --threads 1 >"$W/multi.$i.log" 2>&1 &
  pids+=($!)
done
for i in 0 1 2 3; do
  wait "${pids[$i]}"
  check_rc $? 0 "concurrent pack of split s$i exits 0"
done
[ "$(splits_of "$W/multi")" = "s0 s1 s2 s3" ] && ok "all four concurrent splits are in the manifest" ||
  fail "manifest lists only: $(splits_of "$W/multi")"
expect_rc 0 "verify the concurrently packed set" "$PT" verify --quick "$W/multi"
[ "$(ls -A "$W/multi")" = "$(printf 'manifest.json\ns0\ns1\ns2\ns3')" ] && ok "no temporaries left in OUT" ||
  fail "OUT holds: $(ls -A "$W/multi" | tr '\n' ' ')"
ls "$W"/multi.pack-lock "$W"/multi.tmp-* >/dev/null 2>&1 && fail "lock file or temporary left beside OUT" ||
  ok "no lock file or temporary left beside OUT"

# two packs into the same new OUT: one success, one clear refusal
for kind in cifar imf; do
  if [ $kind = cifar ]; then
    cmd=(cifar100 "$W/c100" "$W/same_$kind" --threads 1)
  else
    cmd=(imagefolder "$W/imf" "$W/same_$kind" --threads 1)
  fi
  "$PT" "${cmd[@]}" >"$W/same.0.log" 2>&1 &
  p0=$!
  "$PT" "${cmd[@]}" >"$W/same.1.log" 2>&1 &
  p1=$!
  wait $p0; r0=$?
  wait $p1; r1=$?
  if [ $((r0 + r1)) -eq 1 ] && [ $((r0 * r1)) -eq 0 ]; then
    ok "$kind: two packs into one new OUT: one succeeds, one fails"
  else
    fail "$kind: two packs into one new OUT exited $r0 and $r1"
  fi
  grep -qs "already exists" "$W/same.0.log" "$W/same.1.log" && ok "$kind: the loser says OUT already exists" ||
    fail "$kind: no 'already exists' in: $(cat "$W/same.0.log" "$W/same.1.log")"
  expect_rc 0 "$kind: the winner's set verifies" "$PT" verify --quick "$W/same_$kind"
done

# a pack waits for the holder of OUT's lock, says so, and then packs
exec 9>"$W/waited.pack-lock"
flock 9
"$PT" imagefolder "$W/imf" "$W/waited" 9>&- >"$W/waited.log" 2>&1 &
pw=$!
for _ in $(seq 600); do  # a poll for the message, not a timing check
  grep -qs "waiting for another pack" "$W/waited.log" && break
  sleep 0.1
done
[ -e "$W/waited" ] && fail "packed while another pack held the lock" || ok "no OUT while the lock is held"
exec 9>&-
wait $pw
check_rc $? 0 "the waiting pack finishes once the lock is free"
cp "$W/waited.log" "$W/out"
expect_text "waiting for another pack into $W/waited to finish (lock file $W/waited.pack-lock)" \
  "the wait is announced with the lock file's name"

# a temporary whose lock is held survives, whatever its pid (other PID namespace)
mkdir -p "$W/ns.tmp-4194311/train"
exec 8>"$W/ns.tmp-4194311/.pack-lock"
flock 8
expect_rc 0 "pack beside a held temporary with a dead pid" "$PT" imagefolder "$W/imf" "$W/ns" 8>&-
[ -d "$W/ns.tmp-4194311/train" ] && ok "a temporary in use is kept" || fail "a temporary in use was removed"
exec 8>&-
expect_rc 0 "pack again once its lock is free" "$PT" imagefolder "$W/imf" "$W/ns" --force
[ -e "$W/ns.tmp-4194311" ] && fail "a stale temporary was kept" || ok "a stale temporary is removed"

# --- --force never deletes the source or what is not a shard set ------------
mkdir -p "$W/fsrc" && cp -r "$W/imf" "$W/fsrc/train" && echo keep >"$W/fsrc/notes.txt"
expect_rc 1 "--force into the directory holding SRC is refused" "$PT" imagefolder "$W/fsrc/train" "$W/fsrc" --force
expect_out "SRC .* is inside OUT" "the refusal says why"
ln -s "$W/fsrc" "$W/fsrc_link"
expect_rc 1 "... also through a symlink" "$PT" imagefolder "$W/fsrc/train" "$W/fsrc_link" --replace-non-shard-set
expect_rc 1 "OUT inside SRC is refused" "$PT" imagefolder "$W/fsrc/train" "$W/fsrc/train/packed" --force
expect_out "OUT .* is inside SRC" "the refusal says why"
expect_rc 1 "cifar100: OUT holding SRC is refused" "$PT" cifar100 "$W/c100" "$W" --force
[ "$(find "$W/fsrc/train" -name '*.png' | wc -l)" -eq 450 ] && [ -f "$W/fsrc/notes.txt" ] && [ -f "$W/c100/train.bin" ] &&
  ok "the sources are intact" || fail "source files were deleted"
mkdir -p "$W/thesis" && echo precious >"$W/thesis/thesis.tex"
expect_rc 1 "--force over a directory that is not a shard set is refused" "$PT" imagefolder "$W/imf" "$W/thesis" --force
expect_out "is not a shard set .*--replace-non-shard-set" "the refusal names the flag that would do it"
expect_rc 1 "cifar100 too" "$PT" cifar100 "$W/c100" "$W/thesis" --force
[ -f "$W/thesis/thesis.tex" ] && ok "the directory is intact" || fail "the directory was deleted"
expect_rc 0 "--replace-non-shard-set replaces it" "$PT" cifar100 "$W/c100" "$W/thesis" --replace-non-shard-set
[ -f "$W/thesis/manifest.json" ] && [ ! -e "$W/thesis/thesis.tex" ] && ok "replaced by a shard set" || fail "not replaced"
expect_rc 0 "--help" "$PT" imagefolder --help
expect_out "replace-non-shard-set" "--help lists --replace-non-shard-set"
expect_out "never deletes anything else" "--help says what --force will not delete"

# --- names that are not UTF-8 -----------------------------------------------
mkdir -p "$W/latin"
cp -r "$W/imf/a" "$W/latin/$(printf 'caf\xe9')"
cp -r "$W/imf/b" "$W/latin/b"
printf 'junk' >"$W/latin/b/$(printf 'bad\xff').png"
expect_rc 0 "a class and a skipped file whose names are not UTF-8 pack" "$PT" imagefolder "$W/latin" "$W/latin_packed" --skip-bad
expect_out ", 1 skipped," "the bad file is skipped"
expect_rc 0 "the set verifies" "$PT" verify "$W/latin_packed"
expect_rc 0 "info --json works" "$PT" info --json "$W/latin_packed"
expect_rc 0 "names are stored escaped and read back as bytes" $PY - "$W/latin_packed/manifest.json" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
assert m["classes"] == ["b", "caf\\xE9"], m["classes"]
assert m["splits"]["train"]["skipped"][0]["path"].endswith("/b/bad\\xFF.png"), m["splits"]["train"]["skipped"]
PYEOF
ls -d "$W"/latin_packed.* >/dev/null 2>&1 && fail "temporaries left behind" || ok "nothing left beside OUT"
odd_out="$W/$(printf 'out\xf0')"
expect_rc 0 "an OUT whose name is not UTF-8" "$PT" imagefolder "$W/latin" "$odd_out" --skip-bad
expect_rc 0 "info --json on it" "$PT" info --json "$odd_out"
expect_text '"root": "'"$W"'/out\\xF0"' "info --json escapes the root as the manifest does"

fi  # part main

# --- disk full: named as such, with the file --------------------------------
if part disk-full; then
mkdir -p "$W/tiny"
if mount -t tmpfs -o size=1m tmpfs "$W/tiny" 2>/dev/null; then
  expect_rc 1 "pack onto a full file system fails" "$PT" cifar100 "$W/c100" "$W/tiny/out"
  expect_out "no space left on device writing .*/train/shard-00000/data.mdb" "the error says no space left and names the file"
  grep -qs "Input/output error" "$W/out" && fail "reported as an I/O error" || ok "not reported as an I/O error"
  [ -z "$(ls -A "$W/tiny")" ] && ok "nothing left on the full file system" || fail "left: $(ls -A "$W/tiny")"
  umount "$W/tiny"
else
  skip "the tmpfs disk-full check (cannot mount tmpfs here)"
fi
fi  # part disk-full

# --- an address-space limit: the map grows instead of reserving 1 TiB -------
# (AddressSanitizer reserves terabytes of shadow memory, so no ASan build runs
# under ulimit -v: these checks belong to the normal build.)
# (Not "ldd | grep -q": under pipefail, grep -q ending first fails ldd with
# SIGPIPE and the pipeline with it, so the ASan build was taken as a normal one.)
if ! part address-limit; then
  :
elif [[ $(ldd "$PT" 2>/dev/null) == *libasan* ]]; then
  skip "the ulimit -v checks (AddressSanitizer build)"
else
expect_rc 0 "pack under ulimit -v 8000000" bash -c "ulimit -v 8000000; exec '$PT' cifar100 '$W/c100' '$W/limited' --shards 1"
expect_rc 0 "imagefolder under ulimit -v 8000000" bash -c "ulimit -v 8000000; exec '$PT' imagefolder '$W/imf' '$W/limited_imf'"
expect_rc 0 "the set packed under the limit verifies" "$PT" verify "$W/limited"
# A limit the shard cannot fit in: the error names the shard and the limit.
expect_rc 0 "a bigger CIFAR-100" "$PT" fake-cifar100 "$W/c100_big" --train 90000 --test 10
expect_rc 1 "a shard larger than ulimit -v allows fails" bash -c "ulimit -v 600000; exec '$PT' cifar100 '$W/c100_big' '$W/too_big' --shards 1 --threads 1"
expect_out "Limit exceeded: cannot (grow the LMDB map of|open) shard .*/train/shard-00000 .*the address-space limit \(ulimit -v\) is 585 MiB" \
  "the error names the shard and the address-space limit"
ls -d "$W"/too_big* >/dev/null 2>&1 && fail "a failed pack left files" || ok "a failed pack leaves nothing"
rm -rf "$W/c100_big"
fi

finish

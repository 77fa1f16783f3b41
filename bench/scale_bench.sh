#!/usr/bin/env bash
# How the loader's cost grows with the split, in one run: a 50,000-record and
# a 1,000,000-record split of CIFAR-sized records (3 KiB, packed raw; 32 px,
# no resize, so the figures are I/O and access, not pixels), read by one
# loader thread (--threads) in each order (random, blocks, auto), first in the page cache,
# then in a memory cgroup of --limit bytes with the page cache dropped (the
# 1M split is then ~3.8x the memory it may use; OOM kills in it counted), against the disk's own rates
# measured in the same cgroup in the same run: random 4 KiB preads (one at a
# time) and one shard read front to back (1 MiB reads). The page cache's
# random rows are the median of three runs, the two splits in turn. "cores
# used" counts the loader's reader threads too (blocks order reads its
# windows on threads of its own that mostly wait on the disk).
# Then a JPEG set (--jpeg N files shaped like ImageNet's, ~50 KB each; 0 skips
# it), packed as the files' bytes, decoded and resized to 224 px, in the page
# cache and in a cgroup of --jpeg-limit bytes (the set ~4x that), against
# torchvision's ImageFolder reading the same files (bench/torchvision_baseline.py,
# one core, no worker process) in the same place.
#   bench/scale_bench.sh [WORKDIR] [--limit BYTES] [--batches N] [--threads N]
#                        [--jpeg N] [--jpeg-limit BYTES] [--only cifar|jpeg]
# Root is needed for the cgroup rows (cgroup v1's memory controller, or v2's
# memory.max) and to drop the page cache; where the machine does not allow
# it, those rows are skipped with a line saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-build/scale-bench}
limit=$((1 << 30))
batches=15625  # 1,000,000 records a row (64 a batch): a whole epoch of the 1M split, 20 of the 50k
threads=1
jpeg=40000
jpeg_limit=$((512 << 20))
only=""
shift || true
while [ $# -gt 0 ]; do
  case $1 in
    --limit) limit=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --jpeg) jpeg=$2; shift 2 ;;
    --jpeg-limit) jpeg_limit=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "scale_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for v in "limit=$limit" "batches=$batches" "threads=$threads" "jpeg=$jpeg" "jpeg-limit=$jpeg_limit"; do
  [[ ${v#*=} =~ ^[0-9]{1,15}$ ]] || { echo "scale_bench.sh: --${v%%=*} must be a whole number, not '${v#*=}'" >&2; exit 2; }
done
case $only in "" | cifar | jpeg) ;; *) echo "scale_bench.sh: --only takes cifar or jpeg, not '$only'" >&2; exit 2 ;; esac
B=build/bin
PY=/usr/bin/python3
for t in pack_tool loader_bench; do
  [ -x "$B/$t" ] || { echo "build first: $B/$t is missing" >&2; exit 1; }
done
mkdir -p "$work"

make_set() {  # NAME RECORDS
  [ -f "$work/$1/manifest.json" ] && return
  "$B/pack_tool" fake-cifar100 "$work/$1-src" --train "$2" --test 10 --seed 5 >/dev/null
  "$B/pack_tool" cifar100 "$work/$1-src" "$work/$1" >/dev/null 2>&1
  rm -rf "$work/$1-src"
}
if [ "$only" != jpeg ]; then
  make_set s50k 50000
  make_set s1m 1000000
fi

# --- the memory cgroup ---------------------------------------------------------
cg=""
cg_why=""
if [ "$(id -u)" -ne 0 ]; then
  cg_why="not root"
elif [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
  cg=/sys/fs/cgroup/nl-scale-$$  # cgroup v2
  mkdir "$cg" && echo "$limit" >"$cg/memory.max" && { echo 0 >"$cg/memory.swap.max" 2>/dev/null || true; } ||
    { cg_why="cannot make a cgroup v2 with memory.max"; cg=""; }
elif [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/nl-scale-$$  # cgroup v1
  mkdir "$cg" && echo "$limit" >"$cg/memory.limit_in_bytes" ||
    { cg_why="cannot make a cgroup v1 with memory.limit_in_bytes"; cg=""; }
else
  cg_why="no memory cgroup controller"
fi
cleanup() { [ -n "$cg" ] && rmdir "$cg" 2>/dev/null || true; }
trap cleanup EXIT
in_cg() { sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg" "$@"; }
drop_cache() { sync && echo 3 >/proc/sys/vm/drop_caches; }
warm() { cat "$work/$1"/train/*/data.mdb >/dev/null; }

loader() {  # SET ORDER [in_cg] -> "images/s|read-ahead MiB|plan line"
  local set=$1 order=$2 wrap=${3:-}
  local out
  out=$($wrap "$B/loader_bench" --data "$work/$set" --ranks 1 --threads-per-rank "$threads" --bind off \
    --image-size 32 --order "$order" --epochs 100 --max-batches "$batches" --json 2>"$work/err") ||
    { echo "error: $(tail -1 "$work/err")"; return; }
  echo "$out" | $PY -c "import json,sys; r=json.loads(sys.stdin.read())['ranks'][0]; print('%.0f|%.1f|%.0f|%.2f' % (r['images_per_s'], r['read_ahead_mib'], r['rss_anon_mib'], r['cores_used']))"
  grep -o "order .*" "$work/err" | head -1 >"$work/plan-$set-$order"
}

# The disk's random 4 KiB pread rate and its sequential rate (run in the
# cgroup, page cache dropped): "reads/s|bytes/s".
cat >"$work/disk.py" <<'PYEOF'
import glob, os, random, sys, time
files = sorted(glob.glob(os.path.join(sys.argv[1], "train", "*", "data.mdb")))
fds = [os.open(f, os.O_RDONLY) for f in files]
sizes = [os.fstat(fd).st_size for fd in fds]
for fd in fds:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
rng = random.Random(1)
n, t0 = 0, time.monotonic()
while time.monotonic() - t0 < 10:
    i = rng.randrange(len(fds))
    os.pread(fds[i], 4096, rng.randrange(sizes[i] // 4096) * 4096)
    n += 1
rand = n / (time.monotonic() - t0)
fd = fds[-1]
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
got, t0 = 0, time.monotonic()
while time.monotonic() - t0 < 10:
    b = os.pread(fd, 1 << 20, got)
    if not b:
        break
    got += len(b)
seq = got / (time.monotonic() - t0)
print("%.0f|%.0f" % (rand, seq))
PYEOF

if [ "$only" != jpeg ]; then
rec_bytes=$($PY -c "import json,sys; m=json.load(open(sys.argv[1])); s=m['splits']['train']; print(sum(x['bytes'] for x in s['shards']) // s['num_samples'])" "$work/s1m/manifest.json")
echo "== sets: 50,000 and 1,000,000 records of $rec_bytes bytes; $threads loader thread(s), 32 px, batches of 64, $batches batches a row"
printf '| split | where | order | img/s | read-ahead MiB | anon RSS MiB | cores used |\n|---|---|---|---:|---:|---:|---:|\n'
declare -A rate
# Random order, the two splits in turn, three times: the page-cache target
# compares them, and this machine's run-to-run spread is wide (another
# guest's load, the host's reclaim); the median of each is the figure.
declare -A runs
for i in 1 2 3; do
  for set in s1m s50k; do
    warm "$set"
    IFS='|' read -r r ahead rss cores <<<"$(loader "$set" random)"
    runs[$set]+="$r "
  done
done
# The page cache's pages: a split held in 2 MiB folios is mapped with 2 MiB
# entries (few TLB misses); in 4 KiB pages (a fragmented memory, a file
# written rather than read) the 1M split's random reads each miss the TLB.
echo "page cache after the random rows: $(awk '/^Cached:/ {c = $2} /^FileHugePages:/ {h = $2} END {printf "%d MiB, %d MiB of it in 2 MiB folios", c / 1024, h / 1024}' /proc/meminfo)"
for set in s50k s1m; do
  warm "$set"
  for order in random blocks auto; do
    if [ "$order" = random ]; then
      r=$(echo "${runs[$set]}" | tr ' ' '\n' | grep . | sort -n | sed -n 2p)
      ahead=0.0
      rss="-"
      cores="-"
      order_label="random (median of ${runs[$set]% })"
    else
      IFS='|' read -r r ahead rss cores <<<"$(loader "$set" "$order")"
      order_label=$order
    fi
    rate[$set-cache-$order]=$r
    printf '| %s | page cache | %s | %s | %s | %s | %s |\n' "$set" "$order_label" "$r" "$ahead" "$rss" "$cores"
  done
done
if [ -z "$cg" ]; then
  echo "(the memory-cgroup rows are skipped: $cg_why)"
else
  for order in random blocks auto; do
    drop_cache
    IFS='|' read -r r ahead rss cores <<<"$(loader s1m "$order" in_cg)"
    rate[s1m-cg-$order]=$r
    printf '| s1m | %s cgroup, cache dropped | %s | %s | %s | %s | %s |\n' "$(numfmt --to=iec "$limit")" "$order" "$r" "$ahead" "$rss" "$cores"
  done
  # Blocks order with a loader thread per core, as a rank would run it here.
  ncores=$(nproc)
  if [ "$ncores" -gt "$threads" ]; then
    drop_cache
    IFS='|' read -r r ahead rss cores <<<"$(threads=$ncores loader s1m blocks in_cg)"
    rate[s1m-cg-blocks-all]=$r
    printf '| s1m | %s cgroup, cache dropped | blocks, %s threads | %s | %s | %s | %s |\n' "$(numfmt --to=iec "$limit")" "$ncores" "$r" "$ahead" "$rss" "$cores"
  fi
  oom=$({ cat "$cg/memory.events" "$cg/memory.oom_control" 2>/dev/null || true; } | awk '$1 == "oom_kill" { n += $2 } END { print n + 0 }')
  echo "OOM kills in the cgroup during those rows: $oom"
  drop_cache
  IFS='|' read -r drand dseq <<<"$(in_cg $PY "$work/disk.py" "$work/s1m")"
  seq_recs=$((dseq / rec_bytes))
  echo
  echo "disk, same cgroup, cache dropped: random 4 KiB preads $drand/s; one shard sequentially $((dseq / 1000000)) MB/s ($seq_recs records/s)"
  $PY - "${rate[s1m-cg-random]}" "${rate[s1m-cg-blocks]}" "$drand" "$seq_recs" "${rate[s1m-cache-random]}" "${rate[s50k-cache-random]}" "${rate[s1m-cg-blocks-all]:-0}" <<'PYEOF'
import sys
rnd, blk, drand, dseq, big, small, blk_all = (float(x) for x in sys.argv[1:])
print("random order: %.0f%% of the disk's random 4 KiB read rate (target >= 50%%)" % (100 * rnd / drand))
print("blocks order: %.0f%% of its sequential rate in records (target >= 40%%)" % (100 * blk / dseq))
if blk_all:
    print("blocks order, a loader thread per core: %.0f%% of it" % (100 * blk_all / dseq))
print("page cache: the 1M split at %.0f%% of the 50k split's rate, random order (target >= 80%%)" % (100 * big / small))
PYEOF
fi
for f in "$work"/plan-s1m-*; do echo "$(basename "$f"): $(cat "$f")"; done
fi

# --- JPEG files ----------------------------------------------------------------
{ [ "$jpeg" -gt 0 ] && [ "$only" != cifar ]; } || exit 0
if [ ! -f "$work/jpeg/manifest.json" ]; then
  rm -rf "$work/jpeg-src"
  $PY bench/make_jpeg_folder.py "$work/jpeg-src" --images "$jpeg"
  "$B/pack_tool" imagefolder "$work/jpeg-src" "$work/jpeg" >/dev/null 2>&1
fi
jbytes=$(du -sb "$work/jpeg-src" | cut -f1)
jbatches=60  # 3,840 images a row of ours; torchvision reads 1,000 (after its first batch)
echo
echo "== JPEG: $jpeg files, $((jbytes / 1000000)) MB, decoded and resized to 224 px (normalized float32), $threads loader thread(s) against torchvision's ImageFolder on one core"
printf '| set | where | reader | img/s | anon RSS MiB |\n|---|---|---|---:|---:|\n'
jloader() {  # ORDER [in_cg] -> "images/s|rss"
  local out
  out=$(${2:-} "$B/loader_bench" --data "$work/jpeg" --ranks 1 --threads-per-rank "$threads" --bind off \
    --image-size 224 --normalize --order "$1" --epochs 100 --max-batches "$jbatches" --json 2>"$work/err") ||
    { echo "error: $(tail -1 "$work/err")|"; return; }
  grep -o "order .*" "$work/err" | head -1 >"$work/plan-jpeg-$1"
  echo "$out" | $PY -c "import json,sys; r=json.loads(sys.stdin.read())['ranks'][0]; print('%.0f|%.0f' % (r['images_per_s'], r['rss_anon_mib']))"
}
jtorch() {  # [in_cg] -> "images/s|-"
  local out
  out=$(${1:-} $PY bench/torchvision_baseline.py --root "$work/jpeg-src" --workers 0 --max-images 1000 \
    --image-size 224 --squash 2>"$work/err") || { echo "error: $(tail -1 "$work/err")|"; return; }
  echo "$out" | $PY -c "import json,sys; print('%.0f|-' % json.loads(sys.stdin.read())['images_per_s'])"
}
cat "$work/jpeg"/train/*/data.mdb >/dev/null
IFS='|' read -r r rss <<<"$(jloader random)"
printf '| jpeg | page cache | ours, random | %s | %s |\n' "$r" "$rss"
find "$work/jpeg-src" -type f -exec cat {} + >/dev/null
IFS='|' read -r r rss <<<"$(jtorch)"
printf '| jpeg | page cache | torchvision ImageFolder, files | %s | %s |\n' "$r" "$rss"
if [ -z "$cg" ]; then
  echo "(the memory-cgroup rows are skipped: $cg_why)"
else
  if [ -f "$cg/memory.max" ]; then echo "$jpeg_limit" >"$cg/memory.max"; else echo "$jpeg_limit" >"$cg/memory.limit_in_bytes"; fi
  where="$(numfmt --to=iec "$jpeg_limit") cgroup, cache dropped"
  for order in auto random; do
    drop_cache
    IFS='|' read -r r rss <<<"$(jloader "$order" in_cg)"
    printf '| jpeg | %s | ours, %s | %s | %s |\n' "$where" "$order" "$r" "$rss"
  done
  drop_cache
  IFS='|' read -r r rss <<<"$(jtorch in_cg)"
  printf '| jpeg | %s | torchvision ImageFolder, files | %s | %s |\n' "$where" "$r" "$rss"
  oom=$({ cat "$cg/memory.events" "$cg/memory.oom_control" 2>/dev/null || true; } | awk '$1 == "oom_kill" { n += $2 } END { print n + 0 }')
  echo "OOM kills in the cgroup, all rows: $oom"
fi
for f in "$work"/plan-jpeg-*; do echo "$(basename "$f"): $(cat "$f")"; done

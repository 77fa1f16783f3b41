#!/usr/bin/env bash
# Pack throughput against the raw read-through of the same files, in one run.
#   bench/pack_bench.sh [WORKDIR] [--runs N]
# Makes a CIFAR-100-sized fake (50,000 + 10,000 images, official binary
# format) and a 20,000-file ImageFolder of 32x32 PNGs, then reports for each
# the pack time (best of N runs, warm page cache) and, as baseline, the time
# of `tar -cf /dev/null` over the same source files. GNU tar skips reading
# file contents when the archive is /dev/null, so the time of
# `tar -cf - SRC | cat >/dev/null` (which reads every byte) is shown too.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-build/pack-bench}
runs=3
[ "${2:-}" = "--runs" ] && runs=$3
PT=build/bin/pack_tool
[ -x "$PT" ] || { echo "build first: scripts/test.sh or cmake --build build" >&2; exit 1; }
mkdir -p "$work"
threads=$(nproc)

if [ ! -f "$work/c100/train.bin" ]; then
  "$PT" fake-cifar100 "$work/c100" --train 50000 --test 10000 --seed 1 >/dev/null
fi
if [ ! -d "$work/imf" ]; then
  /usr/bin/python3 - "$work/c100/train.bin" "$work/imf" <<'PYEOF'
import os, sys, numpy as np
from PIL import Image
recs = np.fromfile(sys.argv[1], dtype=np.uint8).reshape(-1, 3074)[:20000]
for i, r in enumerate(recs):
    d = os.path.join(sys.argv[2], f"class_{r[1]:03d}")
    os.makedirs(d, exist_ok=True)
    Image.fromarray(r[2:].reshape(3, 32, 32).transpose(1, 2, 0)).save(os.path.join(d, f"{i:05d}.png"))
PYEOF
fi

now() { date +%s.%N; }
# best_of CMD...: prints the best wall time of $runs runs of CMD.
best_of() {
  local best=""
  for _ in $(seq "$runs"); do
    local t0 t1
    t0=$(now); "$@" >/dev/null 2>&1; t1=$(now)
    best=$(echo "$t0 $t1 $best" | awk '{d=$2-$1; if ($3=="" || d<$3) print d; else print $3}')
  done
  echo "$best"
}
tar_null() { tar -cf /dev/null -C "$1" .; }
tar_read() { tar -cf - -C "$1" . | cat >/dev/null; }
pack_cifar() { "$PT" cifar100 "$work/c100" "$work/c100.packed" --force --threads "$threads"; }
pack_imf() { "$PT" imagefolder "$work/imf" "$work/imf.packed" --force --threads "$threads"; }

tar_read "$work/c100"; tar_read "$work/imf"  # warm the page cache
c_pack=$(best_of pack_cifar); c_null=$(best_of tar_null "$work/c100"); c_read=$(best_of tar_read "$work/c100")
i_pack=$(best_of pack_imf); i_null=$(best_of tar_null "$work/imf"); i_read=$(best_of tar_read "$work/imf")

"$PT" verify --quick "$work/c100.packed" >/dev/null 2>&1 || { echo "packed CIFAR-100 does not verify" >&2; exit 1; }
"$PT" verify --quick "$work/imf.packed" >/dev/null 2>&1 || { echo "packed ImageFolder does not verify" >&2; exit 1; }

report() {  # name images pack tar_null tar_read
  awk -v n="$1" -v imgs="$2" -v p="$3" -v tn="$4" -v tr="$5" 'BEGIN {
    printf "%-28s %7d images  pack %6.2f s  %8.0f images/s | tar -cf /dev/null %6.2f s (pack = %.1fx) | tar | cat %6.2f s (pack = %.1fx)\n",
      n, imgs, p, imgs / p, tn, p / tn, tr, p / tr }'
}
echo "pack_bench: $threads threads, best of $runs runs, warm page cache"
report "CIFAR-100 (50k+10k, raw)" 60000 "$c_pack" "$c_null" "$c_read"
report "ImageFolder 20k PNG (keep)" 20000 "$i_pack" "$i_null" "$i_read"

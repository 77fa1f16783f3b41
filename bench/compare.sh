#!/usr/bin/env bash
# Our loader against the incident's torchvision pipeline, on the same cores,
# one after the other, in one run; plus thread scaling, memory, and the
# resize kernel against OpenCV.
#   bench/compare.sh [WORKDIR] [--images N]
# Needs a build (scripts/test.sh or cmake --build build) and Debian's
# python3-torchvision; OpenCV (libopencv-imgproc-dev) is optional.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-build/compare}
n=10000
[ "${2:-}" = "--images" ] && n=$3
B=${NL_BIN:-build/bin}  # NL_BIN: another build's binaries (bench/before_after.sh)
PY=/usr/bin/python3
for t in pack_tool loader_bench; do
  [ -x "$B/$t" ] || { echo "build first: $B/$t is missing" >&2; exit 1; }
done
mkdir -p "$work"

# One dataset: CIFAR-like 32x32 images, as an ImageFolder of PNGs and packed.
if [ ! -f "$work/c100/train.bin" ]; then
  "$B/pack_tool" fake-cifar100 "$work/c100" --train "$n" --test 100 --seed 3 >/dev/null
fi
if [ ! -d "$work/imf" ]; then
  $PY bench/cifar_folder.py "$work/c100/train.bin" "$work/imf"
fi
[ -d "$work/raw" ] || "$B/pack_tool" cifar100 "$work/c100" "$work/raw" >/dev/null 2>&1
[ -d "$work/png" ] || "$B/pack_tool" imagefolder "$work/imf" "$work/png" >/dev/null 2>&1

field() { $PY -c "import json,sys; j=json.loads(sys.stdin.read()); print($1)"; }
bench() {  # CPUS DATA THREADS BIND -> JSON
  taskset -c "$1" "$B/loader_bench" --data "$2" --ranks 1 --threads-per-rank "$3" --bind "$4" \
    --batch-size 64 --epochs 1 --json 2>/dev/null
}

echo "== one core (cpu 0): torchvision baseline vs ours, 32x32 -> 224x224"
base=$(taskset -c 0 $PY bench/torchvision_baseline.py --root "$work/imf" --workers 1 --max-images 3000)
base_ips=$(echo "$base" | field 'j["images_per_s_per_core"]')
raw=$(bench 0 "$work/raw" 1 on)
png=$(bench 0 "$work/png" 1 on)
raw_ips=$(echo "$raw" | field 'j["ranks"][0]["images_per_s"]')
png_ips=$(echo "$png" | field 'j["ranks"][0]["images_per_s"]')
printf "  %-58s %9.0f images/s\n" "torchvision (ImageFolder PNG, PIL, Resize, ToTensor, Normalize)" "$base_ips"
printf "  %-58s %9.0f images/s  (%.0fx the baseline)\n" "ours, raw shard set, uint8 NCHW" "$raw_ips" "$(echo "$raw_ips / $base_ips" | bc -l)"
printf "  %-58s %9.0f images/s  (%.0fx the baseline)\n" "ours, PNG records (decode + resize), uint8 NCHW" "$png_ips" "$(echo "$png_ips / $base_ips" | bc -l)"

if [ "$(nproc)" -ge 2 ]; then
  echo "== thread scaling (cpus 0,1; no binding, so the threads may use both)"
  one=$(bench 0,1 "$work/png" 1 off | field 'j["ranks"][0]["images_per_s"]')
  two=$(bench 0,1 "$work/png" 2 off | field 'j["ranks"][0]["images_per_s"]')
  printf "  PNG records: 1 thread %.0f images/s, 2 threads %.0f images/s: %.2fx\n" "$one" "$two" "$(echo "$two / $one" | bc -l)"
  oner=$(bench 0,1 "$work/raw" 1 off | field 'j["ranks"][0]["images_per_s"]')
  twor=$(bench 0,1 "$work/raw" 2 off | field 'j["ranks"][0]["images_per_s"]')
  printf "  raw records: 1 thread %.0f images/s, 2 threads %.0f images/s: %.2fx\n" "$oner" "$twor" "$(echo "$twor / $oner" | bc -l)"
fi

echo "== memory (one rank, raw, prefetch 4 x batch 64 x 224x224x3)"
echo "$raw" | field '"  anonymous RSS %.1f MiB = prefetch buffers %.1f MiB + %.1f MiB (bound: buffers + 64 MiB); mapped shard pages %.1f MiB" % (j["ranks"][0]["rss_anon_mib"], j["ranks"][0]["buffers_mib"], j["ranks"][0]["rss_anon_mib"] - j["ranks"][0]["buffers_mib"], j["ranks"][0]["rss_file_mib"])'

echo "== resize kernel vs OpenCV (one thread)"
if [ -x "$B/resize_bench" ]; then
  taskset -c 0 "$B/resize_bench" --seconds 2 | sed 's/^/  /'
else
  echo "  OpenCV not installed: apt-get install libopencv-imgproc-dev, rebuild, rerun"
fi

#!/usr/bin/env bash
# A change against the build before it, in one run: bench/compare.sh and
# bench/jpeg_compare.sh with the other build's binaries (NL_BIN), then with
# this tree's, on the same data (packed once), the baselines re-measured
# each time; then the lines that carry the figures, one build above the
# other.
#   bench/before_after.sh OLD_BIN_DIR [WORKDIR] [--images N] [--jpeg-images N] [--runs N]
# OLD_BIN_DIR: e.g. a worktree of the earlier commit built with
#   cmake -S . -B build -G Ninja -DNL_BUILD_TESTS=OFF && ninja -C build pack_tool loader_bench loader
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: bench/before_after.sh OLD_BIN_DIR [WORKDIR] [--images N] [--jpeg-images N] [--runs N]}
shift
work=build/before-after
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then work=$1; shift; fi
images=10000 jpeg_images=2000 runs=3
while [ $# -gt 0 ]; do
  case $1 in
    --images) images=$2; shift 2 ;;
    --jpeg-images) jpeg_images=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    *) echo "bench/before_after.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for t in pack_tool loader_bench loader; do
  [ -x "$old/$t" ] || { echo "bench/before_after.sh: $old/$t is missing (build the earlier tree first)" >&2; exit 1; }
  [ -x "build/bin/$t" ] || { echo "bench/before_after.sh: build/bin/$t is missing (build this tree first)" >&2; exit 1; }
done
mkdir -p "$work"
old=$(cd "$old" && pwd)
for which in before after; do
  bin=$([ "$which" = before ] && echo "$old" || echo "$PWD/build/bin")
  echo "== $which ($bin)"
  NL_BIN=$bin bench/compare.sh "$work/cifar" --images "$images" | tee "$work/compare-$which.txt"
  NL_BIN=$bin bench/jpeg_compare.sh "$work/jpeg" --images "$jpeg_images" --runs "$runs" |
    tee "$work/jpeg-$which.txt"
done
echo "== the figures, before then after"
for f in compare jpeg; do
  paste -d'\n' <(grep -E "ours|x the|images/s" "$work/$f-before.txt" | sed 's/^/before: /') \
    <(grep -E "ours|x the|images/s" "$work/$f-after.txt" | sed 's/^/after:  /')
done

#!/usr/bin/env bash
# JPEG photographs, one core, every pipeline in one run: a folder of
# ImageNet-sized JPEGs cut from the photographs python3-skimage and
# python3-sklearn ship (bench/make_photo_folder.py), packed once, then
#   torchvision (ImageFolder + PIL + the transform + PILToTensor),
#   PIL with draft() (DCT scaling), OpenCV full decode + crop + resize
#   (FFCV's method), the full-size decode alone (cv2.imdecode: the floor of
#   every full-decode loader), and ours (loader_bench, one thread), on the
#   pack of the files as they are and on a pack made with --jpeg-restarts,
# for the train transform (RandomResizedCrop 224 + flip) and the eval
# transforms (Resize 256 + CenterCrop 224, Resize 224 + CenterCrop 224; ours
# has the second only: its resize and crop share one size). Each process is
# pinned to one core (taskset); the figures are images/s, the median of
# --runs runs, the pipelines taking turns. Every pipeline is timed after its
# warm-up: the Python ones after their first batch (64 images), ours after
# each of its batch buffers was filled once (loader_bench's
# steady_images_per_s); ours timed from before its Open is printed too.
#
#   bench/jpeg_compare.sh [WORKDIR] [--images 2000] [--runs 3] [--measure 1000]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-build/jpeg-compare}
images=2000
runs=3
measure=1000
shift || true
while [ $# -gt 0 ]; do
  case $1 in
    --images) images=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --measure) measure=$2; shift 2 ;;
    *) echo "jpeg_compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for v in "images=$images" "runs=$runs" "measure=$measure"; do
  [[ ${v#*=} =~ ^[1-9][0-9]{0,8}$ ]] || { echo "jpeg_compare.sh: --${v%%=*} must be a whole number from 1, not '${v#*=}'" >&2; exit 2; }
done
PY=/usr/bin/python3
B=${NL_BIN:-build/bin}  # NL_BIN: another build's binaries (bench/before_after.sh)
for t in pack_tool loader_bench; do
  [ -x "$B/$t" ] || { echo "jpeg_compare.sh: $B/$t is missing: build first (scripts/test.sh)" >&2; exit 2; }
done
if ! $PY -c "import skimage, sklearn, cv2, torchvision" 2>/dev/null; then
  echo "jpeg_compare.sh: installing python3-skimage python3-sklearn python3-opencv python3-torchvision" >&2
  apt-get install -y python3-skimage python3-sklearn python3-opencv python3-torchvision >/dev/null
fi
mkdir -p "$work"
# Two runs on one work folder would remake and pack the set under each other.
exec 9>"$work/.lock"
flock -n 9 || { echo "jpeg_compare.sh: another run is using $work; wait for it or give another folder" >&2; exit 2; }
if [ ! -f "$work/photos.done" ] || [ "$(cat "$work/photos.done")" != "$images" ]; then
  rm -rf "$work/photos" "$work/packed" "$work/photos.done"
  $PY bench/make_photo_folder.py "$work/photos" --images "$images"
  "$B/pack_tool" imagefolder "$work/photos" "$work/packed" >/dev/null
  echo "$images" >"$work/photos.done"
fi
# The same files with a restart marker at every row (--jpeg-restarts): a
# crop's decode starts at the marker above it.
if [ ! -f "$work/packed-restarts/manifest.json" ] || [ "$work/packed-restarts/manifest.json" -ot "$work/photos.done" ]; then
  "$B/pack_tool" imagefolder "$work/photos" "$work/packed-restarts" --jpeg-restarts --force >/dev/null
fi
cat "$work"/packed/train/*/data.mdb "$work"/packed-restarts/train/*/data.mdb >/dev/null
find "$work/photos" -type f -exec cat {} + >/dev/null
core=$(($(nproc) > 1 ? 1 : 0))
pin() { taskset -c "$core" "$@"; }
batches=$(((measure + 63) / 64 + 4))  # + the warm-up: one batch per buffer (--prefetch 4)

ours() {  # TRANSFORM DECODE PACK -> images/s (DECODE: "" for the transform's default, or exact)
  local flags=(--resize shorter-crop)
  [ "$1" = train ] && flags=(--augment --random-resized-crop)
  [ -n "$2" ] && flags+=(--decode "$2")
  pin "$B/loader_bench" --data "$work/$3" --ranks 1 --threads-per-rank 1 --bind off --image-size 224 \
    "${flags[@]}" --epochs 1000 --max-batches "$batches" --json 2>"$work/err" |
    $PY -c "import json,sys; r = json.loads(sys.stdin.read())['ranks'][0]; print('%.0f %.0f' % (r['steady_images_per_s'], r['images_per_s']))" ||
    { echo "error: $(tail -1 "$work/err")"; }
}
theirs() {  # PIPELINE TRANSFORM -> images/s
  pin $PY bench/photo_pipelines.py --root "$work/photos" --pipeline "$1" --transform "$2" --images "$measure" \
    2>"$work/err" | $PY -c "import json,sys; print('%.0f' % json.loads(sys.stdin.read())['images_per_s'])" ||
    { echo "error: $(tail -1 "$work/err")"; }
}

rows=("train|torchvision" "train|pil-draft" "train|opencv" "train|decode-only" "train|ours" "train|ours-exact"
  "train|ours-restarts" "train|ours-exact-restarts"
  "eval256|torchvision" "eval256|pil-draft" "eval256|opencv"
  "eval|torchvision" "eval|pil-draft" "eval|opencv" "eval|ours" "eval|ours-restarts")
declare -A got from_open
for ((r = 1; r <= runs; r++)); do
  # Every other run goes through the rows backwards, so a pipeline does not
  # always run right after the same neighbour (in one run, ours --decode
  # exact beat fast, which it trails in interleaved pairs).
  n=${#rows[@]}
  for ((k = 0; k < n; k++)); do
    if ((r % 2)); then row=${rows[$k]}; else row=${rows[$((n - 1 - k))]}; fi
    tf=${row%%|*} pl=${row#*|}
    # "ours": --decode fast for train (auto, the default, decodes a 224 px
    # crop of these photographs exactly: docs/DECODE.md), the default
    # (exact) for eval.
    fast=""
    [ "$tf" = train ] && fast=fast
    case $pl in
      ours) v=$(ours "$tf" "$fast" packed) ;;
      ours-exact) v=$(ours "$tf" exact packed) ;;
      ours-restarts) v=$(ours "$tf" "$fast" packed-restarts) ;;
      ours-exact-restarts) v=$(ours "$tf" exact packed-restarts) ;;
      *) v=$(theirs "$pl" "$tf") ;;
    esac
    if [[ $pl == ours* && $v =~ ^([0-9]+)\ ([0-9]+)$ ]]; then
      v=${BASH_REMATCH[1]}
      from_open[$row]+="${BASH_REMATCH[2]} "
    fi
    got[$row]+="$v "
  done
done
median() { tr ' ' '\n' | grep -E '^[0-9]+$' | sort -n | awk '{a[NR] = $1} END {if (NR) print a[int((NR + 1) / 2)]; else print "-"}'; }
echo "photos: $images files, $(du -sm "$work/photos" | cut -f1) MB ($($PY -c "
import glob; from PIL import Image
s = [Image.open(f).size for f in glob.glob('$work/photos/*/*.jpg')]
print('mean %dx%d' % (sum(w for w, _ in s) / len(s), sum(h for _, h in s) / len(s)))")); core $core; median of $runs runs"
echo
echo "| transform | pipeline | img/s (median) | runs |"
echo "|---|---|---:|---|"
declare -A med
for row in "${rows[@]}"; do
  med[$row]=$(echo "${got[$row]}" | median)
  label=${row%%|*}
  case $label in train) label="RandomResizedCrop 224 + flip" ;; eval256) label="Resize 256 + CenterCrop 224" ;; eval) label="Resize 224 + CenterCrop 224" ;; esac
  echo "| $label | ${row#*|} | ${med[$row]} | ${got[$row]% } |"
done
echo
for row in "${rows[@]}"; do
  if [ -n "${from_open[$row]:-}" ]; then
    echo "${row#*|} ${row%%|*}, timed from before its Open (start-up and warm-up included): median $(echo "${from_open[$row]}" | median) img/s [${from_open[$row]% }]"
  fi
done
echo
echo "pack: $(du -sm "$work/packed/train" | cut -f1) MB as the files are; $(du -sm "$work/packed-restarts/train" | cut -f1) MB with --jpeg-restarts"
$PY - "${med[train|ours]}" "${med[train|decode-only]}" "${med[train|torchvision]}" "${med[eval|ours]}" "${med[eval|torchvision]}" \
  "${med[train|ours-exact]}" "${med[train|ours-restarts]}" "${med[train|ours-exact-restarts]}" "${med[eval|ours-restarts]}" <<'PYEOF'
import sys
def f(x):
    try: return float(x)
    except ValueError: return float("nan")
o, d, t, oe, te, ox, orr, oxr, oer = map(f, sys.argv[1:])
print("train, ours (--decode fast): %.2fx the full-size decode alone, %.2fx torchvision" % (o / d, o / t))
print("train, ours --decode exact: %.2fx the full-size decode alone, %.2fx torchvision" % (ox / d, ox / t))
print("eval (Resize 224 + CenterCrop 224), ours: %.2fx torchvision" % (oe / te))
print("packed with --jpeg-restarts: train fast %.2fx the decode alone, %.2fx torchvision; train exact %.2fx, %.2fx; "
      "eval %.2fx torchvision" % (orr / d, orr / t, oxr / d, oxr / t, oer / te))
PYEOF
# How far fast is from exact: the train transform's first 200 samples of
# epoch 0, `loader preview` both ways.
L=$B/loader
if [ -x "$L" ]; then
  rm -rf "$work/preview-fast" "$work/preview-exact"
  idx=$(seq -s, 0 199)
  for m in fast exact; do
    "$L" preview --data "$work/packed" --indices "$idx" --image-size 224 --augment --random-resized-crop \
      --decode "$m" --out "$work/preview-$m" >/dev/null
  done
  $PY - "$work/preview-fast" "$work/preview-exact" <<'PYEOF'
import glob, os, sys
import numpy as np
from PIL import Image
diffs, same, worst = [], 0, 0
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.png"))):
    a = np.asarray(Image.open(f), dtype=np.int16)
    b = np.asarray(Image.open(os.path.join(sys.argv[2], os.path.basename(f))), dtype=np.int16)
    d = np.abs(a - b)
    diffs.append(d.mean()); same += int(d.max() == 0); worst = max(worst, int(d.max()))
print("--decode fast against exact, %d samples: mean |difference| %.2f levels (per sample: %.2f to %.2f), "
      "%d identical, largest single difference %d" % (len(diffs), np.mean(diffs), min(diffs), max(diffs), same, worst))
PYEOF
fi

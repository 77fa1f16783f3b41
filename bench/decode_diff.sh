#!/usr/bin/env bash
# --decode fast and auto against exact on photographs, by output size
# (bench/decode_diff.cc): bench/make_photo_folder.py's ImageNet-sized JPEGs
# cut from the photographs python3-skimage and python3-sklearn ship,
# packed once, then decode_diff over the train transform (RandomResizedCrop
# + flip) and the eval one (Resize S + CenterCrop S) at 32 to 224 px. The
# table of docs/DECODE.md.
#
#   bench/decode_diff.sh [WORKDIR] [--images 1000] [--samples 1000] [-- decode_diff flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-build/decode-diff}
images=1000
samples=1000
shift || true
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --images) images=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "decode_diff.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for v in "images=$images" "samples=$samples"; do
  [[ ${v#*=} =~ ^[1-9][0-9]{0,8}$ ]] || { echo "decode_diff.sh: --${v%%=*} must be a whole number from 1, not '${v#*=}'" >&2; exit 2; }
done
PY=/usr/bin/python3
B=build/bin
for t in pack_tool decode_diff; do
  [ -x "$B/$t" ] || { echo "decode_diff.sh: $B/$t is missing: build first (cmake --build build --target $t)" >&2; exit 2; }
done
if ! $PY -c "import skimage, sklearn" 2>/dev/null; then
  echo "decode_diff.sh: installing python3-skimage python3-sklearn" >&2
  apt-get install -y python3-skimage python3-sklearn >/dev/null
fi
mkdir -p "$work"
exec 9>"$work/.lock"
flock -n 9 || { echo "decode_diff.sh: another run is using $work; wait for it or give another folder" >&2; exit 2; }
if [ ! -f "$work/photos.done" ] || [ "$(cat "$work/photos.done")" != "$images" ]; then
  rm -rf "$work/photos" "$work/packed" "$work/photos.done"
  $PY bench/make_photo_folder.py "$work/photos" --images "$images"
  "$B/pack_tool" imagefolder "$work/photos" "$work/packed" >/dev/null
  echo "$images" >"$work/photos.done"
fi
echo "$(date -u +%Y-%m-%d), $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs;" \
  "$images photographs ($(du -sm "$work/photos" | cut -f1) MB)"
"$B/decode_diff" --data "$work/packed" --samples "$samples" ${extra[@]+"${extra[@]}"}

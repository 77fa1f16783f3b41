#!/usr/bin/env bash
# The JPEG decode of every chroma sampling under valgrind's memcheck (issue
# 29 items 3 and 11): formats_test's sampling tests, then `loader preview`
# on a shard set of JPEGs in every sampling (tests/support/
# sampled_jpeg_folder), fast at 224, at 64 and with RandomResizedCrop, and
# exact. Any report fails it (--error-exitcode) but those
# tests/valgrind.supp shows to be false. Skipped without valgrind
# (scripts/install-deps.sh installs it). Meant for the optimized build.
#   valgrind_jpeg_test.sh FORMATS_TEST PACK_TOOL LOADER SAMPLED_JPEG_FOLDER SUPPRESSIONS
set -uo pipefail
FT=$1
PT=$2
L=$3
FOLDER=$4
SUPP=$5
. "$(dirname "$0")/cli_lib.sh"

if ! command -v valgrind >/dev/null; then
  skip "valgrind is not installed (scripts/install-deps.sh installs it)"
  finish
fi
vg=(valgrind -q --error-exitcode=1 --track-origins=no --suppressions="$SUPP")

expect_rc 0 "formats_test's tests of every sampling under valgrind" \
  "${vg[@]}" "$FT" --gtest_filter='*JpegSampling*:JpegPadding*'
grep -q "PASSED.* 11 tests" "$W/out" && ok "11 tests ran" || fail "not the 11 tests: $(grep -E '^\[ *(PASSED|FAILED)' "$W/out")"

setup "a folder of every sampling" "$FOLDER" "$W/f"
setup "packed" "$PT" imagefolder "$W/f" "$W/p"
indices=$(seq -s, 0 29)
for args in "--image-size 224 --resize shorter-crop --decode fast" \
  "--image-size 64 --resize shorter-crop --decode fast" \
  "--image-size 96 --augment --random-resized-crop --decode fast" \
  "--image-size 64 --resize shorter-crop --decode exact"; do
  # shellcheck disable=SC2086
  expect_rc 0 "loader preview $args under valgrind" "${vg[@]}" "$L" preview --data "$W/p" \
    --indices "$indices" --out "$W/o" $args
  expect_text "wrote 30 samples" "  and it wrote the 30 samples"
done
finish

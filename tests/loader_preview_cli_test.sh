#!/usr/bin/env bash
# `loader preview` refusals: flags that do not apply to it, and contact
# sheets too large to write. Usage: loader_preview_cli_test.sh PACK_TOOL LOADER
set -uo pipefail
PT=$1
L=$2
. "$(dirname "$0")/cli_lib.sh"

"$PT" fake-cifar100 "$W/c" --train 300 --test 10 >/dev/null && "$PT" cifar100 "$W/c" "$W/p" >/dev/null 2>&1
expect_rc 0 "a preview of three samples" "$L" preview --data "$W/p" --indices 0,5,9 --out "$W/o" --image-size 32
[ -f "$W/o/9.png" ] && ok "wrote 9.png" || fail "9.png missing"

# A grid of 1024 samples at 8192x8192 is 206 GB: it used to be allocated (and
# std::terminate on bad_alloc) whether or not --grid was asked for.
expect_rc 1 "an oversized contact sheet is refused" "$L" preview --data "$W/p" --grid "$W/g.png" --batch-size 1024 --image-size 8192
expect_text "over the 256 MiB a preview writes" "the refusal says the bound"
[ -e "$W/g.png" ] && fail "a grid was written" || ok "nothing written"

# Output-format flags that preview cannot honour are refused, not ignored.
for flag in "--normalize" "--layout nhwc" "--mean 0.5,0.5,0.5"; do
  # shellcheck disable=SC2086
  expect_rc 1 "preview refuses $flag" "$L" preview --data "$W/p" --indices 0 --out "$W/o" $flag
  expect_text "do not apply to it" "and says why ($flag)"
done
expect_rc 1 "train-only flags without --augment are refused" "$L" preview --data "$W/p" --indices 0 --out "$W/o" --pad-crop 4
expect_text "add --augment" "names the missing flag"
expect_rc 1 "--indices past the split names it" "$L" preview --data "$W/p" --indices 0,300 --out "$W/o"
expect_text "'300' is out of range (0..299) in --indices '0,300'" "the range is the split's"
# CLI11 reads -1 into an unsigned option as 2^64 - 1: refused instead.
for flag in "--epoch -1" "--seed -1" "--batch -1"; do
  # shellcheck disable=SC2086
  expect_rc 105 "preview refuses $flag" "$L" preview --data "$W/p" --grid "$W/g.png" $flag
done
expect_rc 1 "--batch past the epoch" "$L" preview --data "$W/p" --grid "$W/g.png" --batch 99
expect_text "--batch 99 is past the 19 batches of an epoch" "says how many batches"
# Previews go through the one atomic writer: a FIFO (or device) is refused,
# not opened for writing (that waited forever for a reader), and a preview
# is whole or not there.
mkfifo "$W/fifo.png"
expect_rc 1 "--grid onto a FIFO is refused, not waited on" timeout 20 "$L" preview --data "$W/p" --grid "$W/fifo.png"
expect_text "will not replace $W/fifo.png: it is not a regular file" "naming it"
expect_rc 1 "pack_tool export onto a FIFO is refused too" timeout 20 "$PT" export "$W/p" --split train --index 0 \
  --out "$W/fifo.png"
expect_text "will not replace $W/fifo.png: it is not a regular file" "naming it"
if ls "$W" | grep -q "\.tmp-"; then fail "a temporary is left: $(ls "$W")"; else ok "and no temporary is left"; fi
finish

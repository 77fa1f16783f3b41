#!/usr/bin/env bash
# End to end on a fresh Debian 12 machine: install, build, make a sample
# CIFAR-100 (official binary format, synthetic images), pack it into an LMDB
# shard set, verify it and print its summary.
#   scripts/demo.sh [WORKDIR]     (default: demo-data/)
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-demo-data}

scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target pack_tool
PT=build/bin/pack_tool

mkdir -p "$work"
echo "== 1. a sample CIFAR-100 in the official binary format"
"$PT" fake-cifar100 "$work/cifar-100-binary" --train 50000 --test 10000 --seed 0
echo "== 2. pack it into an LMDB shard set"
"$PT" cifar100 "$work/cifar-100-binary" "$work/cifar100-packed" --force
echo "== 3. verify every record"
"$PT" verify "$work/cifar100-packed"
echo "== 4. summary"
"$PT" info "$work/cifar100-packed"
"$PT" export "$work/cifar100-packed" --split train --index 0 --out "$work/train-0.png"
echo "demo done: shard set in $work/cifar100-packed"

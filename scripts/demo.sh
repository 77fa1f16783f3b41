#!/usr/bin/env bash
# End to end on a fresh Debian 12 machine: install, build, make a sample
# CIFAR-100 (official binary format, synthetic images), pack it into an LMDB
# shard set, verify it and print its summary, show the binding plan, preview a
# training batch, measure the loader on 2 ranks, run the loader service with a
# C++ and a Python consumer, then train ResNet-18 with DDP on 4 ranks (CPU,
# Gloo) fed by the loader service: the per-rank table, the straggler verdict,
# test accuracy and a chart; once more with a slowed rank, to see it named;
# and ImageNet-style, briefly: ResNet-50 at 224x224 with RandomResizedCrop on
# JPEG photographs cut from those Debian ships (python3-skimage, -sklearn).
#   scripts/demo.sh [WORKDIR]     (default: demo-data/)
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-demo-data}

scripts/install-deps.sh python3-skimage python3-sklearn
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target pack_tool loader loader_bench numa_loader_py trainer
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
echo "== 5. the binding plan on this machine"
build/bin/loader topo --nproc-per-node 2 --allow-shared-cores   # (shares cores only on a 1-core machine)
echo "== 6. a training batch as the model sees it (pad-crop + flip, 224x224)"
build/bin/loader preview --data "$work/cifar100-packed" --grid "$work/batch-0.png" --augment --pad-crop 4 \
  --batch-size 16
echo "== 7. loader throughput, 2 ranks, one epoch of CIFAR-100 train at 224x224"
build/bin/loader_bench --data "$work/cifar100-packed" --ranks 2 --batch-size 256 --epochs 1 --allow-shared-cores
echo "== 8. the loader service: rank 0's loader in its own process, batches through shared memory"
build/bin/loader serve --data "$work/cifar100-packed" --job-id "demo-$$" --batch-size 256 --epochs 1 \
  --threads 1 --no-bind &
serve_pid=$!
trap 'kill "$serve_pid" 2>/dev/null' EXIT
build/bin/loader consume --job-id "demo-$$" --batches 50
wait "$serve_pid"
trap - EXIT
echo "== 9. the same ring from Python (numpy arrays viewing the slots)"
build/bin/loader serve --data "$work/cifar100-packed" --job-id "demo-py-$$" --batch-size 256 --epochs 1 \
  --threads 1 --no-bind &
serve_pid=$!
trap 'kill "$serve_pid" 2>/dev/null' EXIT
PYTHONPATH=build/python /usr/bin/python3 -m numa_loader.consume --job-id "demo-py-$$" --batches 50
wait "$serve_pid"
trap - EXIT
echo "== 10. DDP training: ResNet-18, 4 ranks on CPU (Gloo), each fed by its own loader service"
build/bin/trainer --data "$work/cifar100-packed" --nproc-per-node 4 --allow-shared-cores --model resnet18 \
  --image-size 64 --batch-size 16 --epochs 1 --max-steps 120 --warmup-steps 20 --report-every 40 \
  --out "$work/run" --metrics-out "$work/run/metrics.jsonl"
echo "== 11. the same with rank 3's loader slowed on purpose (40 ms a batch): the report names it"
build/bin/trainer --data "$work/cifar100-packed" --nproc-per-node 4 --allow-shared-cores --model smallcnn \
  --image-size 32 --batch-size 16 --epochs 1 --max-steps 60 --report-every 0 --simulate-slow-rank 3 \
  --delay-ms 40 --eval-split none --out "$work/slow" --metrics-out "$work/slow/metrics.jsonl"
echo "== 12. ImageNet-style, briefly: ResNet-50 at 224x224 on JPEG photographs (RandomResizedCrop and flip;"
echo "   eval: shorter side 256, centre 224), 2 ranks, 2 steps (about a minute here: Debian's CPU LibTorch)"
/usr/bin/python3 bench/make_photo_folder.py "$work/photos/train" --images 240 --by-photo --seed 1
/usr/bin/python3 bench/make_photo_folder.py "$work/photos/val" --images 32 --by-photo --seed 2
"$PT" imagefolder "$work/photos/train" "$work/photos-packed" --force
"$PT" imagefolder "$work/photos/val" "$work/photos-packed" --split val --force
build/bin/trainer --data "$work/photos-packed" --nproc-per-node 2 --allow-shared-cores --model resnet50 \
  --image-size 224 --random-resized-crop --eval-transform center-crop --eval-split val --batch-size 4 \
  --epochs 1 --max-steps 2 --lr 0.01 --warmup-steps 0 --report-every 0 --out "$work/imagenet-run"
echo "demo done: shard set in $work/cifar100-packed, a batch in $work/batch-0.png,"
echo "  training metrics in $work/run/metrics.jsonl, charts $work/run/timing-epoch-0.svg and $work/slow/timing-epoch-0.svg,"
echo "  the photographs' run in $work/imagenet-run"

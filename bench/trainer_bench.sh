#!/usr/bin/env bash
# The trainer against the incident's pipeline, in one run, with the same
# model, batch size, ranks, image size and steps for each:
#   (a) our trainer fed by the loader service's rings (build/bin/trainer);
#   (b) a plain PyTorch DDP script (bench/ddp_reference.py, Debian's
#       python3-torch and torchvision) fed by ImageFolder + DataLoader over PNGs;
#   (c) the same script fed by our Python consumer of the rings (numa_loader).
# Prints images/s and the data_time share of each rank for each.
# Then the gradients' reduction, overlapped with backward (the trainer's
# default, as PyTorch's DDP) against after backward (--reduce after-backward),
# for each rank count and model of --reduce-ranks and --reduce-models: step
# time, exposed comm wait and all-reduce time per rank.
#   bench/trainer_bench.sh [--ranks 2] [--model resnet18] [--image-size 64] [--batch-size 16]
#                          [--steps 40] [--workers 1] [--images 4000] [--build build] [--work DIR]
#                          [--reduce-ranks "2 4"] [--reduce-models "resnet18 resnet50"]
#                          [--reduce-image-size 32] [--reduce-steps 25] (--reduce-ranks "": no comparison)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=2 model=resnet18 size=64 batch=16 steps=40 workers=1 images=4000 build=build work=""
reduce_ranks="2 4" reduce_models="resnet18 resnet50" reduce_size=32 reduce_steps=25
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks=$2 ;; --model) model=$2 ;; --image-size) size=$2 ;; --batch-size) batch=$2 ;;
    --steps) steps=$2 ;; --workers) workers=$2 ;; --images) images=$2 ;; --build) build=$2 ;;
    --work) work=$2 ;; --reduce-ranks) reduce_ranks=$2 ;; --reduce-models) reduce_models=$2 ;;
    --reduce-image-size) reduce_size=$2 ;; --reduce-steps) reduce_steps=$2 ;;
    *) echo "trainer_bench: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
PY=/usr/bin/python3
for t in pack_tool trainer loader; do
  [ -x "$build/bin/$t" ] || { echo "trainer_bench: no $build/bin/$t (build it first)" >&2; exit 2; }
done
[ -f "$build/python/numa_loader/__init__.py" ] ||
  { echo "trainer_bench: no $build/python/numa_loader (build the numa_loader_py target)" >&2; exit 2; }
pythonpath=$(cd "$build/python" && pwd)
if [ -z "$work" ]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/trainer-bench-XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
skip=5
report=5  # the trainer's report windows: the first (warm-up) is left out, as the script's first $skip steps

echo "== data: fake CIFAR-100, $images training images, as PNGs in an ImageFolder tree and packed from it"
"$build/bin/pack_tool" fake-cifar100 "$work/bin" --train "$images" --test 100 --seed 0 >/dev/null
$PY - "$work/bin/train.bin" "$work/tree/train" <<'PYEOF'
import os, sys
import numpy as np
from PIL import Image
raw = np.fromfile(sys.argv[1], np.uint8).reshape(-1, 3074)
for i, r in enumerate(raw):
    d = os.path.join(sys.argv[2], "c%03d" % r[1])
    os.makedirs(d, exist_ok=True)
    Image.fromarray(r[2:].reshape(3, 32, 32).transpose(1, 2, 0)).save(os.path.join(d, "%05d.png" % i))
PYEOF
# (every class present, so ImageFolder's labels equal the packed ones)
"$build/bin/pack_tool" imagefolder "$work/tree/train" "$work/packed" --force >/dev/null

common="--ranks $ranks, $model, batch $batch per rank, image $size, $steps steps (first $skip left out)"
echo "== (a) trainer, ring loader: $common"
port=$((29000 + RANDOM % 1000))
"$build/bin/trainer" --data "$work/packed" --nproc-per-node "$ranks" --model "$model" --image-size "$size" \
  --batch-size "$batch" --max-steps "$steps" --report-every "$report" --allow-shared-cores --loader-threads 1 \
  --master-port "$port" --eval-split none --metrics-out "$work/a.jsonl" >"$work/a.out" 2>&1 ||
  { cat "$work/a.out" >&2; exit 1; }
echo "== (b) ddp_reference.py, ImageFolder + DataLoader ($workers worker(s) per rank): $common"
$PY -m torch.distributed.run -r 2 -t 2 --nproc_per_node "$ranks" --master_port $((port + 1)) \
  bench/ddp_reference.py --source imagefolder --data "$work/tree/train" --model "$model" --batch-size "$batch" \
  --image-size "$size" --steps "$steps" --skip "$skip" --workers "$workers" >"$work/b.out" 2>"$work/b.err" ||
  { cat "$work/b.err" >&2; exit 1; }
echo "== (c) ddp_reference.py, numa_loader rings: $common"
PYTHONPATH="$pythonpath" $PY -m torch.distributed.run -r 2 -t 2 --nproc_per_node "$ranks" \
  --master_port $((port + 2)) bench/ddp_reference.py --source ring --data "$work/packed" \
  --loader "$build/bin/loader" --model "$model" --batch-size "$batch" --image-size "$size" --steps "$steps" \
  --skip "$skip" --loader-threads 1 >"$work/c.out" 2>"$work/c.err" || { cat "$work/c.err" >&2; exit 1; }

$PY - "$work" "$skip" "$batch" <<'PYEOF'
import json, sys
work, skip, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = {}
# (a): the trainer's report lines after the first window, weighted by steps.
acc = {}
for l in open(work + "/a.jsonl"):
    j = json.loads(l)
    if "rank" not in j or j["step"] <= skip:
        continue
    r = acc.setdefault(j["rank"], [0.0, 0.0, 0, 0.0])
    n = j["steps"]
    r[0] += j["data_ms"] * n; r[1] += j["step_ms"] * n; r[2] += n
for rank, (d, s, n, _) in acc.items():
    rows.setdefault("a", {})[rank] = (d / n, s / n)
for key in ("b", "c"):
    for l in open("%s/%s.out" % (work, key)):
        l = l.split(":", 1)[-1] if l.startswith("[") else l
        try:
            j = json.loads(l)
        except ValueError:
            continue
        rows.setdefault(key, {})[j["rank"]] = (j["data_ms"], j["step_ms"])
names = {"a": "(a) trainer + ring", "b": "(b) DDP script + ImageFolder/DataLoader", "c": "(c) DDP script + numa_loader ring"}
print("%-42s %4s %10s %10s %9s %11s" % ("", "rank", "data ms", "step ms", "images/s", "data share"))
summary = {}
for key in ("a", "b", "c"):
    tot, worst = 0.0, 0.0
    for rank in sorted(rows.get(key, {})):
        d, s = rows[key][rank]
        share = 100 * d / s if s else 0
        worst = max(worst, share)
        ips = 1000.0 * batch / s if s else 0
        print("%-42s %4d %10.2f %10.1f %9.1f %10.2f%%" % (names[key], rank, d, s, ips, share))
    summary[key] = worst
b = summary.get("b", 0)
for key in ("a", "c"):
    ratio = b / summary[key] if summary.get(key) else float("inf")
    print("%s: largest data share %.2f%% vs (b) %.2f%%: %.0fx smaller" % (names[key], summary[key], b, ratio))
PYEOF

[ -n "$reduce_ranks" ] || exit 0
echo
echo "== the gradients' reduction: after backward against overlapped with it (batch $batch per rank," \
  "image $reduce_size, $reduce_steps steps, the first $report left out; both modes on the same machine, in turn)"
for r in $reduce_ranks; do
  for m in $reduce_models; do
    for mode in after-backward overlap; do
      port=$((port + 3))
      "$build/bin/trainer" --data "$work/packed" --nproc-per-node "$r" --model "$m" --image-size "$reduce_size" \
        --batch-size "$batch" --max-steps "$reduce_steps" --report-every "$report" --allow-shared-cores \
        --loader-threads 1 --master-port "$port" --eval-split none --reduce "$mode" \
        --metrics-out "$work/r-$r-$m-$mode.jsonl" >"$work/r.out" 2>&1 || { cat "$work/r.out" >&2; exit 1; }
    done
  done
done
$PY - "$work" "$report" "$batch" "$reduce_ranks" "$reduce_models" <<'PYEOF'
import json, sys
work, skip, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ranks, models = sys.argv[4].split(), sys.argv[5].split()
print("%5s %-9s %-15s %4s %10s %13s %14s %9s" % ("ranks", "model", "reduction", "rank", "step ms",
                                                 "comm wait ms", "all-reduce ms", "images/s"))
for r in ranks:
    for m in models:
        step = {}
        for mode in ("after-backward", "overlap"):
            acc = {}
            for l in open("%s/r-%s-%s-%s.jsonl" % (work, r, m, mode)):
                j = json.loads(l)
                if "rank" not in j or j["step"] <= skip:
                    continue
                a = acc.setdefault(j["rank"], [0.0, 0.0, 0.0, 0])
                n = j["steps"]
                a[0] += j["step_ms"] * n; a[1] += j["comm_ms"] * n; a[2] += j["allreduce_ms"] * n; a[3] += n
            worst = 0.0
            for rank in sorted(acc):
                s, c, ar, n = acc[rank]
                worst = max(worst, s / n)
                print("%5s %-9s %-15s %4d %10.1f %13.1f %14.1f %9.1f" % (r, m, mode, rank, s / n, c / n, ar / n,
                                                                      1000.0 * batch / (s / n)))
            step[mode] = worst
        gain = 100.0 * (step["after-backward"] - step["overlap"]) / step["after-backward"]
        print("%5s %-9s overlapped: slowest rank's step %.1f ms against %.1f ms after backward (%+.1f%%)" %
              (r, m, step["overlap"], step["after-backward"], -gain))
PYEOF

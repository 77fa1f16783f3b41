#!/usr/bin/env bash
# What a PyTorch user's script gets, in one run, on the same cores:
# (1) the same DDP training script (bench/ddp_reference.py: resnet18, SGD,
#     2 ranks under torchrun, Gloo on CPU) fed by torch's DataLoader over an
#     ImageFolder (one worker process per rank, matching the loader's one
#     thread per rank) and by numa_loader.Loader (the three lines docs/guide/python.md
#     changes), on a CIFAR-like PNG folder (CIFAR's crop) and on JPEG
#     photographs (RandomResizedCrop): img/s and the data share of a step
#     (time waiting for the next batch over the step's time), per rank;
# (2) batches alone, no model, one process: torchvision's DataLoader against
#     Loader (its batches copied into the caller's tensors on a thread of its
#     own, the copy timed) and the zero-copy Client, float32 and uint8, 224 px.
#   bench/python_bench.sh [WORKDIR] [--images N] [--photos N] [--steps N]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-build/python-bench}
n=4000
photos=800
steps=30
shift || true
while [ $# -gt 0 ]; do
  case $1 in
    --images) n=${2:-}; shift 2 ;;
    --photos) photos=${2:-}; shift 2 ;;
    --steps) steps=${2:-}; shift 2 ;;
    *) echo "python_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $n =~ ^[0-9]{1,9}$ ]] && [ "$n" -ge 640 ] || { echo "python_bench.sh: --images must be 640 or more, not '$n'" >&2; exit 2; }
[[ $photos =~ ^[0-9]{1,9}$ ]] && [ "$photos" -ge 200 ] || { echo "python_bench.sh: --photos must be 200 or more, not '$photos'" >&2; exit 2; }
[[ $steps =~ ^[0-9]{1,6}$ ]] && [ "$steps" -ge 10 ] || { echo "python_bench.sh: --steps must be 10 or more, not '$steps'" >&2; exit 2; }
B=build/bin
PY=/usr/bin/python3
for t in pack_tool loader; do
  [ -x "$B/$t" ] || { echo "build first: $B/$t is missing" >&2; exit 1; }
done
[ -f build/python/numa_loader/_build.py ] || { echo "build first: build/python/numa_loader is missing" >&2; exit 1; }
mkdir -p "$work"
export PYTHONPATH=$PWD/build/python NUMA_LOADER_BIN=$PWD/$B/loader

if [ ! -f "$work/c100/train.bin" ] || [ "$(stat -c %s "$work/c100/train.bin")" -ne $((n * 3074)) ]; then
  rm -rf "$work/c100" "$work/raw" "$work/imf"
  "$B/pack_tool" fake-cifar100 "$work/c100" --train "$n" --test 100 --seed 3 >/dev/null
fi
if [ ! -d "$work/imf" ]; then
  $PY bench/cifar_folder.py "$work/c100/train.bin" "$work/imf"
fi
[ -d "$work/raw" ] || "$B/pack_tool" cifar100 "$work/c100" "$work/raw" >/dev/null 2>&1
[ -d "$work/png" ] || "$B/pack_tool" imagefolder "$work/imf" "$work/png" >/dev/null 2>&1
if [ ! -d "$work/photos-pack" ] || [ "$(ls "$work"/photos/*/ | grep -c jpg)" -ne "$photos" ]; then
  rm -rf "$work/photos" "$work/photos-pack"
  $PY bench/make_photo_folder.py "$work/photos" --images "$photos" --classes 10 >/dev/null
  "$B/pack_tool" imagefolder "$work/photos" "$work/photos-pack" >/dev/null 2>&1
fi

cat >"$work/ours.py" <<'PYEOF'
import json, os, subprocess, sys, time, warnings
import numpy as np, torch
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
import numa_loader
torch.set_num_threads(1)
data, way, normalize = sys.argv[1], sys.argv[2], sys.argv[3] == "float32"
opts = dict(batch_size=64, image_size=224, threads=1, normalize=normalize)
if normalize:
    opts.update(mean=[0.5071, 0.4865, 0.4409], std=[0.2673, 0.2564, 0.2762])
warm = 3  # batches before the clock starts (the Python pipeline's are timed after its first)
if way == "loader":
    loader = numa_loader.Loader(data, quiet=True, **opts)
    copy_s = [0.0]
    inner = numa_loader.loader._copy_batch
    def timed(*a):
        t = time.perf_counter()
        item = inner(*a)
        copy_s[0] += time.perf_counter() - t
        return item
    numa_loader.loader._copy_batch = timed
    it = iter(loader)
    for _ in range(warm):
        next(it)
    copy_s[0] = 0.0
    t0, n, b = time.perf_counter(), 0, 0
    for x, y in it:
        n += len(y)
        b += 1
    dt = time.perf_counter() - t0
    loader.close()
    print(json.dumps({"images_per_s": n / dt, "copy_ms": 1000 * copy_s[0] / b}))
else:
    job = "pybench-%d" % os.getpid()
    flags = ["--batch-size", "64", "--image-size", "224", "--threads", "1", "--epochs", "1"]
    if normalize:
        flags += ["--normalize", "--mean", "0.5071,0.4865,0.4409", "--std", "0.2673,0.2564,0.2762"]
    server = subprocess.Popen([os.environ["NUMA_LOADER_BIN"], "serve", "--data", data, "--job-id",
                               job] + flags, stderr=subprocess.DEVNULL)
    with numa_loader.Client(job, 0, timeout_s=60) as c:
        it = iter(c)
        for _ in range(warm):
            next(it)
        t0, n = time.perf_counter(), 0
        for b in it:
            x = torch.from_numpy(b.pixels)
            n += len(x)
        dt = time.perf_counter() - t0
    server.wait(60)
    print(json.dumps({"images_per_s": n / dt}))
PYEOF

field() { $PY -c "import json,sys; j=json.loads(sys.stdin.read()); print($1)"; }

# --- (1) the same training script, 2 ranks -----------------------------------
train() {  # SOURCE DATA TRANSFORM SIZE -> the ranks' JSON lines in $work/train.out
  local port=$((29000 + RANDOM % 2000))
  $PY -m torch.distributed.run -r 2 -t 2 --nproc_per_node 2 --master_port "$port" \
    bench/ddp_reference.py --source "$1" --data "$2" --transform "$3" --image-size "$4" \
    --model resnet18 --batch-size 16 --steps "$steps" --skip 5 --workers 1 --loader-threads 1 \
    >"$work/train.out" 2>"$work/train.err" || { tail -20 "$work/train.err" >&2; exit 1; }
}
echo "== (1) bench/ddp_reference.py: resnet18, batch 16 a rank, 2 ranks (torchrun, Gloo, $(nproc) cores), $steps steps (first 5 left out); one DataLoader worker or loader thread a rank"
printf "| data | fed by | rank | img/s | data share of a step |\n|---|---|---:|---:|---:|\n"
for set in "CIFAR-like PNG folder ($n images, 32 -> 64 px)|$work/imf|$work/png|cifar|64" \
           "JPEG photographs ($photos, ~430 px -> 112 px)|$work/photos|$work/photos-pack|imagenet|112"; do
  IFS='|' read -r label folder pack transform size <<<"$set"
  for source in imagefolder loader; do
    if [ "$source" = imagefolder ]; then train imagefolder "$folder" "$transform" "$size"; who="torch DataLoader (ImageFolder)"
    else train loader "$pack" "$transform" "$size"; who="numa_loader.Loader"; fi
    grep '^{' "$work/train.out" | sort | while read -r line; do
      echo "$line" | field '"| %s | %s | %d | %.1f | %.1f%% |" % ("'"$label"'", "'"$who"'", j["rank"], j["images_per_s"], 100 * j["data_ms"] / j["step_ms"])'
    done
  done
done

# --- (2) batches alone ---------------------------------------------------------
echo "== (2) batches alone: $n CIFAR-like 32x32 images -> 224x224, batches of 64, cpus 0,1; one loader thread or worker"
base=$(taskset -c 0,1 $PY bench/torchvision_baseline.py --root "$work/imf" --workers 1 --max-images 3000)
base_ips=$(echo "$base" | field 'j["images_per_s"]')
printf "| %-62s | %9s | %s |\n|---|---:|---|\n" "pipeline" "img/s" "against the baseline"
printf "| %-62s | %9.0f | |\n" "torchvision DataLoader (1 worker; PNG, PIL, Resize, Normalize)" "$base_ips"
for dt in float32 uint8; do
  lo=$(taskset -c 0,1 $PY "$work/ours.py" "$work/raw" loader "$dt")
  cl=$(taskset -c 0,1 $PY "$work/ours.py" "$work/raw" client "$dt")
  lo_ips=$(echo "$lo" | field 'j["images_per_s"]')
  cl_ips=$(echo "$cl" | field 'j["images_per_s"]')
  printf "| %-62s | %9.0f | %.1fx; copy %s |\n" "numa_loader.Loader, $dt (copied into the caller's tensors)" "$lo_ips" \
    "$(echo "$lo_ips / $base_ips" | bc -l)" "$(echo "$lo" | field '"%.2f ms a batch on its copier thread" % j["copy_ms"]')"
  printf "| %-62s | %9.0f | %.1fx |\n" "numa_loader.Client, $dt (zero-copy views of the ring)" "$cl_ips" \
    "$(echo "$cl_ips / $base_ips" | bc -l)"
done

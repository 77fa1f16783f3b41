#!/usr/bin/env bash
# What a PyTorch script gets per second, in one run, on the same two cores:
# the incident's pipeline (torchvision ImageFolder of PNGs, a DataLoader with
# one worker process) against numa_loader.Loader (one loader thread; its
# batches copied into the caller's tensors) and the zero-copy
# numa_loader.Client over a `loader serve` with the same flags. 32x32 images
# resized to 224x224, float32 normalized (and uint8 for ours), batches of 64.
# The Loader's copy (on a thread of its own, a batch or two ahead of the
# loop) is timed too: milliseconds per batch.
#   bench/python_bench.sh [WORKDIR] [--images N]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-build/python-bench}
n=6000
[ "${2:-}" = "--images" ] && n=$3
[[ $n =~ ^[0-9]{1,9}$ ]] && [ "$n" -ge 640 ] || { echo "python_bench.sh: --images must be 640 or more, not '$n'" >&2; exit 2; }
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
  $PY - "$work/c100/train.bin" "$work/imf" <<'PYEOF'
import os, sys, numpy as np
from PIL import Image
recs = np.fromfile(sys.argv[1], dtype=np.uint8).reshape(-1, 3074)
for i, r in enumerate(recs):
    d = os.path.join(sys.argv[2], f"class_{r[1]:03d}")
    os.makedirs(d, exist_ok=True)
    Image.fromarray(r[2:].reshape(3, 32, 32).transpose(1, 2, 0)).save(os.path.join(d, f"{i:05d}.png"))
PYEOF
fi
[ -d "$work/raw" ] || "$B/pack_tool" cifar100 "$work/c100" "$work/raw" >/dev/null 2>&1

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
echo "== $n CIFAR-like 32x32 images -> 224x224, batches of 64, cpus 0,1; one loader thread or worker"
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

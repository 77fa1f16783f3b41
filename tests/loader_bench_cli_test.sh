#!/usr/bin/env bash
# loader_bench end to end: 2 ranks as 2 processes, JSON output, recorded
# indices (every sample of an epoch delivered exactly once across ranks, apart
# from DistributedSampler's documented padding), and a bad shard set.
# Usage: loader_bench_cli_test.sh PACK_TOOL LOADER_BENCH [TOPOLOGY_DIR]
set -uo pipefail
PT=$1
LB=$2
T=${3:-$(dirname "$0")/topologies}
. "$(dirname "$0")/cli_lib.sh"

"$PT" fake-cifar100 "$W/c" --train 301 --test 10 >/dev/null && "$PT" cifar100 "$W/c" "$W/p" >/dev/null 2>&1
if part main; then
expect_rc_stdout 0 "2 ranks, 2 epochs, --json, --record-indices" "$LB" --data "$W/p" --ranks 2 --batch-size 32 --epochs 2 \
  --image-size 64 --record-indices "$W/idx.jsonl" --json
cp "$W/out" "$W/bench.json"
expect_rc 0 "JSON has a row per rank" $PY - "$W/bench.json" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
assert [r["rank"] for r in j["ranks"]] == [0, 1]
for r in j["ranks"]:
    assert r["images"] == 151 * 2, r["images"]  # ceil(301 / 2) per epoch
    for k in ("images_per_s", "wait_ms_mean", "wait_ms_p95", "cpu_us_per_image", "cores_used", "mb_per_s"):
        assert r[k] >= 0, k
    # Start-up and the rate after the warm-up (one batch per buffer, --prefetch's 4).
    assert 0 <= r["open_s"] <= r["first_batch_s"] <= r["seconds"], r
    assert r["warmup_batches"] == 4 and r["steady_images_per_s"] > 0, r
assert j["total_images_per_s"] > 0
PYEOF
expect_rc 0 "recorded indices: each epoch covers every sample once (one padded)" $PY - "$W/idx.jsonl" <<'PYEOF'
import json, sys, collections
lines = [json.loads(l) for l in open(sys.argv[1])]
assert sorted((l["rank"], l["epoch"]) for l in lines) == [(0, 0), (0, 1), (1, 0), (1, 1)]
for e in (0, 1):
    c = collections.Counter(i for l in lines if l["epoch"] == e for i in l["indices"])
    assert set(c) == set(range(301)), "missing samples"
    assert sum(c.values()) == 302 and sorted(c.values())[-1] == 2  # 1 sample padded
orders = {l["epoch"]: l["indices"] for l in lines if l["rank"] == 0}
assert orders[0] != orders[1], "epochs should be shuffled differently"
PYEOF
# --order blocks: the same guarantees, each rank reading whole runs; the plan
# said in one line; a bounded run (--max-batches) stops where asked.
expect_rc_stdout 0 "--order blocks, 2 ranks, 2 epochs, read-ahead of 64K" "$LB" --data "$W/p" --ranks 2 \
  --batch-size 32 --epochs 2 --image-size 32 --order blocks --io-memory 64K --record-indices "$W/blk.jsonl" --json
expect_out "rank 0: order blocks \(--order blocks\); blocks of [0-9]+ samples \([0-9.]+ KiB\), [0-9]+ a window; read-ahead 64 KiB \(--io-memory\)" \
  "says its order, blocks and read-ahead"
expect_rc 0 "recorded indices of blocks order: every sample once an epoch (one padded), epochs differ" $PY - "$W/blk.jsonl" <<'PYEOF'
import json, sys, collections
lines = [json.loads(l) for l in open(sys.argv[1])]
for e in (0, 1):
    c = collections.Counter(i for l in lines if l["epoch"] == e for i in l["indices"])
    assert set(c) == set(range(301)) and sum(c.values()) == 302, "not every sample once"
orders = {l["epoch"]: l["indices"] for l in lines if l["rank"] == 0}
assert orders[0] != orders[1]
PYEOF
expect_rc_stdout 0 "--order auto on a small split" "$LB" --data "$W/p" --ranks 1 --image-size 32 --max-batches 3 --json
expect_out "order random \(auto: the split's [0-9.]+ [KMG]iB fits in half of the [0-9.]+ [KMGT]iB this process may use" \
  "picks random, saying why"
if $PY -c "import json,sys; r=json.load(open(sys.argv[1]))['ranks'][0]; sys.exit(0 if r['images'] == 3 * 64 else 1)" "$W/out"; then
  ok "--max-batches 3 loads 3 batches"
else
  fail "--max-batches 3: $(cat "$W/out")"
fi
fi  # part main

# In a memory cgroup whose limit the split does not fit in half of (where this
# machine lets the test make one: root and a memory controller, v1 or v2;
# a part of its own, wholly run or wholly skipped):
# auto picks blocks naming the limit, every sample comes once, nothing is
# OOM-killed, and the loader's own memory stays within its buffers + 64 MiB.
cgroup_make() {  # sets CG, or CG_WHY
  CG="" CG_WHY=""
  if [ "$(id -u)" -ne 0 ]; then
    CG_WHY="not root"
  elif [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
    CG=/sys/fs/cgroup/nl-test-$$
    { mkdir "$CG" && echo "$1" >"$CG/memory.max"; } 2>/dev/null || { CG_WHY="cannot make a cgroup v2 with memory.max"; rmdir "$CG" 2>/dev/null; CG=""; }
  elif [ -w /sys/fs/cgroup/memory ]; then
    CG=/sys/fs/cgroup/memory/nl-test-$$
    { mkdir "$CG" && echo "$1" >"$CG/memory.limit_in_bytes"; } 2>/dev/null || { CG_WHY="cannot make a cgroup v1 with memory.limit_in_bytes"; rmdir "$CG" 2>/dev/null; CG=""; }
  else
    CG_WHY="no writable memory cgroup controller"
  fi
}
cgroup_oom_kills() {  # v2 memory.events, v1 memory.oom_control (kernels since 4.13)
  cat "$CG/memory.events" "$CG/memory.oom_control" 2>/dev/null | awk '$1 == "oom_kill" { n += $2 } END { print n + 0 }'
}
# Not under AddressSanitizer: its shadow memory and quarantine alone are about
# 40 MiB of this run's anonymous memory, and the 64 MiB cgroup OOM-killed it
# (CI, stop 22); the optimized builds run it.
if ! part memory-cgroup; then
  :
elif [[ $(ldd "$LB" 2>/dev/null) == *libasan* ]]; then
  CG="" CG_WHY="an AddressSanitizer build (its own memory does not fit a 64 MiB cgroup)"
else
  cgroup_make $((64 << 20))
fi
if ! part memory-cgroup; then
  :
elif [ -z "$CG" ]; then
  skip "a split bigger than half a memory cgroup's limit: $CG_WHY"
else
  "$PT" fake-cifar100 "$W/c12k" --train 12000 --test 10 >/dev/null && "$PT" cifar100 "$W/c12k" "$W/p12k" >/dev/null 2>&1
  expect_rc_stdout 0 "a 37 MB split in a 64 MiB memory cgroup, --order auto, 2 ranks" sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CG" \
    "$LB" --data "$W/p12k" --ranks 2 --batch-size 64 --epochs 1 --image-size 32 --record-indices "$W/cg.jsonl" --json
  expect_out "order blocks \(auto: the split's [0-9.]+ MiB does not fit in half of the 64 MiB this process may use \(cgroup v[12] " \
    "auto picks blocks, naming the cgroup's limit"
  cp "$W/out" "$W/cg.json"
  expect_rc 0 "every sample once, anonymous memory within the prefetch buffers + 64 MiB" $PY - "$W/cg.jsonl" "$W/cg.json" <<'PYEOF'
import json, sys, collections
lines = [json.loads(l) for l in open(sys.argv[1])]
c = collections.Counter(i for l in lines for i in l["indices"])
assert set(c) == set(range(12000)) and sum(c.values()) == 12000, "not every sample once"
for r in json.load(open(sys.argv[2]))["ranks"]:
    assert r["rss_anon_mib"] <= r["buffers_mib"] + 64, r
PYEOF
  if [ "$(cgroup_oom_kills)" = 0 ]; then ok "nothing OOM-killed in the cgroup"; else fail "OOM kills in the cgroup: $(cgroup_oom_kills)"; fi
  rmdir "$CG" 2>/dev/null || true
fi

if part main; then
expect_rc 105 "--order sequential is refused" "$LB" --data "$W/p" --order sequential
expect_text "--order: sequential not in {random,blocks,auto}" "naming the choices"
expect_rc 1 "--io-memory 1.5G is refused" "$LB" --data "$W/p" --io-memory 1.5G
expect_text "--io-memory: '1.5G' is not a size" "saying what a size is"
expect_rc 1 "--io-memory 2000T is refused" "$LB" --data "$W/p" --io-memory 2000T
expect_text "is more than 1099511627776 bytes" "stating the bound"

expect_rc 1 "a missing shard set is an error" "$LB" --data "$W/none" --ranks 1
expect_text "manifest.json" "the error names the manifest"

# Absurd counts are refused at once (they used to fork or allocate until
# memory ran out, or never return), each saying the bound.
expect_rc 105 "--ranks 100000 is refused" timeout 60 "$LB" --data "$W/p" --ranks 100000
expect_text "--ranks: Value 100000 not in range 1 to 1024" "--ranks states its bound"
expect_rc 105 "--threads-per-rank 2147483647 is refused" timeout 60 "$LB" --data "$W/p" --threads-per-rank 2147483647
expect_text "not in range 1 to 1024" "--threads-per-rank states its bound"
expect_rc 105 "--prefetch 2147483647 is refused" timeout 60 "$LB" --data "$W/p" --prefetch 2147483647
expect_rc 105 "--epochs 0 (it ran forever) is refused" timeout 60 "$LB" --data "$W/p" --epochs 0
expect_rc 1 "--prefetch 1024 at batch 4096 is more memory than half the machine" \
  timeout 60 "$LB" --data "$W/p" --prefetch 1024 --batch-size 4096
expect_text "more than half of this machine's" "the memory error says why"

# More ranks than allowed cores: an error, unless shared cores are asked for (then said).
cores=$(nproc)
expect_rc 1 "more ranks than cores needs --allow-shared-cores" timeout 60 "$LB" --data "$W/p" --ranks $((cores + 1)) --image-size 32
expect_text "--allow-shared-cores" "the error names the way out"
expect_rc 0 "--allow-shared-cores runs them" timeout 120 "$LB" --data "$W/p" --ranks $((cores + 1)) --allow-shared-cores --image-size 32
expect_text "--allow-shared-cores: local rank" "the fallback is printed"

# Train-transform flags were accepted and ignored; now they need --augment.
expect_rc 1 "--pad-crop without --augment is refused" "$LB" --data "$W/p" --pad-crop 4
expect_text "add --augment" "the error names the missing flag"
expect_rc_stdout 0 "--augment --pad-crop 4 is applied" "$LB" --data "$W/p" --ranks 1 --augment --pad-crop 4 --image-size 32 --json
expect_rc 0 "a run of a few images warns that its rate is start-up" "$LB" --data "$W/p" --ranks 1 --image-size 32 --batch-size 8
expect_text "these rates are dominated by start-up" "short-run note"
# --bind off runs the plan's loader threads too (it used to drop to 1), unbound.
for b in on off; do
  expect_rc_stdout 0 "--bind $b on the 8-GPU node file" "$LB" --data "$W/p" --image-size 32 \
    --topology "$T/one_node_8gpu.xml" --ignore-gpus --bind $b --json
  cp "$W/out" "$W/bind_$b.json"
done
expect_rc 0 "--bind on and off run the same loader threads; off says cpu_binding off" $PY - "$W/bind_on.json" "$W/bind_off.json" <<'PYEOF'
import json, sys
on, off = (json.load(open(f))["ranks"][0] for f in sys.argv[1:3])
assert on["threads"] == off["threads"] > 1, (on["threads"], off["threads"])
assert off["cpu_binding"] == "off" and on["cpu_binding"] != "off", (on["cpu_binding"], off["cpu_binding"])
PYEOF

# --step-ms: a finite number of ms in 0..1e6 (1e300 and inf skipped the sleep, 1e12 slept 31 years).
for v in 1e300 inf nan -5 1e12; do
  expect_rc 1 "--step-ms $v is refused" timeout 60 "$LB" --data "$W/p" --image-size 32 --step-ms "$v"
  expect_text "--step-ms must be a number of ms in 0..1000000" "--step-ms $v: the error states the range"
done

# --record-indices to a file that cannot be written: an error naming it (it was ignored, rc 0).
expect_rc 1 "--record-indices in a missing directory" timeout 60 "$LB" --data "$W/p" --image-size 32 --record-indices /nonexistent/x.jsonl
expect_text "--record-indices: cannot open /nonexistent/x.jsonl" "names the file"
if [ -w /dev/full ]; then
  expect_rc 1 "--record-indices to a full device" timeout 60 "$LB" --data "$W/p" --image-size 32 --record-indices /dev/full
  expect_text "--record-indices: cannot write /dev/full" "names the file"
fi

# The buffers of all ranks together must fit in half the memory (each rank's alone did).
mem=$($PY -c "import os; print(os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGESIZE'))")
batch=$($PY -c "print(int(0.3 * $mem / (4 * 32 * 32 * 3)) + 1)")  # one rank: 30% of memory
expect_rc 1 "4 ranks of 30% of memory each are refused before they start" timeout 60 "$LB" --data "$W/p" \
  --ranks 4 --allow-shared-cores --prefetch 4 --image-size 32 --batch-size "$batch"
expect_text "4 ranks x 4 batch buffers x $batch samples x 3072 bytes need" "the error says the numbers"
expect_text "lower --ranks, --prefetch, --batch-size or --image-size" "and what to lower"
expect_rc 105 "--seed -1 is refused, not wrapped to 2^64 - 1" "$LB" --data "$W/p" --seed -1
# A killed loader_bench takes its rank processes with it (they used to run on
# to the end of their epochs, orphaned).
"$LB" --data "$W/p" --ranks 2 --allow-shared-cores --image-size 16 --step-ms 100 --epochs 100 >/dev/null 2>&1 &
lb=$!
kids=""
for _ in $(seq 100); do  # until both ranks have started (bounded)
  kids=$(pgrep -P "$lb" | tr '\n' ' ')
  [ "$(echo $kids | wc -w)" -ge 2 ] && break
  sleep 0.1
done
kill -9 "$lb"
wait "$lb" 2>/dev/null
left=$kids
for _ in $(seq 100); do  # until the kernel has killed them (bounded)
  left=""
  for k in $kids; do kill -0 "$k" 2>/dev/null && left="$left $k"; done
  [ -z "$left" ] && break
  sleep 0.1
done
if [ -n "$kids" ] && [ -z "$left" ]; then ok "rank processes die with a killed loader_bench"; else
  fail "rank processes ($kids) outlived their parent: $left still running"
  for k in $left; do kill -9 "$k" 2>/dev/null; done
fi
fi  # part main
finish

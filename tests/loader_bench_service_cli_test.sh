#!/usr/bin/env bash
# loader_bench --mode service and --mode both end to end: a real `loader
# serve` per rank consumed through its ring; the same samples as inprocess;
# the consumer's per-batch cost; the ratio; and no serve left behind however
# loader_bench or its serve ends.
# Usage: loader_bench_service_cli_test.sh PACK_TOOL LOADER_BENCH LOADER
set -uo pipefail
PT=$1
LB=$2
L=$3
. "$(dirname "$0")/cli_lib.sh"


# serves_of PID: pids of the `loader serve` processes of the loader_bench with that pid.
serves_of() { pgrep -f "loader serve --job-id loader_bench-$1( |$)" | tr '\n' ' '; }

# no_serve_left PID NAME: within a bounded time, no serve and no ring socket of that run.
no_serve_left() {
  local left sockets
  for _ in $(seq 100); do
    left=$(serves_of "$1")
    sockets=$(grep -c "@numa_loader/loader_bench-$1/" /proc/net/unix)
    [ -z "$left" ] && [ "$sockets" -eq 0 ] && break
    sleep 0.1
  done
  if [ -z "$left" ] && [ "$sockets" -eq 0 ]; then ok "$2"; else
    fail "$2: serves left: $left; sockets left: $sockets"
    for k in $left; do kill -9 "$k" 2>/dev/null; done
  fi
}

"$PT" fake-cifar100 "$W/c" --train 301 --test 10 >/dev/null && "$PT" cifar100 "$W/c" "$W/p" >/dev/null 2>&1 || {
  echo "could not make the test data"
  exit 1
}
COMMON=(--data "$W/p" --batch-size 32 --image-size 32 --allow-shared-cores)

if part main; then
# --- service: the same samples as inprocess, and a per-batch cost -----------
for mode in inprocess service; do  # (in the background, for its pid: the serves' job id)
  "$LB" "${COMMON[@]}" --epochs 2 --ranks 2 --mode $mode --record-indices "$W/idx_$mode.jsonl" \
    --json >"$W/$mode.json" 2>"$W/$mode.err" &
  lb=$!
  wait "$lb"
  check_rc $? 0 "--mode $mode, 2 ranks, 2 epochs, --json, --record-indices"
done
no_serve_left "$lb" "no serve and no ring socket left after a clean run"
expect_rc 0 "service: as many images as inprocess, per rank; a positive consumer cost" \
  $PY - "$W/inprocess.json" "$W/service.json" <<'PYEOF'
import json, sys
inp, svc = (json.load(open(f)) for f in sys.argv[1:3])
assert svc["mode"] == "service" and svc["consumer"] == "cpp", (svc.get("mode"), svc.get("consumer"))
assert "mode" not in inp, "inprocess output gained a key"
for i, s in zip(inp["ranks"], svc["ranks"]):
    assert "error" not in s, s
    assert s["images"] == i["images"] == 151 * 2, (s["images"], i["images"])
    assert s["batches"] == i["batches"] == 5 * 2, (s["batches"], i["batches"])
    assert s["consumer_us_mean"] > 0 and s["consumer_us_p99"] > 0, s
    assert s["images_per_s"] > 0 and s["threads"] == i["threads"], s
    assert s["loader_cpus"] == i["loader_cpus"], (s["loader_cpus"], i["loader_cpus"])
    assert s["startup_s"] >= 0 and s["wall_s"] >= s["seconds"], s
assert svc["total_images_per_s"] > 0
PYEOF
if cmp -s <(sort "$W/idx_inprocess.jsonl") <(sort "$W/idx_service.jsonl"); then
  ok "service delivers the same samples, in the same order per rank and epoch, as inprocess"
else
  fail "recorded indices differ between inprocess and service"
fi
expect_rc 0 "service table: the cost columns" "$LB" "${COMMON[@]}" --epochs 2 --ranks 1 --mode service
expect_out "cost us +cost p99" "the table has the consumer cost columns"
expect_text "(loader serve)" "the serve's affinity line is passed on"

# --max-batches ends a service run there (the consumer detaches, the serve
# exits): 3 batches of a 1,000-epoch run, not the run.
expect_rc_stdout 0 "--mode service --max-batches 3 of 1000 epochs" \
  timeout 60 "$LB" "${COMMON[@]}" --epochs 1000 --ranks 1 --mode service --max-batches 3 --json
expect_out '"batches":3,' "the service row counts 3 batches"

# --bind off reaches the serve as --no-bind (nothing bound on either side).
expect_rc_stdout 0 "--mode service --bind off" "$LB" "${COMMON[@]}" --epochs 2 --ranks 1 --mode service --bind off --json
expect_out '"cpu_binding":"off"' "the row says cpu_binding off"
if grep -q "(loader serve)" "$W/err"; then fail "an unbound serve printed an affinity line"; else
  ok "the unbound serve binds nothing"; fi

# --- both: both tables and the ratio ----------------------------------------
expect_rc_stdout 0 "--mode both (table)" "$LB" "${COMMON[@]}" --epochs 2 --ranks 1 --mode both
expect_text "in-process:" "the in-process table"
expect_text "service (cpp consumer):" "the service table"
expect_out "service/inprocess: [0-9]+\.[0-9]+ of the in-process images/s \(target >= 0.90\)" "the ratio"
expect_out "rank 0: the cpp consumer costs [0-9.]+ us per batch = [0-9.]+% of a batch's loading time" \
  "the cost as a share of a batch's loading time"
expect_rc_stdout 0 "--mode both --json" "$LB" "${COMMON[@]}" --epochs 2 --ranks 1 --mode both --json
cp "$W/out" "$W/both.json"
expect_rc 0 "both's JSON: both runs, the ratio, the cost share" $PY - "$W/both.json" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
i, s = j["inprocess"], j["service"]
assert i["ranks"][0]["images"] == s["ranks"][0]["images"] == 301 * 2, (i["ranks"][0], s["ranks"][0])
ratio = s["total_images_per_s"] / i["total_images_per_s"]
assert abs(j["service_vs_inprocess"] - ratio) < 1e-9 * ratio, (j["service_vs_inprocess"], ratio)
c = j["consumer_cost"][0]
assert c["consumer"] == "cpp" and c["per_batch_us"] == s["ranks"][0]["consumer_us_mean"]
batch_ms = i["ranks"][0]["seconds"] / i["ranks"][0]["batches"] * 1e3
assert abs(c["percent_of_batch"] - c["per_batch_us"] / 1e3 / batch_ms * 100) < 1e-6, c
PYEOF

# --- refused -----------------------------------------------------------------
expect_rc 105 "a bad --mode is refused" "$LB" --data "$W/p" --mode ring
expect_text "--mode: ring not in {inprocess,service,both}" "the error lists the modes"
expect_rc 105 "a bad --consumer is refused" "$LB" --data "$W/p" --mode service --consumer rust
expect_rc 1 "--consumer without a service mode is refused" "$LB" --data "$W/p" --consumer python
expect_text "--consumer applies to --mode service or both" "says so"
expect_rc 1 "--topology with --mode service is refused" "$LB" --data "$W/p" --mode service \
  --topology "$(dirname "$0")/topologies/one_node_8gpu.xml"
expect_text "use --mode inprocess with --topology" "says what to do"
expect_rc 1 "--record-indices with --mode both is refused" "$LB" --data "$W/p" --mode both --record-indices "$W/x"
expect_rc 1 "a missing --loader" "$LB" --data "$W/p" --mode service --loader-bin "$W/none/loader"
expect_text "$W/none/loader, which is not an executable file" "names the path"

# --- a serve that fails, or is killed: the rank's error row, nothing left -----
expect_rc 1 "a missing shard set: the serve's error reaches the row" "$LB" --data "$W/none" --mode service --image-size 32
expect_text "before the consumer attached" "the serve ended before the attach"
expect_text "manifest.json" "its error names the manifest"

"$LB" "${COMMON[@]}" --ranks 1 --mode service --step-ms 50 --epochs 1000 >"$W/killed.out" 2>&1 &
lb=$!
pids+=("$lb")
s=""
for _ in $(seq 100); do  # until the serve has started (bounded)
  s=$(serves_of "$lb")
  [ -n "$s" ] && break
  sleep 0.1
done
sleep 0.3  # (any time in its 1000 epochs)
if [ -n "$s" ]; then kill -9 $s; else fail "no serve started"; kill -9 "$lb"; fi
wait "$lb"
check_rc $? 1 "loader_bench fails when its serve is killed"
# (Killed before its consumer attached, which a loaded machine can make happen,
# the row says so: "loader serve for rank 0 ended (...) before the consumer attached".)
if grep -Eq "error: .*loader serve (for rank 0 )?ended \(killed by signal 9\)" "$W/killed.out"; then
  ok "the row says the serve was killed"
else fail "the row: $(cat "$W/killed.out")"; fi

# --- kill -9 loader_bench: its ranks and their serves die with it ------------
"$LB" "${COMMON[@]}" --ranks 2 --mode service --step-ms 100 --epochs 1000 >/dev/null 2>&1 &
lb=$!
pids+=("$lb")
serves=""
for _ in $(seq 100); do  # until both serves have started (bounded)
  serves=$(serves_of "$lb")
  [ "$(echo $serves | wc -w)" -ge 2 ] && break
  sleep 0.1
done
if [ "$(echo $serves | wc -w)" -ge 2 ]; then ok "two serves run for two ranks"; else
  fail "serves running: '$serves'"; fi
kill -9 "$lb"
wait "$lb" 2>/dev/null
no_serve_left "$lb" "kill -9 loader_bench: no loader serve of its job is left"

# --- the Python consumer ------------------------------------------------------
# Where the build has no numa_loader package (a copy of loader_bench in a
# directory without one): a clear error before anything runs.
mkdir -p "$W/bare/bin" && cp "$LB" "$W/bare/bin/loader_bench"
expect_rc 1 "--consumer python without the package" "$W/bare/bin/loader_bench" --data "$W/p" \
  --mode service --consumer python --loader-bin "$L"
expect_text "no $W/bare/python/numa_loader/consume.py" "names the missing module"
fi  # part main

PYDIR=$(cd "$(dirname "$LB")/.." && pwd)/python
if ! part python-consumer; then
  :
elif [ -f "$PYDIR/numa_loader/consume.py" ]; then
  expect_rc_stdout 0 "--mode both --consumer python" "$LB" "${COMMON[@]}" --epochs 2 --ranks 1 --mode both --consumer python --json
  cp "$W/out" "$W/python.json"
  expect_rc 0 "the Python consumer's cost beside the share of a batch" $PY - "$W/python.json" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
s = j["service"]["ranks"][0]
assert s["consumer"] == "python" and s["images"] == 301 * 2 and s["consumer_us_mean"] > 0, s
assert j["consumer_cost"][0]["consumer"] == "python"
PYEOF
  expect_rc_stdout 0 "--consumer python --max-batches 3 of 1000 epochs" \
    timeout 60 "$LB" "${COMMON[@]}" --epochs 1000 --ranks 1 --mode service --consumer python --max-batches 3 --json
  expect_out '"batches":3,' "the Python consumer stops at 3 batches too"
else
  skip "no numa_loader package at $PYDIR: the Python consumer's run is not tested"
fi
finish

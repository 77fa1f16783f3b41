#!/usr/bin/env bash
# The trainer end to end on CPU (Gloo), with real `loader serve` processes,
# rings and TCP on loopback: DDP equals one big batch, resume equals a run
# straight, two "nodes", torchrun, the straggler named (and nobody named
# without one), learning, the metrics and the chart, and every way a job can
# end (kill -9 of a rank, of a loader service, of the launcher; Ctrl-C), with
# no process, socket or segment left behind.
# Usage: trainer_cli_test.sh PACK_TOOL TRAINER
set -uo pipefail
PT=$1
TR=$2
. "$(dirname "$0")/cli_lib.sh"

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$W"
}
trap cleanup EXIT
export TMPDIR=$W  # torchrun's own scratch directories

shm_before=$(ls -A /dev/shm | sort)
PORT=$((20000 + ($$ % 20000)))
next_port() { PORT=$((PORT + 1)); }

# Nothing of a launch is left: no trainer or loader serve of its job, no
# abstract socket of it, /dev/shm as before.
nothing_left() {
  local job=$1 what=$2 i
  for ((i = 0; i < 100; i++)); do
    if ! pgrep -f -- "$job" >/dev/null && ! grep -q "@numa_loader/$job" /proc/net/unix; then break; fi
    sleep 0.1
  done
  if pgrep -f -- "$job" >/dev/null; then
    fail "$what: processes left: $(pgrep -af -- "$job")"
  elif grep -q "@numa_loader/$job" /proc/net/unix; then
    fail "$what: a socket of $job is left"
  elif [ "$(ls -A /dev/shm | sort)" != "$shm_before" ]; then
    fail "$what: /dev/shm changed: $(ls -A /dev/shm)"
  else
    ok "$what: nothing left (processes, sockets, /dev/shm)"
  fi
}

# maxdiff A B: the largest absolute difference of two float32 files.
maxdiff() { $PY -c "import numpy as n,sys; a=n.fromfile(sys.argv[1],n.float32); b=n.fromfile(sys.argv[2],n.float32); print(abs(a-b).max() if a.size==b.size and a.size else 'size')" "$1" "$2"; }
# lt X LIMIT: X is a number below LIMIT.
lt() { $PY -c "import sys; sys.exit(0 if sys.argv[1] != 'size' and float(sys.argv[1]) < float(sys.argv[2]) else 1)" "$1" "$2"; }

"$PT" fake-cifar100 "$W/c100" --train 2000 --test 400 --seed 0 >/dev/null &&
  "$PT" cifar100 "$W/c100" "$W/p" >/dev/null && ok "a 2000-image CIFAR-100 shard set" ||
  fail "could not make the shard set"
"$PT" fake-cifar100 "$W/s100" --train 400 --test 100 --seed 1 >/dev/null &&
  "$PT" cifar100 "$W/s100" "$W/s" >/dev/null && ok "a 400-image one" || fail "could not make the small set"

SMALL=(--model smallcnn --image-size 32 --allow-shared-cores --report-every 0)

# --- four ranks, the table, the metrics and the chart --------------------------
next_port
expect_rc_stdout 0 "4 ranks train one epoch" "$TR" --data "$W/p" "${SMALL[@]}" --nproc-per-node 4 \
  --batch-size 16 --epochs 1 --report-every 10 --master-port "$PORT" --metrics-out "$W/m4/metrics.jsonl" \
  --out "$W/m4"
expect_out "^rank +data ms mean/p95" "rank 0 prints the per-rank table"
expect_out "^ +3 +[0-9.]+ / [0-9.]+ " "with a line for rank 3"
expect_text "straggler: none" "nobody is named without a straggler"
expect_out "^epoch 0: train loss [0-9.]+, test top-1 [0-9.]+%, top-5" "the epoch line with test accuracy"
$PY - "$W/m4/metrics.jsonl" >"$W/out" 2>&1 <<'PYEOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
reports = [l for l in lines if "rank" in l]
epochs = [l for l in lines if "train_loss" in l]
# 32 steps an epoch: reports at steps 10, 20, 30 and the epoch's end, 4 ranks each
assert len(reports) == 16, len(reports)
for r in reports:
    for k in ("epoch", "step", "rank", "data_ms", "compute_ms", "comm_ms", "step_ms", "loss"):
        assert k in r, (k, r)
assert sorted({r["rank"] for r in reports}) == [0, 1, 2, 3]
assert len(epochs) == 1, epochs
e = epochs[0]
assert e["straggler"] is None and 0 <= e["test_top1"] <= 1 and 0 <= e["test_top5"] <= 1, e
assert e["test_top5"] >= e["test_top1"] and e["images_per_s"] > 0, e
print("metrics ok")
PYEOF
check_rc $? 0 "metrics: 16 report lines (4 reports x 4 ranks) and one epoch line, as documented"
if grep -q "<svg" "$W/m4/timing-epoch-0.svg" 2>/dev/null && grep -q "rank 3" "$W/m4/timing-epoch-0.svg"; then
  ok "the chart is written next to the metrics"
else
  fail "no chart at $W/m4/timing-epoch-0.svg"
fi
nothing_left "trainer-$PORT-" "after a clean run"

# --- the straggler ------------------------------------------------------------
next_port
expect_rc_stdout 0 "--simulate-slow-rank 3 --delay-ms 40" "$TR" --data "$W/p" "${SMALL[@]}" \
  --nproc-per-node 4 --batch-size 16 --epochs 1 --master-port "$PORT" --simulate-slow-rank 3 \
  --delay-ms 40 --metrics-out "$W/slow.jsonl"
expect_text "straggler: Rank 3 is the straggler" "rank 3 is named"
expect_out "--simulate-slow-rank 3" "with its cause"
expect_out "Ranks 0, 1 and 2 wait [0-9.]+ ms a step in the all-reduce for rank 3" \
  "and the others' wait in the all-reduce"
if grep -q '"straggler":3' "$W/slow.jsonl"; then ok "the epoch record names rank 3"; else fail "no straggler 3 in the metrics"; fi

# --- DDP equals one rank of the whole batch (smallcnn: no batch norm) ----------
next_port
expect_rc 0 "2 ranks x batch 16, --check-sync" "$TR" --data "$W/p" "${SMALL[@]}" --nproc-per-node 2 \
  --batch-size 16 --max-steps 10 --lr 0.05 --master-port "$PORT" --check-sync --params-out "$W/w2.bin"
expect_text "parameters identical on all ranks after every step (10 checks)" "every step's parameters equal on both ranks"
next_port
expect_rc 0 "1 rank x batch 32" "$TR" --data "$W/p" "${SMALL[@]}" --nproc-per-node 1 --batch-size 32 \
  --max-steps 10 --lr 0.05 --master-port "$PORT" --params-out "$W/w1.bin"
d=$(maxdiff "$W/w1.bin" "$W/w2.bin")
if lt "$d" 1e-5; then ok "the same parameters after 10 steps (max |diff| $d < 1e-5)"; else fail "parameters differ: $d"; fi

# --- resume equals a run straight (resnet18, with batch norm) -------------------
R18=(--data "$W/s" --model resnet18 --image-size 32 --allow-shared-cores --report-every 0 --nproc-per-node 2
  --batch-size 16 --epochs 2)
next_port
expect_rc 0 "resnet18: 2 epochs straight" "$TR" "${R18[@]}" --master-port "$PORT" --params-out "$W/a.bin"
next_port
expect_rc 0 "resnet18: stopped after 20 steps (mid-epoch 1)" "$TR" "${R18[@]}" --master-port "$PORT" \
  --max-steps 20 --checkpoint-every 7 --out "$W/ck"
next_port
expect_rc_stdout 0 "resumed from its checkpoint" "$TR" "${R18[@]}" --master-port "$PORT" \
  --resume "$W/ck/checkpoint.pt" --params-out "$W/b.bin"
d=$(maxdiff "$W/a.bin" "$W/b.bin")
if lt "$d" 1e-6; then ok "the same parameters as straight (max |diff| $d)"; else fail "resume differs: $d"; fi
next_port
expect_rc 1 "a checkpoint of 2 ranks refused by 1" "$TR" "${R18[@]}" --nproc-per-node 1 --master-port "$PORT" \
  --resume "$W/ck/checkpoint.pt"
expect_text "written by 2 ranks of batch 16" "saying why"

# --- two nodes on loopback, and torchrun ----------------------------------------
TWO=(--data "$W/p" "${SMALL[@]}" --nproc-per-node 2 --batch-size 8 --max-steps 10)
next_port
"$TR" "${TWO[@]}" --nnodes 2 --node-rank 1 --master-port "$PORT" >"$W/node1.out" 2>&1 &
N1=$!
pids+=("$N1")
expect_rc 0 "node 0 of 2" "$TR" "${TWO[@]}" --nnodes 2 --node-rank 0 --master-port "$PORT" --params-out "$W/two.bin"
wait "$N1"
check_rc $? 0 "node 1 of 2"
if grep -q "launched ranks 2..3 of 4" "$W/node1.out"; then ok "node 1 ran ranks 2 and 3"; else fail "node 1: $(cat "$W/node1.out")"; fi
next_port
expect_rc 0 "one node, 4 ranks" "$TR" "${TWO[@]}" --nproc-per-node 4 --master-port "$PORT" --params-out "$W/one.bin"
d=$(maxdiff "$W/one.bin" "$W/two.bin")
if lt "$d" 1e-6; then ok "two nodes train as one (max |diff| $d)"; else fail "two nodes differ: $d"; fi
next_port
expect_rc 0 "under torchrun (--no_python), one rank per process" /usr/bin/python3 -m torch.distributed.run \
  -r 2 -t 2 --nproc_per_node 2 --master_port "$PORT" --no_python "$TR" "${TWO[@]}" --params-out "$W/tr.bin"
next_port
expect_rc 0 "the same job under our launcher" "$TR" "${TWO[@]}" --master-port "$PORT" --params-out "$W/ours.bin"
d=$(maxdiff "$W/tr.bin" "$W/ours.bin")
if lt "$d" 1e-6; then ok "torchrun's ranks train as ours (max |diff| $d)"; else fail "torchrun differs: $d"; fi

# --- learning -------------------------------------------------------------------
next_port
expect_rc 0 "smallcnn, 4 epochs" "$TR" --data "$W/p" "${SMALL[@]}" --nproc-per-node 2 --batch-size 16 \
  --epochs 4 --lr 0.2 --master-port "$PORT" --metrics-out "$W/learn.jsonl"
top1=$($PY -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if 'test_top1' in l][-1]['test_top1'])" "$W/learn.jsonl")
if lt 0.15 "$top1"; then ok "test top-1 $top1 > 0.15 (chance: 0.01)"; else fail "test top-1 $top1"; fi

# --- the loader in process, and resizing on the device -------------------------
next_port
expect_rc_stdout 0 "--loader inprocess" "$TR" --data "$W/p" "${SMALL[@]}" --nproc-per-node 2 --batch-size 16 \
  --max-steps 5 --loader inprocess --master-port "$PORT"
expect_text "loader inprocess" "says so"
expect_text "(the pipelines' workers, all ranks)" "and where its loader CPU time was counted"
next_port
expect_rc_stdout 0 "--resize-on device at 64" "$TR" --data "$W/p" "${SMALL[@]}" --image-size 64 \
  --nproc-per-node 2 --batch-size 16 --max-steps 5 --resize-on device --master-port "$PORT"
expect_text "resized on the device from 32" "the ring carries 32x32"
expect_out "loader CPU time [0-9.]+ us per image \(the loader services' processes, all ranks\), ring bytes per image 3072" \
  "3072 bytes an image, and the loader's CPU time per image"
next_port
expect_rc_stdout 0 "--resize-on loader at 64" "$TR" --data "$W/p" "${SMALL[@]}" --image-size 64 \
  --nproc-per-node 2 --batch-size 16 --max-steps 5 --master-port "$PORT"
expect_out "ring bytes per image 12288$" "12288 bytes an image"

# --- every way a job can die ----------------------------------------------------
LONG=(--data "$W/s" --model resnet18 --image-size 32 --allow-shared-cores --report-every 0 --nproc-per-node 4
  --batch-size 8 --epochs 50)
# rank_pid LAUNCHER RANK: the pid of that rank (a child with RANK=R in its environment).
rank_pid() {
  local p
  for p in $(pgrep -P "$1"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$2"; then echo "$p"; fi
  done
}
# start_long NAME: a long job in the background; sets $LP; waits until rank 2 trains.
start_long() {
  next_port
  "$TR" "${LONG[@]}" --master-port "$PORT" >"$W/$1.out" 2>&1 &
  LP=$!
  pids+=("$LP")
  local i
  for ((i = 0; i < 300; i++)); do
    grep -qs "steps an epoch" "$W/$1.out" && break
    sleep 0.1
  done
  sleep 1
}
# wait_gone PID LIMIT: exit code of PID, 255 if it outlived LIMIT seconds; $SECS gets the time.
wait_gone() {
  local start=$SECONDS i
  for ((i = 0; i < $2 * 10; i++)); do
    if ! kill -0 "$1" 2>/dev/null; then
      wait "$1"
      local rc=$?
      SECS=$((SECONDS - start))
      return $rc
    fi
    sleep 0.1
  done
  kill -9 "$1" 2>/dev/null
  SECS=$2
  return 255
}

start_long k_rank
R2=$(rank_pid "$LP" 2)
kill -9 "$R2"
wait_gone "$LP" 30
check_rc $? 1 "kill -9 rank 2: the launcher exits 1 within 30 s (${SECS} s)"
if grep -Eq "^trainer: rank 2 failed \(killed by signal 9\); (stopped ranks 0, 1 and 3|rank)" "$W/k_rank.out"; then
  ok "naming rank 2 and its cause"
else
  fail "kill -9 rank 2: $(tail -3 "$W/k_rank.out")"
fi
nothing_left "trainer-$PORT-" "after kill -9 of a rank"

start_long k_serve
S1=$(pgrep -f -- "loader serve .*--job-id trainer-$PORT-[0-9]* --rank 1 ")
kill -9 "$S1"
wait_gone "$LP" 30
check_rc $? 1 "kill -9 rank 1's loader service: the launcher exits 1 within 30 s (${SECS} s)"
if grep -q "rank 1 failed (exit status 1: trainer rank 1: error: its loader service (pid $S1)" "$W/k_serve.out"; then
  ok "naming rank 1 and its loader service"
else
  fail "kill -9 of a loader service: $(tail -3 "$W/k_serve.out")"
fi
nothing_left "trainer-$PORT-" "after kill -9 of a loader service"

start_long k_launcher
kill -9 "$LP"
wait "$LP" 2>/dev/null
nothing_left "trainer-$PORT-" "after kill -9 of the launcher (ranks and services die with it)"

start_long k_int
kill -INT "$LP"
wait_gone "$LP" 30
check_rc $? 130 "SIGINT (Ctrl-C) to the launcher: exit 130 within 30 s (${SECS} s)"
if grep -q "stopped by SIGINT" "$W/k_int.out"; then ok "it says it was stopped by SIGINT"; else fail "SIGINT: $(tail -2 "$W/k_int.out")"; fi
nothing_left "trainer-$PORT-" "after SIGINT"

# --- what users get wrong -------------------------------------------------------
expect_rc 105 "--model vgg16 is refused" "$TR" --data "$W/p" --model vgg16
expect_text "vgg16" "naming the value"
expect_rc 2 "--node-rank 2 of --nnodes 2" "$TR" --data "$W/p" --nnodes 2 --node-rank 2
expect_text "--node-rank 2 is not below --nnodes 2" "saying why"
expect_rc 2 "--simulate-slow-rank 4 of 4 ranks" "$TR" --data "$W/p" --nproc-per-node 4 --simulate-slow-rank 4 --delay-ms 5
expect_text "is not a rank of 4" "saying why"
expect_rc 2 "--lr nan is refused" "$TR" --data "$W/p" --lr nan
expect_text "--lr must be a finite number" "saying so"
expect_rc 2 "RANK without WORLD_SIZE" env RANK=0 "$TR" --data "$W/p"
expect_text "must be set together" "saying what is missing"
expect_rc 2 "WORLD_SIZE=abc" env RANK=0 WORLD_SIZE=abc LOCAL_RANK=0 "$TR" --data "$W/p"
expect_text "WORLD_SIZE=abc is not an integer" "naming the variable"
next_port
expect_rc 1 "a missing shard set" "$TR" --data "$W/nothing" --master-port "$PORT"
expect_text "rank 0 failed" "names the rank"
expect_text "$W/nothing" "and the path"
touch "$W/a-file"
next_port
expect_rc 1 "--out on a file" "$TR" --data "$W/p" "${SMALL[@]}" --nproc-per-node 2 --max-steps 2 \
  --master-port "$PORT" --out "$W/a-file"
expect_text "trainer: rank 0 failed (exit status 1: trainer rank 0: error: --out $W/a-file is not a writable directory)" \
  "rank 0 is named with the cause (not a peer that lost it)"
next_port
expect_rc 1 "--metrics-out in a missing directory" "$TR" --data "$W/p" "${SMALL[@]}" --nproc-per-node 2 \
  --max-steps 2 --master-port "$PORT" --metrics-out "$W/no/such/m.jsonl"
expect_text "cannot write --metrics-out $W/no/such/m.jsonl" "naming it"
next_port
expect_rc 1 "--params-out on a directory is refused before training" "$TR" --data "$W/p" "${SMALL[@]}" \
  --nproc-per-node 2 --max-steps 2 --master-port "$PORT" --params-out "$W"
expect_text "trainer rank 0: error: --params-out $W is a directory" "naming it"
# Two jobs on one port: the second fails clearly; the first is not disturbed.
next_port
"$TR" "${LONG[@]}" --epochs 1 --max-steps 30 --master-port "$PORT" >"$W/first.out" 2>&1 &
FIRST=$!
pids+=("$FIRST")
for ((i = 0; i < 300; i++)); do grep -qs "steps an epoch" "$W/first.out" && break; sleep 0.1; done
expect_rc 1 "a second job on the same --master-port" "$TR" --data "$W/p" "${SMALL[@]}" --nproc-per-node 2 \
  --max-steps 2 --master-port "$PORT"
expect_text "another job may be using it: pick another --master-port" "saying so"
wait "$FIRST"
check_rc $? 0 "the first job finishes undisturbed"
nodes=$(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l)
if [ "$nodes" -le 1 ]; then
  next_port
  expect_rc 1 "--misbind-rank on a machine with one NUMA node" "$TR" --data "$W/p" "${SMALL[@]}" \
    --nproc-per-node 2 --max-steps 2 --misbind-rank 1 --master-port "$PORT"
  expect_text "no wrong node to bind to" "is refused, saying why"
fi
finish

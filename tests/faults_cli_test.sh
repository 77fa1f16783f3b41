#!/usr/bin/env bash
# Injected faults: pack_tool killed with SIGKILL at many points of a pack (OUT
# is absent or complete, never partial; the next run cleans what the killed
# one left), and a shard corrupted, truncated or deleted under a running
# training job (the loader names the record or the shard, the trainer exits
# with that message, nothing is left; a deleted file is still read whole).
# Usage: faults_cli_test.sh PACK_TOOL TRAINER
set -uo pipefail
PT=$1
TR=$2
. "$(dirname "$0")/cli_lib.sh"

export TMPDIR=$W

# --- pack_tool killed at many points -------------------------------------------
expect_rc 0 "a CIFAR-100 of 30,000 images" "$PT" fake-cifar100 "$W/c100" --train 30000 --test 2000
# One timed pack to spread the kills over its length (reading, shards, manifest).
start=$(date +%s%N)
expect_rc 0 "a whole pack (to time it)" "$PT" cifar100 "$W/c100" "$W/timed" --shards 3 --threads 1
full_ms=$((($(date +%s%N) - start) / 1000000))
rm -rf "$W/timed"
absent=0 complete=0
for pct in 1 5 10 20 30 40 50 60 70 80 90 95 99 110; do
  "$PT" cifar100 "$W/c100" "$W/packed" --shards 3 --threads 1 >"$W/kill.log" 2>&1 &
  p=$!
  sleep "$(awk -v ms="$full_ms" -v pct="$pct" 'BEGIN { printf "%.3f", ms * pct / 100000 }')"
  kill -9 "$p" 2>/dev/null
  wait "$p" 2>/dev/null
  if [ ! -e "$W/packed" ]; then
    absent=$((absent + 1))
    ok "killed at $pct% of a pack: OUT is absent"
  elif "$PT" verify "$W/packed" >"$W/verify.log" 2>&1; then
    complete=$((complete + 1))
    ok "killed at $pct% of a pack: OUT is complete and verifies"
  else
    fail "killed at $pct% of a pack: OUT is there but does not verify: $(tail -3 "$W/verify.log")"
  fi
  # The next run packs (over a complete OUT only with --force) and cleans up.
  force=()
  [ -e "$W/packed" ] && force=(--force)
  expect_rc 0 "the next pack after the kill at $pct% succeeds" "$PT" cifar100 "$W/c100" "$W/packed" --shards 3 \
    --threads 1 ${force[@]+"${force[@]}"}
  left=$(cd "$W" && ls -A | grep -E '^packed\.' | tr '\n' ' ')
  [ -z "$left" ] && ok "... and leaves no temporary or lock beside OUT" || fail "left beside OUT: $left"
  rm -rf "$W/packed"
done
# Where the kills land depends on the machine's load: said, not checked.
echo "# kills: $absent left no OUT, $complete a complete one"

# --- a shard damaged under a running job ------------------------------------------
expect_rc 0 "a small CIFAR-100" "$PT" fake-cifar100 "$W/small" --train 2000 --test 200 --seed 0
expect_rc 0 "packed" "$PT" cifar100 "$W/small" "$W/p"
PORT_LO=26000 PORT_HI=32000  # trainer_cli, which may run beside this one, takes 20000-25999
PORT=$((PORT_LO + $$ % (PORT_HI - PORT_LO)))
shm_before=$(ls -A /dev/shm | sort)

# start_job NAME DATA EPOCHS: a 2-rank job through the loader service, in the
# background ($JP), once it trains.
start_job() {
  next_port
  start_training "$1" "$TR" --data "$2" --model smallcnn --image-size 32 --allow-shared-cores --report-every 0 \
    --nproc-per-node 2 --batch-size 16 --epochs "$3" --master-port "$PORT" --out "$W/$1.run"
  JP=$BG
}
nothing_left() {
  local i
  for ((i = 0; i < 100; i++)); do
    pgrep -f -- "trainer-$PORT-" >/dev/null || break
    sleep 0.1
  done
  if pgrep -f -- "trainer-$PORT-" >/dev/null; then
    fail "$1: processes left: $(pgrep -af -- "trainer-$PORT-")"
  elif [ "$(ls -A /dev/shm | sort)" != "$shm_before" ]; then
    fail "$1: /dev/shm changed: $(ls -A /dev/shm)"
  else
    ok "$1: no process of the job left, /dev/shm as before"
  fi
}

# Every record's payload altered in place (its CRC no longer matches).
cp -r "$W/p" "$W/p_corrupt"
start_job corrupt "$W/p_corrupt" 50
expect_rc 0 "corrupt every record of the running job's shard in place" $PY - "$W/p_corrupt/train/shard-00000/data.mdb" <<'PYEOF'
import os, sys
with open(sys.argv[1], "r+b") as f:
    data = f.read()
    i = data.find(b"NLRC")
    while i >= 0:
        f.seek(i + 32 + 100)
        f.write(bytes([data[i + 32 + 100] ^ 0x55]))
        i = data.find(b"NLRC", i + 32)
    f.flush()
    os.fsync(f.fileno())
PYEOF
wait_exit "$JP" 60
check_rc $? 1 "the trainer exits 1"
cp "$W/corrupt.out" "$W/out"
expect_out "shard train/shard-00000, index [0-9]+: .*checksum" "its message names the shard, the record and the checksum"
nothing_left "a shard corrupted under the job"

# The shard cut to half its size (the loader's map loses its pages).
cp -r "$W/p" "$W/p_cut"
start_job cut "$W/p_cut" 50
truncate -s 1M "$W/p_cut/train/shard-00000/data.mdb"
wait_exit "$JP" 60
check_rc $? 1 "the trainer exits 1"
cp "$W/cut.out" "$W/out"
expect_out "train/shard-00000.*(truncated|shorter)" "its message names the shard and says it was cut"
nothing_left "a shard truncated under the job"

# The shard deleted: the open file is still read whole, to the job's end.
cp -r "$W/p" "$W/p_gone"
start_job gone "$W/p_gone" 2
rm -rf "$W/p_gone/train"
wait_exit "$JP" 120
check_rc $? 0 "a job whose shard is deleted under it ends normally (it reads the open file)" ||
  tail -5 "$W/gone.out"
nothing_left "a shard deleted under the job"

finish

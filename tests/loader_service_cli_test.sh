#!/usr/bin/env bash
# The loader service end to end, as two terminals would run it: `loader serve`
# in one process, `loader consume` in another, and every way either can end
# (detach, kill -9, SIGTERM, SIGSTOP, a bad record, another user, a second
# consumer). After each: nothing of ours is left in /dev/shm, in the abstract
# socket namespace, or in the working directory.
# Usage: loader_service_cli_test.sh PACK_TOOL LOADER
set -uo pipefail
PT=$1
L=$2
. "$(dirname "$0")/cli_lib.sh"

JOB="svc$$"

shm_before=$(ls -A /dev/shm | sort)

# our_sockets JOB: abstract sockets of that job still bound.
our_sockets() { grep -c "@numa_loader/$1/" /proc/net/unix; }

# serve NAME ARGS...: starts `loader serve` in the background (log $W/NAME.log), sets $SP.
serve() {
  local name=$1
  shift
  "$L" serve "$@" >"$W/$name.log" 2>&1 &
  SP=$!
  pids+=("$SP")
}

# logged NAME TEXT: waits (up to 30 s) until serve NAME's log holds TEXT.
logged() {
  local i
  for ((i = 0; i < 600; i++)); do
    grep -qF -- "$2" "$W/$1.log" && return 0
    sleep 0.05
  done
  echo "    (serve $1 did not log '$2' within 30 s)"
  return 1
}
# attached NAME: waits until serve NAME logs its consumer's attach, then a
# moment more, so what follows lands mid-stream. (A fixed sleep was not
# enough: under ASan on a loaded machine attaching took longer than 0.5 s, and
# a signal sent before it tests something else.)
attached() { logged "$1" " attached (" && sleep 0.2; }

# nothing_left JOB NAME: no socket of JOB, /dev/shm as it was, no stray file here.
nothing_left() {
  local n
  n=$(our_sockets "$1")
  if [ "$n" -eq 0 ] && [ "$(ls -A /dev/shm | sort)" == "$shm_before" ] && [ -z "$(ls -A "$W/cwd")" ]; then
    ok "$2: nothing left (no socket, /dev/shm unchanged, no file)"
  else
    fail "$2: left behind: $n sockets; /dev/shm: $(ls -A /dev/shm | tr '\n' ' '); cwd: $(ls -A "$W/cwd")"
  fi
}

mkdir -p "$W/cwd"
cd "$W/cwd" || exit 1
"$PT" fake-cifar100 "$W/c" --train 100 --test 10 >/dev/null &&
  "$PT" cifar100 "$W/c" "$W/d" >/dev/null 2>&1 || {
  echo "could not make the test data"
  exit 1
}
COMMON=(--data "$W/d" --batch-size 8 --image-size 32 --threads 1 --no-bind)

if part main; then
# --- two epochs, in order, the metadata right --------------------------------
serve ok1 "${COMMON[@]}" --job-id "$JOB-a" --epochs 2 --seed 7
expect_rc_stdout 0 "consume reads both epochs of a 2-epoch serve" \
  "$L" consume --job-id "$JOB-a" --json --timeout 30
expect_out '"batches":26[,}]' "13 batches per epoch, 26 in all"
expect_out '"epochs":\[0,1\]' "epochs 0 and 1"
expect_text '"end":"the producer'"'"'s last epoch is out"' "the end of --epochs is reported as the end"
wait_exit "$SP" 10
check_rc $? 0 "serve exits 0 when its consumer detaches"
if grep -q "detached; 26 batches (200 images) were published" "$W/ok1.log"; then ok "serve says the consumer detached"; else fail "serve log: $(cat "$W/ok1.log")"; fi
nothing_left "$JOB-a" "after a clean run"

# --- --batches across epochs, resume at (epoch, batch) -----------------------
serve ok2 "${COMMON[@]}" --job-id "$JOB-b" --seed 7
expect_rc_stdout 0 "consume --batches 30 on an unbounded serve" \
  "$L" consume --job-id "$JOB-b" --batches 30 --json --timeout 30
expect_out '"batches":30[,}]' "30 batches"
expect_out '"epochs":\[0,1,2\]' "across epochs 0, 1 and 2"
wait_exit "$SP" 10
check_rc $? 0 "serve exits 0 after the consumer's --batches"
serve ok3 "${COMMON[@]}" --job-id "$JOB-c" --seed 7
expect_rc_stdout 0 "consume --start-epoch 3 --start-batch 5" \
  "$L" consume --job-id "$JOB-c" --batches 4 --start-epoch 3 --start-batch 5 --json --timeout 30
expect_out '"first_epoch":3,' "starts at epoch 3"
expect_out '"first_batch":5,' "starts at batch 5"
wait_exit "$SP" 10
check_rc $? 0 "serve exits 0"

# The same batches through the ring twice: byte for byte the same.
serve d1 "${COMMON[@]}" --job-id "$JOB-d1" --seed 3 --epochs 1
expect_rc 0 "dump one epoch" "$L" consume --job-id "$JOB-d1" --dump "$W/d1.bin" --timeout 30
wait_exit "$SP" 10 >/dev/null
serve d2 "${COMMON[@]}" --job-id "$JOB-d2" --seed 3 --epochs 1
expect_rc 0 "dump it again" "$L" consume --job-id "$JOB-d2" --dump "$W/d2.bin" --timeout 30
wait_exit "$SP" 10 >/dev/null
if [ -s "$W/d1.bin" ] && cmp -s "$W/d1.bin" "$W/d2.bin"; then
  ok "two runs with one seed give the same bytes ($(stat -c %s "$W/d1.bin") bytes)"
else
  fail "two runs with one seed differ"
fi

# --- kill -9 the producer mid-epoch ------------------------------------------
serve k1 "${COMMON[@]}" --job-id "$JOB-k1"
"$L" consume --job-id "$JOB-k1" --timeout 60 >"$W/k1c.out" 2>&1 &
CP=$!
pids+=("$CP")
attached k1
kill -9 "$SP"
wait_exit "$CP" 20
check_rc $? 1 "consume fails when its producer is killed (not after its 60 s timeout)"
if grep -q "is gone: it closed the connection without a word (killed" "$W/k1c.out" &&
  grep -q "pid $SP" "$W/k1c.out"; then
  ok "the error names the producer's pid and says it died"
else
  fail "kill -9 producer: $(cat "$W/k1c.out")"
fi
wait "$SP" 2>/dev/null
nothing_left "$JOB-k1" "after kill -9 of the producer"

# --- a producer that crashes says so -------------------------------------------
# (Under AddressSanitizer, ASan's own SIGSEGV handler would report the signal
# and abort: handle_segv=0 leaves the serve's crash handler to be tested.)
for sig in SEGV ABRT; do
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}handle_segv=0" serve x1 "${COMMON[@]}" --job-id "$JOB-x$sig"
  "$L" consume --job-id "$JOB-x$sig" --timeout 60 >"$W/x1c.out" 2>&1 &
  CP=$!
  pids+=("$CP")
  attached x1
  kill -"$sig" "$SP"
  wait_exit "$CP" 20
  check_rc $? 1 "consume fails when its producer gets SIG$sig"
  if grep -q "pid $SP) failed: crashed with SIG$sig" "$W/x1c.out"; then
    ok "the error says the producer crashed with SIG$sig"
  else
    fail "SIG$sig: $(cat "$W/x1c.out")"
  fi
  wait "$SP" 2>/dev/null
  nothing_left "$JOB-x$sig" "after SIG$sig"
done

# --- kill -9 the consumer ----------------------------------------------------
serve k2 "${COMMON[@]}" --job-id "$JOB-k2"
"$L" consume --job-id "$JOB-k2" >/dev/null 2>&1 &
CP=$!
attached k2
kill -9 "$CP"
wait "$CP" 2>/dev/null
wait_exit "$SP" 10
check_rc $? 1 "serve exits (1) when its consumer is killed"
if grep -q "went away without detaching" "$W/k2.log"; then ok "serve says the consumer went away"; else fail "$(cat "$W/k2.log")"; fi
nothing_left "$JOB-k2" "after kill -9 of the consumer"
# Again, at random moments: a consumer killed inside a wait must never leave
# the producer blocked (glibc condition variables would: hence semaphores),
# so each producer ends by itself, not by its one-second last resort.
hung=0
for i in 1 2 3 4 5 6; do
  serve k3 "${COMMON[@]}" --job-id "$JOB-k3-$i" --prefetch 1
  "$L" consume --job-id "$JOB-k3-$i" >/dev/null 2>&1 &
  CP=$!
  # Killed while streaming, not before it attached (the producer would then
  # rightly go on waiting for a consumer).
  attached k3
  sleep "0.$((RANDOM % 4 + 2))"
  kill -9 "$CP"
  wait "$CP" 2>/dev/null
  wait_exit "$SP" 10
  rc=$?
  if [ "$rc" -ne 1 ] || ! grep -q "went away without detaching" "$W/k3.log"; then
    hung=$((hung + 1))
    sed 's/^/    /' "$W/k3.log"
  fi
done
check_rc "$hung" 0 "six consumers killed at random moments: each producer notices and ends by itself"

# --- SIGTERM and SIGINT ------------------------------------------------------
serve t1 "${COMMON[@]}" --job-id "$JOB-t1"
"$L" consume --job-id "$JOB-t1" --timeout 60 >"$W/t1c.out" 2>&1 &
CP=$!
pids+=("$CP")
attached t1
kill -TERM "$SP"
wait_exit "$SP" 10
check_rc $? 143 "SIGTERM: serve exits 128+15"
wait_exit "$CP" 10
check_rc $? 1 "and its consumer reports it"
if grep -q "pid $SP) was stopped by SIGTERM" "$W/t1c.out"; then ok "the consumer says the producer was stopped by SIGTERM"; else fail "$(cat "$W/t1c.out")"; fi
nothing_left "$JOB-t1" "after SIGTERM to the producer"

serve t2 "${COMMON[@]}" --job-id "$JOB-t2"
"$L" consume --job-id "$JOB-t2" >"$W/t2c.out" 2>&1 &
CP=$!
pids+=("$CP")
attached t2
kill -INT "$CP"
wait_exit "$CP" 10
check_rc $? 130 "SIGINT: consume exits 128+2"
if grep -q "stopped by SIGINT" "$W/t2c.out"; then ok "consume reports what it read before the SIGINT"; else fail "$(cat "$W/t2c.out")"; fi
wait_exit "$SP" 10
check_rc $? 0 "its producer sees a clean detach and exits 0"
nothing_left "$JOB-t2" "after SIGINT to the consumer"

serve t3 "${COMMON[@]}" --job-id "$JOB-t3"
sleep 0.3
kill -TERM "$SP"
wait_exit "$SP" 10
check_rc $? 143 "SIGTERM before any consumer attached: serve exits 128+15"

# --- a stopped producer: alive, silent ---------------------------------------
serve s1 "${COMMON[@]}" --job-id "$JOB-s1"
"$L" consume --job-id "$JOB-s1" --timeout 1 >"$W/s1c.out" 2>&1 &
CP=$!
pids+=("$CP")
attached s1
kill -STOP "$SP"
wait_exit "$CP" 20
check_rc $? 2 "consume gives up after --timeout on a SIGSTOPped producer (exit 2)"
if grep -q "is alive but has sent nothing for" "$W/s1c.out" && grep -q "stopped (SIGSTOP" "$W/s1c.out"; then
  ok "it says the producer is alive but stopped, and for how long"
else
  fail "$(cat "$W/s1c.out")"
fi
kill -CONT "$SP"
wait_exit "$SP" 10
check_rc $? 0 "the producer, continued, sees the consumer gone and exits"
nothing_left "$JOB-s1" "after SIGSTOP"

# --- one consumer per rank, one producer per rank ------------------------------
serve o1 "${COMMON[@]}" --job-id "$JOB-o1"
"$L" consume --job-id "$JOB-o1" >/dev/null 2>&1 &
CP=$!
pids+=("$CP")
attached o1
expect_rc 1 "a second consumer is refused" "$L" consume --job-id "$JOB-o1" --batches 1 --timeout 5
expect_text "already has a consumer (pid $CP)" "it is told which process holds the rank"
expect_rc 1 "a second producer for the same job and rank is refused" \
  "$L" serve "${COMMON[@]}" --job-id "$JOB-o1"
expect_text "another loader serve already serves this job and rank" "and says why"
kill -TERM "$CP"
wait_exit "$CP" 10 >/dev/null
wait_exit "$SP" 10
check_rc $? 0 "the first pair ends cleanly"

# --- bad input ---------------------------------------------------------------
expect_rc 1 "consume with no producer gives up after --attach-timeout" \
  "$L" consume --job-id "$JOB-none" --attach-timeout 0.3
expect_text "no loader serve for job $JOB-none, rank 0 appeared within 0.3 s" "and says which job and rank"
expect_rc 1 "--start-batch without --start-epoch is refused" "$L" consume --job-id x --start-batch 3
expect_text "--start-batch needs --start-epoch" "saying what is missing"
expect_rc 1 "a job id with a '/' is refused" "$L" consume --job-id "a/b" --attach-timeout 0
expect_text "without spaces or '/'" "naming the rule"
expect_rc 1 "serve --rank 2 --world-size 2 is refused" "$L" serve "${COMMON[@]}" --job-id x --rank 2 --world-size 2
expect_rc 1 "a ring larger than half the machine's memory is refused before it is made" \
  "$L" serve --data "$W/d" --job-id x --batch-size 4096 --prefetch 1024 --image-size 1024 --no-bind
expect_text "more than half of this machine's" "saying so"
expect_rc 1 "RANK=abc in the environment is refused" env RANK=abc "$L" serve "${COMMON[@]}" --job-id x
expect_text "RANK" "naming the variable"

# A record whose payload fails its checksum: the consumer reports the producer's reason.
cp -r "$W/d" "$W/bad"
$PY - "$W/bad/train/shard-00000/data.mdb" <<'PYEOF'
import lmdb, struct, sys
env = lmdb.open(sys.argv[1].rsplit("/", 1)[0], subdir=True, lock=False)
with env.begin() as txn:
    v = txn.get(struct.pack(">Q", 37))
data = bytearray(open(sys.argv[1], "rb").read())
at = data.find(v)
assert at > 0
data[at + len(v) - 5] ^= 0xFF  # a payload byte: the record's CRC no longer matches
open(sys.argv[1], "r+b").write(data)
PYEOF
serve b1 --data "$W/bad" --batch-size 8 --image-size 32 --threads 1 --no-bind --job-id "$JOB-b1" --no-shuffle
expect_rc 1 "a bad record: the consumer fails" "$L" consume --job-id "$JOB-b1" --timeout 30
expect_out "failed: .*(Corruption|checksum|CRC).*37" "with the producer's own error text, naming record 37"
wait_exit "$SP" 10
check_rc $? 1 "and the producer exits 1"
nothing_left "$JOB-b1" "after a bad record"

fi  # part main

# --- another user: refused on both sides -------------------------------------
if ! part other-uid; then
  :
elif [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null && id nobody >/dev/null 2>&1 &&
  setpriv --reuid=nobody --regid=nogroup --clear-groups test -x "$L" 2>/dev/null; then
  AS_NOBODY=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
  serve u1 "${COMMON[@]}" --job-id "$JOB-u1"
  sleep 0.3
  expect_rc 1 "a consumer of another uid is refused by the producer" \
    "${AS_NOBODY[@]}" "$L" consume --job-id "$JOB-u1" --batches 1 --timeout 5
  expect_text "it runs as uid 0, and this consumer as uid 65534" "the consumer refuses it too, saying why"
  # The producer logs the refusal after sending it: the consumer may be gone first.
  logged u1 "refused a consumer"
  if grep -q "refused a consumer: pid .* runs as uid 65534" "$W/u1.log"; then ok "the producer logs the refusal"; else fail "$(cat "$W/u1.log")"; fi
  expect_rc_stdout 0 "the producer still serves its own user" "$L" consume --job-id "$JOB-u1" --batches 2
  wait_exit "$SP" 10 >/dev/null

  chmod -R a+rX "$W/d"
  chmod a+rx "$W"
  "${AS_NOBODY[@]}" "$L" serve "${COMMON[@]}" --job-id "$JOB-u2" >"$W/u2.log" 2>&1 &
  SP=$!
  pids+=("$SP")
  sleep 0.5
  expect_rc 1 "a producer of another uid is refused by the consumer" \
    "$L" consume --job-id "$JOB-u2" --batches 1 --timeout 5
  expect_text "it runs as uid 65534, and this consumer as uid 0" "saying whose it is"
  # The producer logs the refusal after sending it: the consumer may be gone first.
  logged u2 "refused a consumer"
  if grep -q "refused a consumer: pid .* runs as uid 0, not 65534" "$W/u2.log"; then ok "that producer refuses root's consumer too"; else fail "$(cat "$W/u2.log")"; fi
  kill -TERM "$SP"
  wait_exit "$SP" 10
  check_rc $? 143 "and still ends cleanly on SIGTERM"
  nothing_left "$JOB-u2" "after the refusals"
else
  skip "another-uid checks need root, setpriv and a 'nobody' user that can run $L"
fi

cd / || exit 1
finish

#!/usr/bin/env bash
# The Python consumer against real `loader serve` processes: its dump equals
# `loader consume`'s byte for byte, torch views the slot and release_after's
# event runs before the slot goes back, a producer's bad record arrives as
# LoaderError with the producer's reason, and the Client loop of
# docs/guide/python.md runs.
# Usage: service_test.sh PACK_TOOL LOADER PYTHON_DIR TESTS_DIR
set -uo pipefail
PT=$1
LOADER=$2
PYDIR=$3
T=$4
. "$(dirname "$0")/../../../../tests/cli_lib.sh"
export PYTHONPATH=$PYDIR
unset NUMA_LOADER_LIB

# Every `loader serve` this test starts is stopped on exit, however it ends.
SERVERS=()
cleanup() {
  for p in "${SERVERS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${SERVERS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$W"
}
trap cleanup EXIT

# serve NAME DATA [options...]: a producer for job $JOB-NAME, rank 0 of 1, in
# the background; its pid in $SERVE_PID, its output in $W/serve-NAME.log.
JOB=pyconsumer-$$
serve() {
  local name=$1 data=$2
  shift 2
  "$LOADER" serve --data "$data" --split train --job-id "$JOB-$name" --rank 0 --world-size 1 \
    --local-rank 0 --batch-size 16 --image-size 32 --threads 1 "$@" >"$W/serve-$name.log" 2>&1 &
  SERVE_PID=$!
  SERVERS+=("$SERVE_PID")
}
# served NAME WANT_RC: waits for the last started producer and checks its exit code.
# (A producer still there after 120 s is a hang: it is killed and the check fails.)
served() {
  local i
  for ((i = 0; i < 1200; i++)); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$SERVE_PID" 2>/dev/null && { echo "    loader serve ($1) still running after 120 s: killed"; kill -9 "$SERVE_PID"; }
  wait "$SERVE_PID"
  local rc=$?
  check_rc "$rc" "$2" "loader serve ($1) exits $2 after its consumer is done"
  [ "$rc" -eq "$2" ] || sed 's/^/    serve: /' "$W/serve-$1.log"
}

"$PT" fake-cifar100 "$W/c" --train 200 --test 10 >/dev/null && "$PT" cifar100 "$W/c" "$W/p" >/dev/null 2>&1 \
  && ok "a 200-image CIFAR-100 shard set" || fail "packing the test data"

# --- (a) the Python consumer's dump equals loader consume's ---------------
serve cpp "$W/p" --epochs 2 --seed 7
expect_rc 0 "loader consume --dump (2 epochs)" \
  "$LOADER" consume --job-id "$JOB-cpp" --rank 0 --timeout 60 --dump "$W/cpp.dump"
served cpp 0
serve py "$W/p" --epochs 2 --seed 7
expect_rc_stdout 0 "python3 -m numa_loader.consume --json --dump (2 epochs)" \
  $PY -m numa_loader.consume --job-id "$JOB-py" --rank 0 --timeout 60 --json --dump "$W/py.dump"
cp "$W/out" "$W/py.json"
served py 0
if cmp -s "$W/cpp.dump" "$W/py.dump" && [ -s "$W/py.dump" ]; then
  ok "the two dumps are equal byte for byte ($(stat -c %s "$W/py.dump") bytes)"
else
  fail "the dumps differ: $(cmp "$W/cpp.dump" "$W/py.dump" 2>&1)"
fi
expect_rc 0 "the JSON: 2 epochs of 13 batches, 400 images" $PY - "$W/py.json" "$JOB-py" <<'PYEOF'
import json, sys
j = json.loads(open(sys.argv[1]).read())
want = {"job_id": sys.argv[2], "rank": 0, "batches": 26, "images": 400, "first_epoch": 0,
        "first_batch": 0, "last_epoch": 1, "last_batch": 12, "epochs": [0, 1]}
got = {k: j[k] for k in want}
assert got == want, got
assert j["seconds"] > 0 and j["images_per_s"] > 0 and j["batches_per_s"] > 0 and j["per_batch_us"] > 0, j
PYEOF
expect_rc 0 "the dump holds 400 images, labels and indices" \
  test "$(stat -c %s "$W/py.dump")" -eq $((400 * 3072 + 400 * 16))

# NHWC float32 (--layout nhwc --normalize): the same bytes, and the arrays' shape and dtype
serve cppf "$W/p" --epochs 1 --seed 3 --layout nhwc --normalize
expect_rc 0 "loader consume --dump (NHWC float32)" \
  "$LOADER" consume --job-id "$JOB-cppf" --rank 0 --timeout 60 --dump "$W/cppf.dump"
served cppf 0
serve pyf "$W/p" --epochs 1 --seed 3 --layout nhwc --normalize
expect_rc 0 "python3 -m numa_loader.consume --dump (NHWC float32)" \
  $PY -m numa_loader.consume --job-id "$JOB-pyf" --rank 0 --timeout 60 --dump "$W/pyf.dump"
served pyf 0
if cmp -s "$W/cppf.dump" "$W/pyf.dump" && [ "$(stat -c %s "$W/pyf.dump")" -eq $((200 * 3072 * 4 + 200 * 16)) ]; then
  ok "NHWC float32 dumps are equal byte for byte"
else
  fail "NHWC float32 dumps differ: $(cmp "$W/cppf.dump" "$W/pyf.dump" 2>&1)"
fi
serve shape "$W/p" --epochs 1 --seed 3 --layout nhwc --normalize
expect_rc 0 "NHWC float32: pixels are float32 [B, 32, 32, 3]" $PY - "$JOB-shape" <<'PYEOF'
import sys, numa_loader
with numa_loader.Client(sys.argv[1], 0) as c:
    assert (c.info.layout, c.info.dtype.name) == ("NHWC", "float32"), c.info
    sizes = []
    for b in c:
        assert b.pixels.shape == (b.size, 32, 32, 3) and b.pixels.dtype.name == "float32", b.pixels.shape
        assert b.labels.shape == b.indices.shape == (b.size,)
        sizes.append(b.size)
assert sizes == [16] * 12 + [8], sizes
PYEOF
served shape 0

# --batches N across an epoch boundary of an unbounded producer, human output
serve some "$W/p" --seed 7
expect_rc_stdout 0 "consume --batches 15 from an unbounded producer" \
  $PY -m numa_loader.consume --job-id "$JOB-some" --rank 0 --batches 15
expect_out "^consumed 15 batches \(232 images\) of job $JOB-some, rank 0 in .* us per batch\$" \
  "the human line: 13 + 2 batches"
served some 0

# The last epoch number: an unbounded producer serves it and ends there (it
# crashed on a null list before); numbers ctypes would cut are refused.
serve last "$W/p" --seed 7
expect_rc 0 "seek(2**64 - 1, 11): batches 11 and 12 of that epoch, then the end; seek(3, 0) after it" \
  $PY - "$JOB-last" <<'PYEOF'
import sys, numa_loader
with numa_loader.Client(sys.argv[1], 0, timeout_s=60) as c:
    next(c)
    c.seek(2**64 - 1, 11)
    got = [(b.epoch, b.batch) for b in c]
    assert got == [(2**64 - 1, 11), (2**64 - 1, 12)], got
    c.seek(3, 0)
    b = next(c)
    assert (b.epoch, b.batch) == (3, 0), (b.epoch, b.batch)
    for bad, exc in (((2**64, 0), ValueError), ((1.5, 2), TypeError)):
        try:
            c.seek(*bad)
            raise SystemExit("seek%r was accepted" % (bad,))
        except exc:
            pass
PYEOF
served last 0

# Arrays and tensors outlive their client: reading them after close() and
# after the client is collected reads their batch (it was a SIGSEGV: close()
# unmapped the ring); the producer still exits cleanly at close().
serve keep "$W/p" --epochs 1 --seed 7
expect_rc 0 "a tensor and an array kept past close() and the client's collection read their batch" \
  $PY - "$JOB-keep" <<'PYEOF'
import gc, sys, warnings
import torch, numa_loader
warnings.simplefilter("ignore", UserWarning)  # torch.from_numpy on a read-only array
c = numa_loader.Client(sys.argv[1], 0, timeout_s=60)
b = next(c)
x, idx = torch.from_numpy(b.pixels), b.indices
want_x, want_idx = x.clone(), idx.copy()
c.close()
del c, b
gc.collect()
assert torch.equal(x, want_x) and (idx == want_idx).all()
print("read %d bytes after close" % x.numel())
PYEOF
served keep 0

# --- (b) torch.from_numpy views the slot; (d) release_after's event -------
serve views "$W/p" --epochs 2 --seed 7 --prefetch 2
expect_rc 0 "torch views equal loader consume's bytes; events synchronized before release" \
  $PY "$T/views_check.py" "$JOB-views" "$W/cpp.dump"
expect_out "^26 batches: " "all 26 batches checked"
served views 0

# set_epoch and seek: the batch asked for, with the bytes loader consume saw there
serve seek "$W/p" --epochs 2 --seed 7
expect_rc 0 "set_epoch(1), then seek(0, 5): those batches, their bytes" $PY - "$JOB-seek" "$W/cpp.dump" <<'PYEOF'
import sys, numa_loader
dump = open(sys.argv[2], "rb").read()
per = 16 * (3072 + 16)  # a full batch in the dump
with numa_loader.Client(sys.argv[1], 0) as c:
    b = next(c)
    c.set_epoch(1)
    assert b.released, "set_epoch releases the held batch"
    b = next(c)
    assert (b.epoch, b.batch) == (1, 0), (b.epoch, b.batch)
    e1 = 12 * per + 8 * (3072 + 16)  # epoch 0: 12 full batches and one of 8
    assert b.pixels.tobytes() == dump[e1:e1 + 16 * 3072], "batch (1, 0) differs"
    c.seek(0, 5)
    b = next(c)
    assert (b.epoch, b.batch, b.size) == (0, 5, 16), (b.epoch, b.batch, b.size)
    assert b.pixels.tobytes() == dump[5 * per:5 * per + 16 * 3072], "batch (0, 5) differs"
    assert b.labels.tobytes() == dump[5 * per + 16 * 3072:5 * per + 16 * 3080]
PYEOF
served seek 0

# A client dropped without close(): its finalizer detaches, and the producer exits 0
serve drop "$W/p" --seed 7
expect_rc 0 "a dropped Client detaches (the producer exits while we still run)" $PY - "$JOB-drop" <<'PYEOF'
import gc, os, sys, time, numa_loader
c = numa_loader.Client(sys.argv[1], 0)
b = next(c)
pid = c.info.producer_pid
del b, c
gc.collect()
for _ in range(600):  # a hang guard: 60 s
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    if open("/proc/%d/stat" % pid).read().split(") ")[1].startswith("Z"):
        break  # exited, not yet reaped by the shell
    time.sleep(0.1)
else:
    sys.exit("loader serve (pid %d) still runs after the Client was dropped" % pid)
PYEOF
served drop 0

# --- (c) a bad record: the producer's reason arrives as LoaderError -------
rm -rf "$W/bad" && cp -r "$W/p" "$W/bad"
expect_rc 0 "flip a payload byte of record 37 in the shard" $PY - "$W/bad/train/shard-00000/data.mdb" <<'PYEOF'
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
starts = []
i = data.find(b"NLRC")
while i >= 0:
    starts.append(i)
    i = data.find(b"NLRC", i + 1)
assert len(starts) == 200, len(starts)  # one record header per sample, in index order
data[starts[37] + 32 + 1000] ^= 0xFF   # inside the payload: its CRC32C no longer matches
open(path, "wb").write(bytes(data))
PYEOF
serve bad "$W/bad" --epochs 1 --seed 7
expect_rc_stdout 0 "iteration raises LoaderError" $PY "$T/error_check.py" "$JOB-bad" "index 37"
cp "$W/out" "$W/bad.out"
served bad 1
# The reason the producer printed is the reason the consumer was given.
reason=$(sed -n 's/.*index 37: //p' "$W/serve-bad.log" | head -n 1)
if [ -n "$reason" ] && grep -qF -- "$reason" "$W/bad.out"; then
  ok "the LoaderError carries the producer's reason: $reason"
else
  fail "the producer's reason '$reason' is not in the consumer's error"
  sed 's/^/    /' "$W/bad.out" "$W/serve-bad.log"
fi
serve bad2 "$W/bad" --epochs 1 --seed 7
expect_rc 1 "python3 -m numa_loader.consume exits 1 on the producer's error" \
  $PY -m numa_loader.consume --job-id "$JOB-bad2" --rank 0 --timeout 60
expect_text "index 37" "its message names the record"
served bad2 1

# --- (e) docs/guide/python.md's Client loop (train.py's is loader_test.py's)
serve guide "$W/p" --epochs 1 --seed 7
port=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
expect_rc_stdout 0 "the Python guide's Client loop runs" env NL_JOB_ID="$JOB-guide" RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 \
  MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" $PY "$T/guide_loop_check.py" "$T/../../../../docs/guide/python.md" client
expect_out "^guide Client loop: 13 batches, 13 events synchronized" "13 batches, an event synchronized per batch"
served guide 0

finish

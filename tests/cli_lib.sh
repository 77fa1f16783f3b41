# Shared by the command-line tests (sourced): a scratch directory $W removed
# on exit, pass/fail/skip counting, and checks. End a test script with `finish`.
#
# Parts: checks that need what a machine may not allow (mounting a tmpfs,
# ptrace, another uid, a build without AddressSanitizer) are a part of their
# own, run as their own ctest test with NL_TEST_PART=<part>; the rest is the
# part "main". `part NAME` says whether this run does part NAME (all parts
# when NL_TEST_PART is unset, as when a script is run by hand). A check that
# cannot run calls `skip REASON`: counted as skipped, never as passed; a run
# with a skipped check and no failed one exits 77, which ctest
# (SKIP_RETURN_CODE 77) reports as a skipped test. So a check a machine may
# not allow goes in a part of its own, wholly run or wholly skipped: a part
# that passed some checks and skipped others would show as skipped (and
# says so in its summary line), never as passed.
PY=/usr/bin/python3
W=$(mktemp -d "${TMPDIR:-/tmp}/nl-cli-XXXXXX")
# Background processes a test starts (it appends their pids): those still
# running (jobs of this shell: a pid already waited for may be another
# process's by now) are killed with SIGKILL on exit, then $W is removed.
pids=()
cleanup() {
  local running p
  running=" $(jobs -p | tr '\n' ' ') "
  for p in "${pids[@]}"; do
    [[ "$running" == *" $p "* ]] && kill -9 "$p" 2>/dev/null
  done
  rm -rf "$W"
}
trap cleanup EXIT
failures=0
passes=0
skips=0
part() { [ -z "${NL_TEST_PART:-}" ] || [ "$NL_TEST_PART" = "$1" ]; }

# next_port: sets PORT to the next TCP port after it, within
# [PORT_LO, PORT_HI) (wrapping), that can be bound on all interfaces now (a
# rendezvous store listens on all of them). A test sets PORT_LO and PORT_HI
# (below Linux's ephemeral ports, 32768-60999: the kernel hands those to
# outgoing connections, Gloo's among them, and a rendezvous port taken from
# them collides now and then) and calls next_port before each job.
next_port() {
  PORT=$($PY - "${PORT:-0}" "$PORT_LO" "$PORT_HI" <<'PYEOF'
import socket, sys
port, lo, hi = (int(a) for a in sys.argv[1:])
n = hi - lo
port = lo + (port + 1 - lo) % n if lo <= port < hi else lo + (port % n)
for _ in range(n):
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
            print(port)
            break
        except OSError:
            port = lo + (port + 1 - lo) % n
else:
    sys.exit("no free TCP port in [%d, %d)" % (lo, hi))
PYEOF
  )
}

ok() { passes=$((passes + 1)); echo "ok   - $1 [${SECONDS} s]"; }
skip() { skips=$((skips + 1)); echo "skip - $1 [${SECONDS} s]"; }
# setup NAME CMD...: a step the checks need (output to $W/out): its failure
# counts as one, its success is not a check of its own.
setup() {
  local name=$1
  shift
  "$@" >"$W/out" 2>&1 || fail "$name (setup): $(tail -n 3 "$W/out")"
}
fail() { failures=$((failures + 1)); echo "FAIL - $1 [${SECONDS} s]"; }

# expect_rc WANT NAME CMD...: runs CMD (stdout and stderr to $W/out) and checks its exit code.
expect_rc() {
  local want=$1 name=$2
  shift 2
  rm -f "$W/err"
  "$@" >"$W/out" 2>&1
  check_rc "$?" "$want" "$name"
}

# expect_rc_stdout WANT NAME CMD...: as expect_rc, stdout alone to $W/out, stderr to $W/err.
expect_rc_stdout() {
  local want=$1 name=$2
  shift 2
  "$@" >"$W/out" 2>"$W/err"
  check_rc "$?" "$want" "$name"
}

check_rc() {
  if [ "$1" -eq "$2" ]; then
    ok "$3"
  else
    fail "$3 (exit $1, wanted $2)"
    cat "$W/out" "$W/err" 2>/dev/null | sed 's/^/    /'
  fi
}

# expect_out REGEX NAME / expect_text TEXT NAME: the last command's output contains it.
expect_out() { expect_grep -E "$1" "$2"; }
expect_text() { expect_grep -F "$1" "$2"; }
expect_grep() {
  # (No pipe here: with pipefail, grep -q closing early would fail it.)
  if grep -qs "$1" -- "$2" "$W/out" "$W/err"; then
    ok "$3"
  else
    fail "$3 (no '$2' in output)"
    sed 's/^/    /' "$W/out"
  fi
}

# wait_exit PID SECONDS: the exit code of PID, or 255 after SECONDS (then it is
# killed); $SECS gets the seconds waited.
wait_exit() {
  local pid=$1 limit=$2 start=$SECONDS i rc
  for ((i = 0; i < limit * 20; i++)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      rc=$?
      SECS=$((SECONDS - start))
      return $rc
    fi
    sleep 0.05
  done
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  SECS=$limit
  return 255
}

# start_training NAME CMD...: CMD (a trainer) in the background, its output in
# $W/NAME.out, its pid in $BG (in pids); returns once the output says it trains
# ("steps an epoch"), or CMD has ended, or after 60 s.
start_training() {
  local name=$1 i
  shift
  "$@" >"$W/$name.out" 2>&1 &
  BG=$!
  pids+=("$BG")
  for ((i = 0; i < 600; i++)); do
    grep -qs "steps an epoch" "$W/$name.out" || ! kill -0 "$BG" 2>/dev/null && break
    sleep 0.1
  done
}

finish() {
  echo "$passes passed, $failures failed, $skips skipped"
  [ "$failures" -eq 0 ] || exit 1
  if [ "$skips" -gt 0 ]; then
    [ "$passes" -eq 0 ] || echo "partly skipped: $skips of $((passes + skips)) checks could not run here (reported as skipped)"
    exit 77
  fi
  exit 0
}

#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, build-fuzz/) and runs each
# for SECONDS (default 30) from seed corpora made of valid inputs of each kind.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
# Corpora grow in build-fuzz/fuzz-corpus/<target> (kept between runs); a crash,
# leak, timeout or memory blow-up is saved to build-fuzz/fuzz-findings/ and
# makes the script exit 1. A table of each target's latest run is kept in
# build-fuzz/fuzz-report.md (docs/RELIABILITY.md quotes it).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
shift || true
all=(record_fuzz png_fuzz jpeg_fuzz manifest_fuzz cifar_fuzz imagefolder_fuzz cli_lists_fuzz ring_header_fuzz
  shard_fuzz)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
if ! [[ "$secs" =~ ^[0-9]+$ ]] || [ "$secs" -lt 1 ]; then
  echo "fuzz.sh: SECONDS must be a whole number of 1 or more, not '$secs'" >&2
  exit 2
fi

scripts/install-deps.sh
need=()
for p in clang libclang-rt-14-dev libjpeg-turbo-progs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "fuzz.sh: installing ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only -DNDEBUG" \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only -DNDEBUG" -DNL_FUZZ=ON >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]}"
rm -rf build-fuzz/fuzz-seeds
/usr/bin/python3 tests/fuzz/make_seeds.py build-fuzz/fuzz-seeds
mkdir -p build-fuzz/fuzz-findings

export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The report keeps each target's latest run: rows of targets not run now stay.
report=build-fuzz/fuzz-report.md
declare -A row=()
if [ -f "$report" ]; then
  while IFS= read -r line; do
    t=$(echo "$line" | awk -F'|' '{gsub(/ /, "", $2); print $2}')
    [[ "$t" == *_fuzz ]] && row[$t]=$line
  done <"$report"
fi
# One target a core at a time (each libFuzzer run is one process on one
# core): every target still gets its seconds, in a fraction of the wall time.
fuzz_one() {
  local t=$1 corpus=build-fuzz/fuzz-corpus/$1 log=build-fuzz/fuzz-$1.log rc=0 runs cov files found
  mkdir -p "$corpus"
  "build-fuzz/bin/$t" "$corpus" "build-fuzz/fuzz-seeds/$t" -max_total_time="$secs" -timeout=20 \
    -rss_limit_mb=2560 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="build-fuzz/fuzz-findings/$t-" >"$log" 2>&1 || rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
  files=$(ls "$corpus" | wc -l)
  if [ "$rc" -eq 0 ]; then
    found="none"
  else
    found="exit $rc: $(grep -m1 -E 'ERROR: |runtime error|Timeout|out-of-memory' "$log" | cut -c1-120)"
  fi
  echo "| $t | $secs | ${runs:-?} | $files | ${cov:-?} | $found |" >"build-fuzz/fuzz-$t.row"
  [ "$rc" -eq 0 ]
}
failed=0
cores=$(nproc)
running=()
for t in "${targets[@]}"; do
  echo "== $t: $secs s"
  rm -f "build-fuzz/fuzz-$t.row"
  fuzz_one "$t" &
  running+=("$!")
  if [ ${#running[@]} -ge "$cores" ]; then
    wait "${running[0]}" || true
    running=("${running[@]:1}")
  fi
done
wait || true
for t in "${targets[@]}"; do
  row[$t]=$(cat "build-fuzz/fuzz-$t.row" 2>/dev/null || echo "| $t | $secs | ? | ? | ? | no result |")
  echo "${row[$t]}"
  if [[ "${row[$t]}" != *"| none |" ]]; then
    failed=1
    tail -40 "build-fuzz/fuzz-$t.log" | sed 's/^/    /'
  fi
done
{
  echo "| target | seconds | runs | corpus files | coverage (edges) | findings |"
  echo "|---|---:|---:|---:|---:|---|"
  for t in "${all[@]}"; do
    [ -n "${row[$t]:-}" ] && echo "${row[$t]}"
  done
} >"$report"
cat "$report"
exit $failed

#!/usr/bin/env bash
# Installs dependencies, configures, builds and runs the whole test suite.
#   scripts/test.sh              the optimized build (RelWithDebInfo) and the whole suite (build/)
#   scripts/test.sh --sanitize   the same under ASan + UBSan (build-asan/), but for the
#                                trainer's end-to-end runs (see below)
#   scripts/test.sh --tsan       ThreadSanitizer: pool, threads, pipeline, ring, service, staging tests
#                                (build-tsan/, clang), and clang's lock checks (-Wthread-safety)
# Extra CMake arguments come from NL_CMAKE_ARGS (CI: "-DNL_WERROR=ON").
# Exits non-zero on any build or test failure.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
# The sanitizer builds keep line tables only (-g1): a report's stack still
# names file and line, and their compiles take a quarter less time than -g.
tests_exclude=""
if [ "${1:-}" = "--sanitize" ]; then
  build_dir=build-asan
  cmake_args=(-DCMAKE_BUILD_TYPE=Debug -DNL_SANITIZE=ON -DCMAKE_C_FLAGS_DEBUG=-g1 -DCMAKE_CXX_FLAGS_DEBUG=-g1)
  # Not the trainer's end-to-end runs (trainer_cli, trainer_cli_dying): their
  # time is LibTorch's (not instrumented), and under ASan they took 1,100 s,
  # half the stage's test time, 5x the optimized build's. The trainer's own
  # code still runs under ASan in trainer_core_test, trainer_rooms_test,
  # faults_cli (real jobs on damaged data) and trainer_cli's disk-full and
  # traced parts; the excluded checks run in every other build. Nor the
  # numa_loader package's install (cmake --install, pip into a venv): it
  # checks where files go, nothing memory-safety finds, and runs in the
  # optimized build.
  tests_exclude='^(trainer_cli(_dying)?|numa_loader_py_install)$'

  # handle_sigbus=0: the shard reader's own SIGBUS handler (it names a shard
  # truncated under a running reader) is under test.
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:handle_sigbus=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fi
# --tsan: ThreadSanitizer over the threaded parts (the worker pool, the
# pipeline and its window reader, the ring, its service and the staging layer: their unit tests,
# which run producer and consumer in one process where TSan sees both; the
# multi-process CLI tests are timing-bound and too slow under TSan), build-tsan/.
# Built with clang (its TSan runtime: libclang-rt-14-dev) and its lock checks
# (NL_THREAD_SAFETY: -Wthread-safety as errors), which also compile, without
# running them, the other libraries that hold an annotated lock (nl_lock_check:
# the packer, the trainer's rooms): every annotation is read in this build.
tests_regex=""
extra_targets=()
deps=()
if [ "${1:-}" = "--tsan" ]; then
  build_dir=build-tsan
  cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DNL_TSAN=ON "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DCMAKE_C_COMPILER=clang
    -DCMAKE_CXX_COMPILER=clang++ -DNL_THREAD_SAFETY=ON)
  tests_regex='^(WorkerPool|Thread|ServiceThreads|Pipeline|PipelineContract|Sampler|WindowStager|Ring|Staging)[A-Za-z]*\.'
  extra_targets=(nl_lock_check)
  deps=(clang libclang-rt-14-dev)
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
  # A build-tsan/ of gcc's (before the lock checks) is started again: a
  # cache cannot change its compiler.
  if [ -f build-tsan/CMakeCache.txt ] && ! grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang++' build-tsan/CMakeCache.txt; then
    rm -rf build-tsan
  fi
fi

scripts/install-deps.sh ${deps[@]+"${deps[@]}"}
jobs=$(nproc)
read -r -a extra_args <<<"${NL_CMAKE_ARGS:-}"
cmake -S . -B "$build_dir" -G Ninja "${cmake_args[@]}" ${extra_args[@]+"${extra_args[@]}"} >/dev/null
cd "$build_dir"
if [ -n "$tests_regex" ]; then
  cmake --build . -j "$jobs" --target base_test formats_test loader_pipeline_test ring_test service_test staging_test \
    "${extra_targets[@]}"
  ctest -j "$jobs" --output-on-failure --timeout 600 -R "$tests_regex"
else
  cmake --build . -j "$jobs"
  ctest -j "$jobs" --output-on-failure --timeout 600 ${tests_exclude:+-E "$tests_exclude"}
fi

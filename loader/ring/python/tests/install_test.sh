#!/usr/bin/env bash
# The numa_loader package installed the two ways docs/guide/python.md gives: `cmake
# --install` into a prefix (the package runs that prefix's loader and
# library), and `pip install` of <build>/python into a venv (it runs the
# build's); each then feeds a Loader from a pack made by its pack_tool. Both
# run from another directory than the source's or the build's, and leave
# the build's package directory as it was (pip's build writes elsewhere).
# Usage: install_test.sh BUILD_DIR PYTHON_DIR_UNDER_PREFIX
set -uo pipefail
BUILD=$(cd "$1" && pwd)
PYREL=$2
. "$(dirname "$0")/../../../../tests/cli_lib.sh"
unset NUMA_LOADER_LIB NUMA_LOADER_BIN PYTHONPATH

# check PYTHON WANT_BIN WANT_LIB PACK_TOOL: the package's paths, and a Loader's epoch.
check() {
  local py=$1 bin=$2 lib=$3 pt=$4 name=$5
  rm -rf "$W/c" "$W/p"
  "$pt" fake-cifar100 "$W/c" --train 40 --test 4 >/dev/null && "$pt" cifar100 "$W/c" "$W/p" >/dev/null 2>&1 ||
    { fail "$name: packing with $pt"; return; }
  expect_rc_stdout 0 "$name: the package runs $bin and $lib" "$py" -c "
import os, sys
os.chdir('/')  # not the source tree: the installed package
import numa_loader
assert numa_loader.loader_path() == '$bin', numa_loader.loader_path()
assert numa_loader.library_path() == '$lib', numa_loader.library_path()
assert not numa_loader.__file__.startswith('$BUILD/python/'), numa_loader.__file__
with numa_loader.Loader('$W/p', batch_size=8, image_size=32, threads=1, no_bind=True, quiet=True) as l:
    print(len(l), sum(len(y) for x, y in l))
"
  expect_text "5 40" "$name: a Loader gives the 40 samples in 5 batches"
}

# listing DIR: every directory under DIR, and every file with its size and
# modification time.
listing() { (cd "$1" && find . \( -type d -printf '%p/\n' \) -o -printf '%p %s %T@\n' | LC_ALL=C sort); }

# unchanged NAME: <build>/python lists as it did before the install NAME.
unchanged() {
  listing "$BUILD/python" >"$W/after"
  if diff "$W/before" "$W/after" >"$W/diff"; then
    ok "$1 leaves $BUILD/python as it was"
  else
    fail "$1 leaves $BUILD/python as it was: $(grep '^[<>]' "$W/diff" | head -n 6 | tr '\n' ' ')"
  fi
}

mkdir -p "$W/elsewhere"
cd "$W/elsewhere" || exit 1
listing "$BUILD/python" >"$W/before"

# Installed to the default prefix, the package lands on Python's own path.
expect_rc_stdout 0 "the package's default place, /usr/local/$PYREL, is on /usr/bin/python3's path" \
  /usr/bin/python3 -c "import sys; assert '/usr/local/$PYREL' in sys.path, sys.path"

PREFIX=$W/prefix
expect_rc 0 "cmake --install into a prefix" cmake --install "$BUILD" --prefix "$PREFIX"
PYTHONPATH=$PREFIX/$PYREL check /usr/bin/python3 "$PREFIX/bin/loader" "$PREFIX/lib/libnl_client.so" \
  "$PREFIX/bin/pack_tool" "cmake --install"
unchanged "cmake --install"
# A C consumer compiles against the installed header alone (include/numa_loader/,
# none of the service's internals) and links the installed library.
cat >"$W/consumer.c" <<'CEOF'
#include <numa_loader/nl_client.h>
#include <stdio.h>
int main(void) {
  nl_client* c = NULL;
  int rc = nl_attach("nl-install-test-no-job", 0, 0.1, &c);
  printf("%d %s\n", rc, nl_attach_error());
  return rc == NL_OK;
}
CEOF
if [ -e "$PREFIX/include/nl_client.h" ] || [ -e "$PREFIX/include/numa_loader/ring_layout.h" ]; then
  fail "the prefix holds headers besides include/numa_loader/nl_client.h: $(find "$PREFIX/include")"
else
  ok "the prefix's include/ holds numa_loader/nl_client.h alone"
fi
expect_rc 0 "a C consumer compiles against P/include and links P/lib" cc -I"$PREFIX/include" "$W/consumer.c" \
  -L"$PREFIX/lib" -lnl_client -Wl,-rpath,"$PREFIX/lib" -o "$W/consumer"
expect_rc_stdout 0 "and runs: no such job is an error from the library" "$W/consumer"
expect_text "no loader serve for job nl-install-test-no-job" "naming the job"

expect_rc 0 "a venv (with the system's numpy and torch)" /usr/bin/python3 -m venv --system-site-packages "$W/venv"
expect_rc 0 "python3 -m pip install <build>/python" \
  "$W/venv/bin/python3" -m pip install -q --no-build-isolation --no-index "$BUILD/python"
check "$W/venv/bin/python" "$BUILD/bin/loader" "$BUILD/lib/libnl_client.so" "$BUILD/bin/pack_tool" "pip install"
unchanged "pip install"
finish

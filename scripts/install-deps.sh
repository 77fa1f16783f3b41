#!/usr/bin/env bash
# Installs the Debian packages this project builds, tests and demos with,
# and any more named as arguments.
# Idempotent: when everything is present it only checks and returns.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git bc
  liblmdb-dev lmdb-utils libhwloc-dev hwloc
  libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev zlib1g-dev
  libarchive-dev
  libcli11-dev nlohmann-json3-dev libboost-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libtorch-dev libgloo-dev
  python3 python3-lmdb python3-pil python3-numpy python3-torchvision python3-tqdm
  python3-venv python3-pip python3-setuptools  # numa_loader installs with pip (tested in a venv)
  strace  # tests slow a process down with its fault injection
  ccache  # CI compiles a file once for its two builds with the same flags
  valgrind  # tests/valgrind_jpeg_test.sh: the JPEG decode of every sampling under memcheck
  python3-skimage python3-sklearn  # their photographs: tests/decode_auto_photos_test.sh, demo.sh
  "$@"
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

#!/usr/bin/env bash
# Packs the dependencies scripts/gpu-check.sh needs on a GPU machine that has CUDA, CMake, ninja and a C++
# compiler but no Debian packages and no network: the header-only libraries (Eigen, Random123, nlohmann-json,
# CLI11) with their CMake configs, zlib's headers, and GoogleTest's sources. Run it here,
# where scripts/setup.sh has installed them; it writes .gpu-deps/ (ignored by git, at most 30 MiB), which
# travels with the working tree. Usage: scripts/pack-gpu-deps.sh [output folder]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-.gpu-deps}"
limit_mib=30

need() {
  if [[ ! -e "$1" ]]; then
    echo "pack-gpu-deps: $1 is missing; install the Debian packages first (scripts/setup.sh)" >&2
    exit 1
  fi
}

rm -rf "$out"
mkdir -p "$out/include" "$out/share/cmake" "$out/share/eigen3" "$out/src"

# Header-only libraries, keeping the layout their CMake configs expect (paths relative to the config file).
need /usr/include/eigen3/Eigen
need /usr/share/eigen3/cmake/Eigen3Config.cmake
cp -r /usr/include/eigen3 "$out/include/"
cp -r /usr/share/eigen3/cmake "$out/share/eigen3/"
need /usr/include/Random123/philox.h
cp -r /usr/include/Random123 "$out/include/"
need /usr/include/nlohmann/json.hpp
need /usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake
cp -r /usr/include/nlohmann "$out/include/"
cp -r /usr/share/cmake/nlohmann_json "$out/share/cmake/"
if [[ -d /usr/include/CLI && -d /usr/share/cmake/CLI11 ]]; then  # only the examples use it
  cp -r /usr/include/CLI "$out/include/"
  cp -r /usr/share/cmake/CLI11 "$out/share/cmake/"
fi

# zlib: its headers only. Every Linux machine has the runtime library (libz.so.1), which gpu-check.sh links;
# Debian's static libz.a is not position-independent enough to go into libfrugal.so.
need /usr/include/zlib.h
cp /usr/include/zlib.h /usr/include/zconf.h "$out/include/"

# GoogleTest's sources without GoogleMock (tests/CMakeLists.txt builds them with the tests).
need /usr/src/googletest/googletest/CMakeLists.txt
mkdir -p "$out/src/googletest"
cp /usr/src/googletest/CMakeLists.txt "$out/src/googletest/"
cp -r /usr/src/googletest/googletest "$out/src/googletest/"

{
  echo "# Packed by scripts/pack-gpu-deps.sh on $(date -u +%Y-%m-%dT%H:%MZ) from these Debian packages:"
  for pkg in libeigen3-dev librandom123-dev nlohmann-json3-dev libcli11-dev zlib1g-dev googletest; do
    dpkg-query -W -f='${Package} ${Version}\n' "$pkg" 2>/dev/null || echo "$pkg (not installed)"
  done
} >"$out/MANIFEST"

size_kib=$(du -sk "$out" | cut -f1)
if ((size_kib > limit_mib * 1024)); then
  echo "pack-gpu-deps: $out holds $((size_kib / 1024)) MiB, more than the $limit_mib MiB allowed" >&2
  exit 1
fi
echo "pack-gpu-deps: $out ($((size_kib / 1024)).$(((size_kib % 1024) * 10 / 1024)) MiB)"

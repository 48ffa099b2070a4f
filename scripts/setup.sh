#!/usr/bin/env bash
# Installs frugal's Debian packages (only the missing ones), configures build/ once, and builds.
# Options from the environment: FRUGAL_CMAKE_ARGS (e.g. "-DFRUGAL_CUDA=OFF"), FRUGAL_BUILD_DIR (default
# build), FRUGAL_JOBS (default: the number of cores).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

packages=(
  cmake ninja-build g++
  libeigen3-dev libdnnl-dev ocl-icd-opencl-dev libopenmpi-dev openmpi-bin libgtest-dev libbenchmark-dev zlib1g-dev nlohmann-json3-dev libcli11-dev
  librandom123-dev
  dataset-fashion-mnist fortunes
  clang-format
  librsvg2-bin  # rsvg-convert: tests/core/test_memory_history.cpp renders the memory SVG with it
  iproute2      # ip netns: tests/dist/two_hosts.sh runs 2 ranks on two network namespaces
)

log="$(mktemp)"
trap 'rm -f "$log"' EXIT

missing=()
for pkg in "${packages[@]}"; do
  if [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]} > 0)); then
  echo "frugal: installing ${missing[*]}"
  sudo=()
  if [[ "$(id -u)" -ne 0 ]]; then
    if ! command -v sudo >/dev/null; then
      echo "frugal: not root and no sudo; install as root: ${missing[*]}" >&2
      exit 1
    fi
    sudo=(sudo)
  fi
  # apt is chatty even with -qq; keep its output and show it only when something goes wrong.
  if ! { "${sudo[@]}" apt-get update -qq &&
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "frugal: package installation failed" >&2
    exit 1
  fi
fi

build_dir="${FRUGAL_BUILD_DIR:-build}"
cmake_args=()
read -r -a cmake_args <<<"${FRUGAL_CMAKE_ARGS:-}"

if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  echo "frugal: configuring $build_dir ${cmake_args[*]}"
  if ! cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$build_dir/CMakeCache.txt"  # so that the next run configures afresh
    echo "frugal: configuring failed" >&2
    exit 1
  fi
  sed -n 's/^-- frugal: /frugal: /p' "$log"  # the options it chose (oneDNN, CUDA)
elif ((${#cmake_args[@]} > 0)); then
  # Already configured: the new options go into the existing cache, which keeps the rest.
  echo "frugal: reconfiguring $build_dir ${cmake_args[*]}"
  cmake -S . -B "$build_dir" "${cmake_args[@]}" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
fi

echo "frugal: building $build_dir"
cmake --build "$build_dir" -j"${FRUGAL_JOBS:-$(nproc)}"

#!/usr/bin/env bash
# Builds frugal (scripts/setup.sh) and runs the demo; arguments are passed to it.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
build_dir="${FRUGAL_BUILD_DIR:-build}"
if [[ ! -x "$build_dir/examples/demo" ]]; then
  echo "frugal: $build_dir/examples/demo was not built; is $build_dir configured with FRUGAL_BUILD_EXAMPLES=OFF?" \
    "Run: FRUGAL_CMAKE_ARGS=-DFRUGAL_BUILD_EXAMPLES=ON scripts/run.sh" >&2
  exit 1
fi
exec "$build_dir/examples/demo" "$@"

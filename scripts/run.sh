#!/usr/bin/env bash
# Builds frugal (scripts/setup.sh) and runs the main job: the Fashion-MNIST trainer (workload W1, the MLP, five
# epochs) with its memory report. Arguments go to the trainer (see build/examples/train_fmnist --help).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
build_dir="${FRUGAL_BUILD_DIR:-build}"
trainer="$build_dir/examples/train_fmnist"
if [[ ! -x "$trainer" ]]; then
  echo "frugal: $trainer was not built; is $build_dir configured with FRUGAL_BUILD_EXAMPLES=OFF?" \
    "Run: FRUGAL_CMAKE_ARGS=-DFRUGAL_BUILD_EXAMPLES=ON scripts/run.sh" >&2
  exit 1
fi
exec "$trainer" "$@"

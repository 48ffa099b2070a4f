#!/usr/bin/env bash
# Builds frugal (scripts/setup.sh) and runs the whole test suite, the install-and-consume test included.
# Extra arguments go to ctest: scripts/test.sh -R memory, scripts/test.sh -L install.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
echo "frugal: testing"
# ctest runs two test programs at once on two cores: OpenMP threads that spin while waiting would steal each
# other's cores, so they sleep instead unless the caller chose otherwise.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
exec ctest --test-dir "${FRUGAL_BUILD_DIR:-build}" --output-on-failure -j2 "$@"

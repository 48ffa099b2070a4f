#!/usr/bin/env bash
# Framework overhead side by side: forward + backward per op for a 1,000-op chain of one-element tensors, in
# frugal and in libtorch (Debian's libtorch-dev), alternated for several rounds. Prints the median ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
ours=build/bench/bench_autograd
peer=build/bench/libtorch_overhead
[ -x "$ours" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
[ -x "$peer" ] || { echo "no libtorch peer: apt-get install libtorch-dev, then rebuild" >&2; exit 1; }
per_op() {  # median seconds per op from a Google Benchmark JSON report
  "$1" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true --benchmark_format=json |
    python3 -c 'import json,sys; print([b["s_per_op"] for b in json.load(sys.stdin)["benchmarks"] if b["name"].endswith("_median")][0])'
}
ratios=()
for r in $(seq "$rounds"); do
  f=$(per_op "$ours")
  t=$(OMP_NUM_THREADS=1 per_op "$peer")
  ratio=$(python3 -c "print(round($f / $t, 3))")
  ratios+=("$ratio")
  python3 -c "print('round $r: frugal %.0f ns/op, libtorch %.0f ns/op, ratio $ratio' % ($f * 1e9, $t * 1e9))"
done
python3 -c "import statistics; print('overhead median ratio frugal/libtorch:', statistics.median([$(IFS=,; echo "${ratios[*]}")]))"

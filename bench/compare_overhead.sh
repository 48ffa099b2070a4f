#!/usr/bin/env bash
# Framework overhead side by side: forward + backward per op for a 1,000-op chain of one-element tensors, in
# frugal and in libtorch, alternated for several rounds (ROUNDS, default 5). Prints each round and the median
# ratio to each libtorch that is built, and to the better (faster) of them:
#   build/bench/libtorch_overhead    Debian's libtorch-dev (1.13), built where CMake finds it
#   build/bench/libtorch2_overhead   the C++ library inside pip's torch wheel (2.x), built with
#                                    cmake -DFRUGAL_LIBTORCH_WORKLOADS=ON where `import torch` works
# Each libtorch runs with one OpenMP thread (one-element ops never run in parallel).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
ours=build/bench/bench_autograd
[ -x "$ours" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
peers=()
for p in libtorch_overhead libtorch2_overhead; do [ -x "build/bench/$p" ] && peers+=("$p"); done
[ ${#peers[@]} -gt 0 ] || {
  echo "no libtorch peer: apt-get install libtorch-dev, or pip install torch and cmake -DFRUGAL_LIBTORCH_WORKLOADS=ON" >&2
  exit 1
}
per_op() {  # median seconds per op from a Google Benchmark JSON report
  "$1" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true --benchmark_format=json |
    python3 -c 'import json,sys; print([b["s_per_op"] for b in json.load(sys.stdin)["benchmarks"] if b["name"].endswith("_median")][0])'
}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for r in $(seq "$rounds"); do
  line="round $r: frugal $(per_op "$ours")"
  for p in "${peers[@]}"; do line+=" $p $(OMP_NUM_THREADS=1 per_op "build/bench/$p")"; done
  echo "$line" >>"$log"
  python3 - "$line" <<'EOF'
import sys
w = sys.argv[1].split()
f = float(w[3])
print(" ".join(w[:2]), f"frugal {f * 1e9:.0f} ns/op;",
      "; ".join(f"{w[i]} {float(w[i + 1]) * 1e9:.0f} ns/op (ratio {f / float(w[i + 1]):.3f})" for i in range(4, len(w), 2)))
EOF
done
python3 - "$log" <<'EOF'
import statistics, sys
rounds = [l.split() for l in open(sys.argv[1])]
f = [float(w[3]) for w in rounds]
peers = {w[i]: [] for w in rounds for i in range(4, len(w), 2)}
for w in rounds:
    for i in range(4, len(w), 2):
        peers[w[i]].append(float(w[i + 1]))
for p, t in peers.items():
    print(f"overhead median ratio frugal/{p}: {statistics.median(a / b for a, b in zip(f, t)):.3f}")
# The better peer of each round: the lower time per op.
best = [min(float(w[i + 1]) for i in range(4, len(w), 2)) for w in rounds]
print(f"overhead median ratio frugal/better libtorch: {statistics.median(a / b for a, b in zip(f, best)):.3f}")
EOF

#!/usr/bin/env bash
# W5 side by side: frugal's f32 GEMM 1024^3 and PyTorch's, alternated for several rounds on this machine.
# Prints each round's GFLOP/s and the median ratio frugal / best PyTorch setting. Needs `pip install torch`.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
bench=build/bench/bench_core
[ -x "$bench" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
python3 -c "import torch" 2>/dev/null || { echo "PyTorch is not installed (pip install torch)" >&2; exit 1; }
ratios=()
for r in $(seq "$rounds"); do
  f=$("$bench" --benchmark_filter='BM_GemmF32/1024' --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
      --benchmark_format=json | python3 -c 'import json,sys; d=json.load(sys.stdin); print([b["FLOP/s"] for b in d["benchmarks"] if b["name"].endswith("_median")][0]/1e9)')
  # PyTorch's best setting: OpenBLAS/oneDNN defaults vs one OpenBLAS thread, with passive OpenMP waiting and
  # the machine's OpenBLAS core-type pin removed (WORKLOADS.md, Peers).
  t1=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE python3 bench/peers/torch_gemm.py | python3 -c 'import json,sys; print(json.load(sys.stdin)["gflops"])')
  t2=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 python3 bench/peers/torch_gemm.py | python3 -c 'import json,sys; print(json.load(sys.stdin)["gflops"])')
  best=$(python3 -c "print(max($t1, $t2))")
  ratio=$(python3 -c "print(round($f / $best, 3))")
  ratios+=("$ratio")
  printf 'round %d: frugal %.1f GFLOP/s, pytorch %.1f (default threads) / %.1f (OPENBLAS_NUM_THREADS=1), ratio %s\n' \
    "$r" "$f" "$t1" "$t2" "$ratio"
done
python3 -c "import statistics; print('W5 median ratio frugal/pytorch:', statistics.median([$(IFS=,; echo "${ratios[*]}")]))"

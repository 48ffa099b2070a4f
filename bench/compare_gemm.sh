#!/usr/bin/env bash
# W5 side by side: frugal's GEMM 1024^3 and PyTorch's, alternated for several rounds on this machine.
#   bench/compare_gemm.sh        f32: each round's GFLOP/s and the median ratio frugal / best PyTorch setting
#   bench/compare_gemm.sh bf16   f32 and bf16 of both in each round: the bf16 / f32 speed-up of each, and
#                                frugal / PyTorch in bf16
# Needs `pip install torch`.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-f32}
[[ "$mode" == f32 || "$mode" == bf16 ]] || { echo "usage: $0 [f32|bf16]" >&2; exit 1; }
rounds=${ROUNDS:-3}
bench=build/bench/bench_core
[ -x "$bench" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
python3 -c "import torch" 2>/dev/null || { echo "PyTorch is not installed (pip install torch)" >&2; exit 1; }

# frugal's median GFLOP/s for one benchmark (BM_GemmF32/1024, BM_Gemm16/bf16/1024).
frugal_gflops() {
  "$bench" --benchmark_filter="^$1\$" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    --benchmark_format=json | python3 -c 'import json,sys; d=json.load(sys.stdin); print([b["FLOP/s"] for b in d["benchmarks"] if b["name"].endswith("_median")][0]/1e9)'
}
# PyTorch's GFLOP/s in a dtype under its default threads and under one OpenBLAS thread (printed "t1 t2"), with
# passive OpenMP waiting and the machine's OpenBLAS core-type pin removed (WORKLOADS.md, Peers).
torch_gflops() {
  local t1 t2
  t1=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE python3 bench/peers/torch_gemm.py 1024 30 "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["gflops"])')
  t2=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 python3 bench/peers/torch_gemm.py 1024 30 "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["gflops"])')
  echo "$t1 $t2"
}
median() { python3 -c "import statistics, sys; print(round(statistics.median(float(x) for x in sys.argv[1:]), 3))" "$@"; }

ratios=() frugal_speedups=() torch_speedups=() bf16_ratios=()
for r in $(seq "$rounds"); do
  f=$(frugal_gflops 'BM_GemmF32/1024/real_time')
  read -r t1 t2 <<< "$(torch_gflops f32)"
  best=$(python3 -c "print(max($t1, $t2))")
  ratio=$(python3 -c "print(round($f / $best, 3))")
  ratios+=("$ratio")
  printf 'round %d: f32 frugal %.1f GFLOP/s, pytorch %.1f (default threads) / %.1f (OPENBLAS_NUM_THREADS=1), ratio %s\n' \
    "$r" "$f" "$t1" "$t2" "$ratio"
  if [[ "$mode" == bf16 ]]; then
    fb=$(frugal_gflops 'BM_Gemm16/bf16/1024/real_time')
    read -r b1 b2 <<< "$(torch_gflops bf16)"
    best_b=$(python3 -c "print(max($b1, $b2))")
    frugal_speedups+=("$(python3 -c "print(round($fb / $f, 3))")")
    torch_speedups+=("$(python3 -c "print(round($best_b / $best, 3))")")
    bf16_ratios+=("$(python3 -c "print(round($fb / $best_b, 3))")")
    printf '         bf16 frugal %.1f GFLOP/s, pytorch %.1f / %.1f; bf16/f32: frugal %s, pytorch %s; frugal/pytorch %s\n' \
      "$fb" "$b1" "$b2" "${frugal_speedups[-1]}" "${torch_speedups[-1]}" "${bf16_ratios[-1]}"
  fi
done
echo "W5 median ratio frugal/pytorch (f32): $(median "${ratios[@]}")"
if [[ "$mode" == bf16 ]]; then
  echo "median bf16/f32 speed-up: frugal $(median "${frugal_speedups[@]}"), pytorch $(median "${torch_speedups[@]}")"
  echo "median ratio frugal/pytorch (bf16): $(median "${bf16_ratios[@]}")"
fi

#!/usr/bin/env bash
# W3 side by side: frugal's GPT training step (bench_gpt, with and without recompute) and PyTorch's
# (bench/peers/torch_gpt.py, scaled_dot_product_attention and the softmax form, default threads and
# OPENBLAS_NUM_THREADS=1), alternated for several rounds. Prints each round's median step ms, frugal's peak
# arena bytes, and the median ratio frugal / best PyTorch setting. Needs `pip install torch`.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
bench=build/bench/bench_gpt
[ -x "$bench" ] || { echo "build first: ninja -C build bench_gpt" >&2; exit 1; }
python3 -c "import torch" 2>/dev/null || { echo "PyTorch is not installed (pip install torch)" >&2; exit 1; }
peer() {  # peer <attention> [env...]: median ms of one torch_gpt.py run
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE "${@:2}" python3 bench/peers/torch_gpt.py 25 "$1" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["median_ms"])'
}
ratios=()
for r in $(seq "$rounds"); do
  read -r f0 p0 f1 p1 < <("$bench" --benchmark_filter='BM_GPTStep' --benchmark_format=json |
    python3 -c 'import json,sys; b=json.load(sys.stdin)["benchmarks"]; print(*[str(x["median_ms"]) + " " + str(int(x["peak_bytes"])) for x in b])')
  t1=$(peer sdpa); t2=$(peer sdpa OPENBLAS_NUM_THREADS=1); t3=$(peer softmax); t4=$(peer softmax OPENBLAS_NUM_THREADS=1)
  best=$(python3 -c "print(min($t1, $t2, $t3, $t4))")
  ratio=$(python3 -c "print(round($f0 / $best, 3))")
  ratios+=("$ratio")
  printf 'round %d: frugal %.1f ms (peak %d B), recompute %.1f ms (peak %d B); pytorch sdpa %.1f / %.1f (1 thread), softmax %.1f / %.1f; ratio %s\n' \
    "$r" "$f0" "$p0" "$f1" "$p1" "$t1" "$t2" "$t3" "$t4" "$ratio"
done
python3 -c "import statistics; print('W3 median ratio frugal/pytorch:', statistics.median([$(IFS=,; echo "${ratios[*]}")]))"

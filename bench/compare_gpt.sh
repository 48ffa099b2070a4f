#!/usr/bin/env bash
# W3 side by side: frugal's GPT training step (bench_gpt BM_GPTStep, with and without recompute) and PyTorch's
# (bench/peers/torch_gpt.py with scaled_dot_product_attention and with the softmax form), each with its
# default threads and with one thread (OMP_NUM_THREADS=1 / OPENBLAS_NUM_THREADS=1), all with
# OMP_WAIT_POLICY=PASSIVE (on a shared 2-core host, spinning OpenMP threads make both sides several times
# slower), alternated for several rounds. Prints each round's median step ms, frugal's peak arena bytes, and the ratio frugal / PyTorch of
# the best settings; then the median ratio. Needs `pip install torch`.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
bench=build/bench/bench_gpt
[ -x "$bench" ] || { echo "build first: ninja -C build bench_gpt" >&2; exit 1; }
python3 -c "import torch" 2>/dev/null || { echo "PyTorch is not installed (pip install torch)" >&2; exit 1; }
frugal() {  # frugal [env...]: "ms peak_bytes ms_recompute peak_bytes_recompute"
  env "$@" "$bench" --benchmark_filter='BM_GPTStep' --benchmark_format=json 2>/dev/null |
    python3 -c 'import json,sys; b=json.load(sys.stdin)["benchmarks"]; print(*[str(x["median_ms"]) + " " + str(int(x["peak_bytes"])) for x in b])'
}
peer() {  # peer <sdpa|softmax> [env...]: median ms of one torch_gpt.py run
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE "${@:2}" python3 bench/peers/torch_gpt.py 25 "$1" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["median_ms"])'
}
ratios=()
for r in $(seq "$rounds"); do
  read -r f0 p0 g0 q0 < <(frugal OMP_WAIT_POLICY=PASSIVE)
  t1=$(peer sdpa); t2=$(peer softmax)
  read -r f1 p1 g1 q1 < <(frugal OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1)
  t3=$(peer sdpa OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1); t4=$(peer softmax OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)
  fb=$(python3 -c "print(min($f0, $f1))"); tb=$(python3 -c "print(min($t1, $t2, $t3, $t4))")
  ratio=$(python3 -c "print(round($fb / $tb, 3))")
  ratios+=("$ratio")
  printf 'round %d: frugal %.1f ms / %.1f (1 thread), peak %d B; recompute %.1f / %.1f ms, peak %d B\n' \
    "$r" "$f0" "$f1" "$p0" "$g0" "$g1" "$q0"
  printf '         pytorch sdpa %.1f / %.1f (1 thread), softmax %.1f / %.1f; best frugal / best pytorch %s\n' \
    "$t1" "$t3" "$t2" "$t4" "$ratio"
done
python3 -c "import statistics; print('W3 median ratio frugal/pytorch:', statistics.median([$(IFS=,; echo "${ratios[*]}")]))"

#!/usr/bin/env bash
# Side by side: frugal's bench/workloads and its peers, alternated for ROUNDS rounds (default 3) on this
# machine, then a Markdown table of medians, ratios and shared/WORKLOADS.md's targets. Every side runs under
# each of its settings below every round; the table keeps each side's better setting and names it.
#   bench/compare.sh W1 W5          (default: W1 W3 W4 W4r W5)
# Peers (PEERS, default "pytorch libtorch"):
#   pytorch          bench/peers/torch_workloads.py under python3 (pip's torch)
#   libtorch         build/bench/libtorch2_workloads: the C++ peer built against pip's torch wheel
#   libtorch-debian  build/bench/libtorch_workloads: the same against Debian's libtorch-dev 1.13, whose GEMMs run
#                    on the reference BLAS (about 3 GFLOP/s here), so W4/W4r take minutes a step; not by default
# The C++ peers are built with cmake -DFRUGAL_LIBTORCH_WORKLOADS=ON; a peer that is missing is left out. Each
# peer runs with the settings WORKLOADS.md names (OpenBLAS core-type pin removed, passive OpenMP waiting),
# once with OPENBLAS_NUM_THREADS=1 and once with the default each round, and once more with one OpenBLAS
# thread under OpenMP's default waiting. frugal runs with passive waiting and with OpenMP's default. FRUGAL_BENCH_STEPS shortens every side's runs alike;
# Round r runs W1/W2 with seed FRUGAL_BENCH_SEED + r - 1 (FRUGAL_BENCH_SEED defaults to 0) on every side, so
# their accuracy is a mean over ROUNDS seeds: one seed's accuracy swings by about 2 points, more than the
# 0.5-point target. Times and memory do not depend on the seed.
# W4r and W6 are judged against frugal's own W4 and W3 (run W4r with W4; W6 and W4b carry the W3 and W4 figures
# of runs alternated with them in the same process). FRUGAL_PEAK_GFLOPS and FRUGAL_PEAK_BF16_GFLOPS (the f32
# and bf16 ceilings from fma-peak.sh, measured now on this machine; or "measure", for bench/workloads to
# measure them itself) add each GEMM's fraction of its ceiling. Before each round the host's idle second is
# checked: a round that begins with more than COMPARE_BUSY_PERCENT (default 10) of the CPUs' time going to
# other work is named on stderr, and counted at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
workloads=("$@")
[ ${#workloads[@]} -gt 0 ] || workloads=(W1 W3 W4 W4r W5)
ours=build/bench/workloads
[ -x "$ours" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }

declare -A peer_cmd=(
  [pytorch]="python3 bench/peers/torch_workloads.py"
  [libtorch]="build/bench/libtorch2_workloads"
  [libtorch-debian]="build/bench/libtorch_workloads"
)
peers=()
for p in ${PEERS:-pytorch libtorch}; do
  [ -n "${peer_cmd[$p]:-}" ] || { echo "unknown peer $p (pytorch, libtorch, libtorch-debian)" >&2; exit 1; }
  if [ "$p" = pytorch ]; then
    python3 -c "import torch" 2>/dev/null || { echo "note: PyTorch is not installed; no pytorch column" >&2; continue; }
  elif [ ! -x "${peer_cmd[$p]}" ]; then
    echo "note: ${peer_cmd[$p]} is not built (cmake -DFRUGAL_LIBTORCH_WORKLOADS=ON); no $p column" >&2
    continue
  fi
  peers+=("$p")
done

# The percent of the CPUs' time busy over one second while nothing of this run goes: other work, or a
# hypervisor's steal. A busy host slows every side unevenly (a run beside a build once read PyTorch's W4b at
# 3x its time), so a round that begins on one is named, for its figures to be read with care or run again.
host_busy() {
  local a b i total=0
  read -r -a a </proc/stat
  sleep 1
  read -r -a b </proc/stat
  for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done # user .. steal
  local idle=$((b[4] + b[5] - a[4] - a[5]))                       # idle and iowait
  echo $((total > 0 ? 100 * (total - idle) / total : 0))
}

log=$(mktemp)
trap 'rm -f "$log"' EXIT
base_seed=${FRUGAL_BENCH_SEED:-0}
busy_rounds=0
for r in $(seq "$rounds"); do
  export FRUGAL_BENCH_SEED=$((base_seed + r - 1))
  busy=$(host_busy)
  if ((busy > ${COMPARE_BUSY_PERCENT:-10})); then
    echo "note: round $r begins on a busy host: ${busy}% of the CPUs' time went to other work (or steal) in the second before it" >&2
    busy_rounds=$((busy_rounds + 1))
  fi
  for w in "${workloads[@]}"; do
    # frugal under both OpenMP waiting policies, its better one kept: passive waiting (the peers') wins on a
    # loaded host, where threads spinning at barriers cost up to 2x; OpenMP's default (spin a while, then
    # sleep) wins where many small parallel regions follow one another (W1: 1.1 against 1.7 ms a step).
    for wait in passive spin; do
      if [ "$wait" = passive ]; then policy=(OMP_WAIT_POLICY=PASSIVE); else policy=(-u OMP_WAIT_POLICY); fi
      env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "${policy[@]}" "$ours" "$w" | sed "s/^/frugal:$wait $r /" >>"$log"
    done
    # The peers: passive waiting with one OpenBLAS thread and with its default; and, as frugal gets it,
    # OpenMP's default waiting with one OpenBLAS thread (whose threads then do not spin against OpenMP's).
    for p in "${peers[@]}"; do
      for t in 1 default 1-spin; do
        extra=(OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1)
        [ "$t" = default ] && extra=(OMP_WAIT_POLICY=PASSIVE)
        [ "$t" = 1-spin ] && extra=(-u OMP_WAIT_POLICY OPENBLAS_NUM_THREADS=1)
        # shellcheck disable=SC2086  # the command is words
        env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "${extra[@]}" ${peer_cmd[$p]} "$w" | sed "s/^/$p:$t $r /" >>"$log"
      done
    done
  done
done
python3 bench/compare_table.py "$log" "${peers[@]}"
if ((busy_rounds > 0)); then
  echo "note: $busy_rounds of $rounds rounds began on a busy host (above ${COMPARE_BUSY_PERCENT:-10}% busy): their times may be slow" >&2
fi

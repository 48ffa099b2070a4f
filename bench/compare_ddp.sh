#!/usr/bin/env bash
# Communication overlap on W3 (train_chargpt's defaults): 2 ranks x 1 thread under mpirun with --ddp at the
# global batch 32, against 1 rank x 1 thread at batch 16 (each rank's share), alternated for several rounds.
# A ratio near 1 means the gradients' all-reduce is hidden behind backward. Prints each round's median step
# times, the ranks' wait for the reductions at the end of backward, and the median ratio.
#   bench/compare_ddp.sh                 # default buckets (25 MiB: one bucket for W3)
#   BUCKET_MB=0.5 ROUNDS=3 bench/compare_ddp.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
steps=${STEPS:-60}
trainer=build/examples/train_chargpt
[ -x "$trainer" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "no mpirun: apt-get install openmpi-bin libopenmpi-dev" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
step_ms() { grep -E '^median step' | awk '{print $3}'; }
ratios=()
for r in $(seq "$rounds"); do
  one=$("$trainer" --threads 1 --batch 16 --steps "$steps" 2>&1 | step_ms)
  out=$(mpirun -np 2 --bind-to none "$trainer" --ddp --threads 1 --batch 32 --steps "$steps" \
    --bucket-mb "${BUCKET_MB:-25}" 2>&1)
  two=$(echo "$out" | step_ms)
  wait=$(echo "$out" | sed -n 's/.*end of backward \([0-9.]*\) ms.*/\1/p')
  ratio=$(python3 -c "print(round($two / $one, 3))")
  ratios+=("$ratio")
  echo "round $r: 1 rank ${one} ms, 2 ranks ${two} ms (wait ${wait} ms), ratio $ratio"
done
python3 -c "import statistics; print('ddp median ratio 2 ranks / 1 rank at half the batch:', statistics.median([$(IFS=,; echo "${ratios[*]}")]))"

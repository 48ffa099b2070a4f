#!/usr/bin/env bash
# train_fmnist --ddp on 2 ranks, saved after epoch 1 and resumed, ends epoch 2 as the run that never stopped
# (rank 0 writes the checkpoint; every rank resumes from it).
#   tests/dist/ddp_resume.sh MPIEXEC TRAIN_FMNIST
set -euo pipefail
mpiexec=$1
trainer=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() {
  "$mpiexec" -np 2 --oversubscribe --bind-to none "$trainer" --ddp --threads 1 --max-steps 30 --schedule none "$@" |
    grep -E '^epoch 2:' | sed 's/ ([0-9.]* s)$//'
}
straight=$(run --epochs 2)
"$mpiexec" -np 2 --oversubscribe --bind-to none "$trainer" --ddp --threads 1 --max-steps 30 --schedule none \
  --epochs 1 --save "$work/ckpt.safetensors" >/dev/null
resumed=$(run --epochs 2 --resume "$work/ckpt.safetensors")
echo "straight: $straight"
echo "resumed:  $resumed"
[[ -n "$straight" && "$straight" == "$resumed" ]]

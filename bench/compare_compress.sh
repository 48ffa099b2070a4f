#!/usr/bin/env bash
# Side by side: examples/compress (frugal's techniques) and PyTorch's own tools (bench/peers/torch_compress.py)
# on the same trained weights, in one run, then one Markdown table of both.
#   bench/compare_compress.sh mlp        (or cnn; default mlp)
# frugal trains the model (or takes WEIGHTS=FILE, a train_fmnist --save file) and writes the weights it used,
# which PyTorch then loads. Both sides wait for OpenMP work passively (shared/WORKLOADS.md's settings).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-mlp}
ours=build/examples/compress
[ -x "$ours" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
export OMP_WAIT_POLICY=PASSIVE
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--model "$model" --json --save-weights "$dir/weights.safetensors")
[ -n "${WEIGHTS:-}" ] && args+=(--weights "$WEIGHTS")
"$ours" "${args[@]}" >"$dir/frugal.jsonl"
python3 bench/peers/torch_compress.py --model "$model" --weights "$dir/weights.safetensors" >"$dir/torch.jsonl"
python3 - "$dir/frugal.jsonl" "$dir/torch.jsonl" <<'PY'
import json, sys
rows = [dict(json.loads(l), peer=json.loads(l).get("peer", "frugal")) for f in sys.argv[1:] for l in open(f) if l.strip()]
base = {r["peer"]: r for r in rows if r["technique"] == "f32"}
# × f32 (time): frugal's rows give the median of their forwards' ratios to the f32 model's, timed alternately
# (infer_x_f32); PyTorch's rows the ratio of the medians.
print("| peer | technique | model bytes | × f32 | file bytes | test accuracy | infer ms (256) | × f32 |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    b = base[r["peer"]]
    print(f"| {r['peer']} | {r['technique']} | {r['model_bytes']} | {r['model_bytes'] / b['model_bytes']:.3f} | "
          f"{r['file_bytes']} | {r['test_accuracy']:.4f} | {r['infer_ms']:.3f} | "
          f"{r.get('infer_x_f32', r['infer_ms'] / b['infer_ms']):.2f} |")
PY

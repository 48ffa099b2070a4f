#!/usr/bin/env bash
# W3 under memory budgets, frugal's planner beside PyTorch's checkpointing at the same peak (issue: train to a
# memory budget). Alternates for ROUNDS rounds (default 3):
#   frugal   build/bench/plan_budgets W3: plain, every block recomputed, and memory::plan's runs under 0.3,
#            0.5 and 0.7 x the plain peak;
#   pytorch  bench/peers/torch_workloads.py W3c: plain, checkpoint_sequential in 2 and in 4 segments, and each
#            block through checkpoint.
# Both sides measure a configuration's peak the same way, in bytes: the parameters' and the optimizer state's
# plus the step's peak above what was alive before it (frugal: its arena; PyTorch: torch.profiler's allocation
# events). Times are medians of each side's steps, each configuration's also over its own side's plain step
# from the same process. Prints one Markdown row per frugal configuration: its medians, and the fastest
# PyTorch configuration whose peak in bytes is no higher ("none reaches it": no checkpointing of PyTorch's
# gets that low). Needs `pip install torch` and build/bench/plan_budgets.
#   ROUNDS=3 bench/compare_budgets.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
ours=build/bench/plan_budgets
[ -x "$ours" ] || { echo "build first: ninja -C build bench/plan_budgets" >&2; exit 1; }
python3 -c "import torch" 2>/dev/null || { echo "PyTorch is not installed (pip install torch)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq "$rounds"); do
  OMP_WAIT_POLICY=PASSIVE "$ours" W3 1 10 >"$out/frugal.$r" 2>/dev/null
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE \
    python3 bench/peers/torch_workloads.py W3c 2>/dev/null | tail -n 1 >"$out/pytorch.$r"
  echo "round $r done" >&2
done
python3 - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
ours = {}  # name -> list of lines, one a round
for r in range(1, rounds + 1):
    for line in open(f"{out}/frugal.{r}"):
        j = json.loads(line)
        ours.setdefault(j["name"], []).append(j)
peer = [json.loads(open(f"{out}/pytorch.{r}").read()) for r in range(1, rounds + 1)]
med = statistics.median
labels = {"0": "plain", "2": "checkpoint_sequential, 2 segments", "4": "checkpoint_sequential, 4 segments",
          "each": "checkpoint on each block"}
ms_key = {"0": "median_step_ms", "2": "sqrt_n_segments_ms", "4": "per_block_segments_ms", "each": "each_block_ms"}
# PyTorch's configurations: peak bytes (state + step peak) and median step ms.
plain_ms = med([p["median_step_ms"] for p in peer])
torch_cfg = {k: (med([p["state_bytes"] + p["step_peak_bytes"][k] for p in peer]), med([p[ms_key[k]] for p in peer]))
             for k in labels}
mib = lambda b: f"{b / 2**20:.1f} MiB"
print("| frugal configuration | peak | ms | × frugal plain | fastest PyTorch at no higher peak | its peak | its ms | × PyTorch plain |")
print("|---|---|---|---|---|---|---|---|")
for name, js in ours.items():
    peak = med([j["state_bytes"] + j["step_peak_bytes"] for j in js])
    ms, t = med([j["median_step_ms"] for j in js]), med([j["time_ratio"] for j in js])
    plan = js[0]["plan"].split(":")[0] if js[0]["plan"] else ""
    reach = [(tms, k) for k, (b, tms) in torch_cfg.items() if b <= peak]
    if reach:
        tms, k = min(reach)
        cells = [labels[k], mib(torch_cfg[k][0]), f"{tms:.1f}", f"{tms / plain_ms:.3f}"]
    else:
        cells = ["none reaches it", "", "", ""]
    print(f"| {name}{' (' + plan + ')' if plan else ''} | {mib(peak)} | {ms:.1f} | {t:.3f} | " + " | ".join(cells) + " |")
print("\nPyTorch:", "; ".join(f"{labels[k]}: {mib(b)}, {tms:.1f} ms ({tms / plain_ms:.3f}x)" for k, (b, tms) in torch_cfg.items()))
EOF

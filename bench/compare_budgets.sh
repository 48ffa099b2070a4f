#!/usr/bin/env bash
# W3 under memory budgets, frugal's planner beside PyTorch's checkpointing at the same peak (issue: train to a
# memory budget). Alternates for ROUNDS rounds (default 3):
#   frugal   build/bench/plan_budgets W3: plain, every block recomputed, and memory::plan's runs under 0.3,
#            0.5 and 0.7 x the plain peak;
#   pytorch  bench/peers/torch_workloads.py W3c: plain, checkpoint_sequential in 2 and in 4 segments, and each
#            block through checkpoint.
# Both sides measure a configuration's peak the same way: the parameters' and the optimizer state's bytes plus
# the step's peak above what was alive before it (frugal: its arena; PyTorch: torch.profiler's allocation
# events), as a fraction of the same figure for the plain run (peak_fraction). Time is each configuration's
# median step over its own side's plain step, from the same process. Prints one Markdown row per frugal
# configuration: its medians, and the fastest PyTorch configuration whose peak is no higher (or "none": no
# checkpointing of PyTorch's reaches that peak). Needs `pip install torch` and build/bench/plan_budgets.
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
labels = {"2": "checkpoint_sequential, 2 segments", "4": "checkpoint_sequential, 4 segments",
          "each": "checkpoint on each block"}
ratio_key = {"2": "sqrt_n_ratio", "4": "per_block_ratio", "each": "each_block_ratio"}
med = statistics.median
torch_cfg = {k: (med([p["peak_fraction"][k] for p in peer]), med([p[ratio_key[k]] for p in peer])) for k in labels}
print("| frugal configuration | peak fraction | time × plain | PyTorch at no higher peak | its peak fraction | its time × plain |")
print("|---|---|---|---|---|---|")
for name, js in ours.items():
    frac, t = med([j["peak_fraction"] for j in js]), med([j["time_ratio"] for j in js])
    plan = js[0]["plan"].split(":")[0] if js[0]["plan"] else ""
    reach = [(tt, k) for k, (f, tt) in torch_cfg.items() if f <= frac]
    if name.endswith("plain"):
        cells = ["(plain)", "1", "1"]
    elif reach:
        tt, k = min(reach)
        cells = [labels[k], f"{torch_cfg[k][0]:.3f}", f"{tt:.3f}"]
    else:
        cells = ["none", "", ""]
    print(f"| {name}{' (' + plan + ')' if plan else ''} | {frac:.3f} | {t:.3f} | " + " | ".join(cells) + " |")
print("\nPyTorch:", ", ".join(f"{labels[k]}: peak fraction {f:.3f}, {t:.3f}x" for k, (f, t) in torch_cfg.items()),
      f"(plain step {med([p['median_step_ms'] for p in peer]):.1f} ms, step peak "
      f"{med([p['step_peak_bytes']['0'] for p in peer]):.0f} B)")
print("frugal plain step", f"{med([j['median_step_ms'] for j in ours['W3 plain']]):.1f} ms, step peak",
      f"{med([j['step_peak_bytes'] for j in ours['W3 plain']]):.0f} B")
EOF

#!/usr/bin/env bash
# Side by side: frugal's bench/workloads and PyTorch's bench/peers/torch_workloads.py, alternated for ROUNDS
# rounds (default 3) on this machine; PyTorch gets the settings shared/WORKLOADS.md names (OpenBLAS core-type
# pin removed, passive OpenMP waiting) and the better of OPENBLAS_NUM_THREADS=1 and the default each round.
# Prints a Markdown table of medians and ratios.   bench/compare.sh W1 W5      (default: W1 W3 W4 W4r W5)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
workloads=("$@")
[ ${#workloads[@]} -gt 0 ] || workloads=(W1 W3 W4 W4r W5)
ours=build/bench/workloads
[ -x "$ours" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
python3 -c "import torch" 2>/dev/null || { echo "PyTorch is not installed (pip install torch)" >&2; exit 1; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for r in $(seq "$rounds"); do
  for w in "${workloads[@]}"; do
    "$ours" "$w" | sed "s/^/frugal $r /" >>"$log"
    for t in 1 default; do
      if [ "$t" = 1 ]; then extra=(OPENBLAS_NUM_THREADS=1); else extra=(); fi
      env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE "${extra[@]}" \
        python3 bench/peers/torch_workloads.py "$w" | sed "s/^/pytorch-$t $r /" >>"$log"
    done
  done
done
python3 - "$log" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    who, rnd, js = line.split(" ", 2)
    d = json.loads(js)
    rows.setdefault(d["name"], {}).setdefault(who, []).append(d)
def key(d):  # the time figure of a workload
    return d.get("median_step_ms", d.get("median_ms"))
print("| workload | frugal ms | pytorch ms (best setting) | ratio frugal/pytorch | frugal peak RSS | pytorch peak RSS | RSS ratio | quality frugal / pytorch |")
print("|---|---|---|---|---|---|---|---|")
for name, sides in rows.items():
    f = statistics.median(key(d) for d in sides["frugal"])
    best = min(("pytorch-1", "pytorch-default"), key=lambda s: statistics.median(key(d) for d in sides[s]))
    p = statistics.median(key(d) for d in sides[best])
    fr = max(d.get("peak_rss_bytes", 0) for d in sides["frugal"]) / 2**20
    pr = max(d.get("peak_rss_bytes", 0) for d in sides[best]) / 2**20
    q = next((k for k in ("test_accuracy", "loss", "gflops") if k in sides["frugal"][0]), None)
    qual = f'{sides["frugal"][-1][q]:.4g} / {sides[best][-1][q]:.4g} ({q})' if q else ""
    setting = "OPENBLAS_NUM_THREADS=1" if best == "pytorch-1" else "default threads"
    print(f"| {name} | {f:.3f} | {p:.3f} ({setting}) | {f / p:.3f} | {fr:.0f} MiB | {pr:.0f} MiB | "
          f"{(fr / pr if pr else 0):.2f} | {qual} |")
PY

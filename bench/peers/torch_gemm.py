"""Workload W5 in PyTorch: f32 GEMM 1024^3, median of timed runs in GFLOP/s (prints one JSON line).

The peer for bench/bench_core's BM_GemmF32/1024; run both alternately (bench/compare_gemm.sh)."""
import json
import statistics
import sys
import time

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
a, b = torch.randn(n, n), torch.randn(n, n)
c = a @ b
ref = (a.double() @ b.double()).float()
assert torch.allclose(c, ref, rtol=1e-3, atol=1e-3), "torch GEMM differs from the f64 reference"
for _ in range(3):
    a @ b
times = []
for _ in range(reps):
    t0 = time.perf_counter()
    a @ b
    times.append(time.perf_counter() - t0)
med = statistics.median(times)
print(json.dumps({"name": "W5", "peer": "pytorch " + torch.__version__, "threads": torch.get_num_threads(),
                  "median_ms": med * 1e3, "gflops": 2 * n**3 / med / 1e9}))

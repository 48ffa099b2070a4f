"""Workload W5 in PyTorch: GEMM 1024^3, median of timed runs in GFLOP/s (prints one JSON line).

Arguments: [n] [reps] [dtype: f32 (default), bf16 or f16]. The peer for bench/bench_core's BM_GemmF32/1024
and BM_Gemm16/bf16/1024; run both alternately (bench/compare_gemm.sh)."""
import json
import statistics
import sys
import time

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
dtype_name = sys.argv[3] if len(sys.argv) > 3 else "f32"
dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype_name]
a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
c = a @ b
# Against f64 products of the same (rounded) values, at the result type's rounding.
ref = a.double() @ b.double()
tol = {"f32": 1e-3, "bf16": 1e-2, "f16": 2e-3}[dtype_name]
assert torch.allclose(c.double(), ref, rtol=tol, atol=tol), "torch GEMM differs from the f64 reference"
for _ in range(3):
    a @ b
times = []
for _ in range(reps):
    t0 = time.perf_counter()
    a @ b
    times.append(time.perf_counter() - t0)
med = statistics.median(times)
print(json.dumps({"name": "W5", "peer": "pytorch " + torch.__version__, "dtype": dtype_name,
                  "threads": torch.get_num_threads(), "median_ms": med * 1e3, "gflops": 2 * n**3 / med / 1e9}))

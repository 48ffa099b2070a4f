"""The W2 convolutions in PyTorch at batch 64 (3x3, padding 1): conv1 1->32 on 28x28 forward + weight/bias
gradients, conv2 32->64 on 14x14 forward + input/weight/bias gradients; median ms (one JSON line each).

The peer for bench/bench_conv's BM_Conv/conv{1,2}_train_step; run both alternately."""
import json
import statistics
import sys
import time

import torch

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
torch.manual_seed(0)
for name, c, o, hw, need_dx in [("conv1", 1, 32, 28, False), ("conv2", 32, 64, 14, True)]:
    x = torch.randn(64, c, hw, hw, requires_grad=need_dx)
    w = torch.randn(o, c, 3, 3, requires_grad=True)
    b = torch.randn(o, requires_grad=True)
    dy = torch.randn(64, o, hw, hw)
    y = torch.nn.functional.conv2d(x, w, b, padding=1)
    ref = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), padding=1)
    assert torch.allclose(y.double(), ref, rtol=1e-4, atol=1e-3), "torch conv differs from the f64 result"

    def step():
        y = torch.nn.functional.conv2d(x, w, b, padding=1)
        y.backward(dy)

    for _ in range(3):
        step()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"name": name + "_train_step", "peer": "pytorch " + torch.__version__,
                      "threads": torch.get_num_threads(), "median_ms": statistics.median(times) * 1e3}))

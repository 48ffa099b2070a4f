// The W2 step timing of bench/cuda/w2_step.h: the model and optimizer the CPU workload uses (examples/
// fmnist.h), moved to cuda:0, so that the convolution, pooling and GEMM kernels of the GPU run as W2 uses
// them.
#include "bench/cuda/w2_step.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "examples/fmnist.h"
#include "kernels/cuda/runtime.h"

namespace frugal::bench {

W2StepTiming time_w2_step(std::optional<DType> autocast, int warmup, int reps) {
  const Device gpu = cuda(0);
  manual_seed(0);
  auto model = fmnist::make_cnn();
  model->to(gpu);
  optim::Adam opt(model->parameters(), optim::AdamOptions(1e-3));
  Generator g(1);
  data::Batch batch{rand({64, 1, 28, 28}, DType::F32, &g).to(gpu),
                    randint(0, 10, {64}, DType::I64, &g).to(gpu)};
  fmnist::Precision precision(autocast);
  W2StepTiming t;
  std::vector<double> ms;
  for (int i = 0; i < warmup + reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    opt.zero_grad();
    const fmnist::StepResult r = fmnist::forward_backward(*model, batch, 1.0, &precision);
    precision.scaler.step(opt);
    precision.scaler.update();
    FRUGAL_CUDA_CHECK(cudaDeviceSynchronize());
    const double step_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (i < warmup) continue;
    ms.push_back(step_ms);
    if (i == warmup) t.first_loss = r.loss;
    t.last_loss = r.loss;
  }
  std::sort(ms.begin(), ms.end());
  t.median_ms = ms.empty() ? 0 : ms[ms.size() / 2];
  return t;
}

}  // namespace frugal::bench

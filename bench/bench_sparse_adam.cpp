// SparseAdam against dense Adam on the step of one embedding, 50,000 x 256 f32, after a batch that touched
// 2,048 of its rows: SparseAdam reads and writes only those rows (and their state); Adam, given the same
// gradient in dense form, walks all 12.8 M elements. Counters: `bytes` is what the update touches per step
// (parameter, exp_avg and exp_avg_sq read and written, the gradient read; SparseAdam adds its row indices),
// `bytes_per_second` that over the time. Both updates are first checked against each other on one step.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "autograd/sparse.h"
#include "frugal.h"
#include "optim/sparse_adam.h"

namespace {

using namespace frugal;

constexpr int64_t kRows = 50000, kDim = 256, kTouched = 2048;

// 2,048 distinct rows (a fixed shuffle) and their gradient values.
struct Batch {
  Tensor indices, values;
};
const Batch& batch() {
  static const Batch b = [] {
    std::vector<int64_t> rows(static_cast<size_t>(kRows));
    std::iota(rows.begin(), rows.end(), int64_t(0));
    std::shuffle(rows.begin(), rows.end(), std::mt19937_64(7));
    rows.resize(size_t(kTouched));
    Generator gen(3);
    return Batch{tensor(rows), randn({kTouched, kDim}, {}, &gen)};
  }();
  return b;
}

Tensor make_weight() {
  Generator gen(1);
  return randn({kRows, kDim}, {}, &gen).requires_grad_();
}

void set_sparse_grad(const Tensor& w) {
  w.zero_grad();
  autograd::accumulate_sparse_grad(*w.autograd_meta(), batch().indices, batch().values, kRows);
}
void set_dense_grad(const Tensor& w) {
  w.set_grad(autograd::to_dense(autograd::coalesce(batch().indices, batch().values, kRows)));
}

// One step of each from the same weights must agree: the touched rows move alike, the others not at all. The
// two differ in where eps enters (SparseAdam adds it before the bias correction), so the check uses an eps
// small enough to vanish against the smallest gradients drawn.
bool check() {
  Tensor a = make_weight(), b = make_weight();
  optim::SparseAdam sparse_opt({a}, optim::SparseAdamOptions(1e-3).eps(1e-14));
  optim::Adam dense_opt({b}, optim::AdamOptions(1e-3).eps(1e-14));
  set_sparse_grad(a);
  set_dense_grad(b);
  sparse_opt.step();
  dense_opt.step();
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  for (int64_t i = 0; i < kRows * kDim; ++i)
    if (std::fabs(x[i] - y[i]) > 1e-6f * (1 + std::fabs(y[i]))) return false;
  return ops::ne(a.detach(), make_weight().detach()).sum().item<int64_t>() == kTouched * kDim;
}

void set_counters(benchmark::State& state, double bytes) {
  state.counters["bytes"] = bytes;
  state.counters["bytes_per_second"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_SparseAdamStep(benchmark::State& state) {
  if (!check()) return state.SkipWithError("SparseAdam and Adam disagree on one step");
  Tensor w = make_weight();
  optim::SparseAdam opt({w}, optim::SparseAdamOptions(1e-3));
  set_sparse_grad(w);
  for (auto _ : state) opt.step();
  set_counters(state, double(kTouched * kDim) * 4 * 7 + double(kTouched) * 8);
}
BENCHMARK(BM_SparseAdamStep)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_DenseAdamStep(benchmark::State& state) {
  if (!check()) return state.SkipWithError("SparseAdam and Adam disagree on one step");
  Tensor w = make_weight();
  optim::Adam opt({w}, optim::AdamOptions(1e-3));
  set_dense_grad(w);
  for (auto _ : state) opt.step();
  set_counters(state, double(kRows * kDim) * 4 * 7);
}
BENCHMARK(BM_DenseAdamStep)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

// Adam8bit's fused kernel (op_adam8bit_step) against f32 Adam's (op_adam_step) over W3's parameters: the
// char-GPT of examples/chargpt.h at its defaults (4 layers, width 128, context 64; a vocabulary of 114, the
// fortunes corpus's), 0.83 M parameters. One iteration updates every parameter once, calling
// the kernel directly, every parameter in 8 bits (min_8bit_size 0: the kernel's own cost). The optimizers'
// whole steps follow (AdamW vs AdamW8bit at their defaults, the small tensors in f32). Counters: `elements`
// per update, `bytes` the state and parameter traffic (f32 Adam: parameter, gradient and both moments read,
// three written, 28 B an element; 8-bit: 16 B and the scales). Each kernel is first checked: the 8-bit one
// bit for bit against the naive reference (adam8bit_step_reference_cpu), Adam's against a plain loop of its
// formula.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>

#include "core/op_table_optim.h"
#include "frugal.h"
#include "kernels/cpu/reference.h"
#include "optim/adam8bit.h"

namespace {

using namespace frugal;

constexpr int64_t kBlock = 2048;

std::vector<Tensor> w3_parameters() {
  manual_seed(0);
  nn::GPTConfig cfg;
  cfg.vocab = 114;
  nn::GPT gpt(cfg);
  std::vector<Tensor> params;
  for (const Tensor& p : gpt->parameters()) params.push_back(p.detach().clone().requires_grad_());
  Generator g(5);
  for (Tensor& p : params) p.set_grad(randn(p.shape(), {}, &g) * 1e-2);
  return params;
}

// One parameter's buffers for both kernels.
struct Slot {
  Tensor param, grad, exp_avg, exp_avg_sq, codes1, absmax1, codes2, absmax2;
};
std::vector<Slot> slots() {
  std::vector<Slot> s;
  for (const Tensor& p : w3_parameters()) {
    const int64_t n = p.numel(), blocks = (n + kBlock - 1) / kBlock;
    s.push_back({p.detach().clone(), p.grad().clone(), zeros({n}), zeros({n}), zeros({n}, DType::U8),
                 zeros({blocks}), zeros({n}, DType::U8), zeros({blocks})});
  }
  return s;
}

AdamStepArgs adam_args(Slot& s) {
  AdamStepArgs a;
  a.param = s.param.raw_data();
  a.grad = s.grad.raw_data();
  a.exp_avg = s.exp_avg.raw_data();
  a.exp_avg_sq = s.exp_avg_sq.raw_data();
  a.n = s.param.numel();
  a.lr = 1e-3, a.beta1 = 0.9, a.beta2 = 0.999, a.eps = 1e-8, a.weight_decay = 1e-2;
  a.decoupled_weight_decay = true;
  a.step_size = a.lr / (1 - 0.9);
  a.bias_correction2_sqrt = std::sqrt(1 - 0.999);
  return a;
}
Adam8bitStepArgs adam8bit_args(Slot& s, bool float8) {
  Adam8bitStepArgs a;
  a.float8 = float8;
  a.param = s.param.raw_data();
  a.grad = s.grad.raw_data();
  a.exp_avg_codes = static_cast<uint8_t*>(s.codes1.raw_data());
  a.exp_avg_absmax = static_cast<float*>(s.absmax1.raw_data());
  a.exp_avg_sq_codes = static_cast<uint8_t*>(s.codes2.raw_data());
  a.exp_avg_sq_absmax = static_cast<float*>(s.absmax2.raw_data());
  a.n = s.param.numel();
  a.block_size = kBlock;
  a.lr = 1e-3, a.beta1 = 0.9, a.beta2 = 0.999, a.eps = 1e-8, a.weight_decay = 1e-2;
  a.decoupled_weight_decay = true;
  a.step_size = a.lr / (1 - 0.9);
  a.bias_correction2_sqrt = std::sqrt(1 - 0.999);
  return a;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), size_t(a.nbytes())) == 0;
}

// Three steps of the 8-bit kernel and of the reference from the same buffers: equal bit for bit.
bool check_8bit(bool float8) {
  std::vector<Slot> fast = slots(), naive = slots();
  for (int step = 0; step < 3; ++step)
    for (size_t k = 0; k < fast.size(); ++k) {
      op_adam8bit_step.get(kCPU, DType::F32)(adam8bit_args(fast[k], float8));
      adam8bit_step_reference_cpu(DType::F32, adam8bit_args(naive[k], float8));
    }
  for (size_t k = 0; k < fast.size(); ++k)
    if (!same_bytes(fast[k].param, naive[k].param) || !same_bytes(fast[k].codes1, naive[k].codes1) ||
        !same_bytes(fast[k].codes2, naive[k].codes2) || !same_bytes(fast[k].absmax1, naive[k].absmax1) ||
        !same_bytes(fast[k].absmax2, naive[k].absmax2))
      return false;
  return true;
}

// One step of Adam's kernel against its formula (optim/adam.h) in f64, to f32 rounding.
bool check_adam() {
  std::vector<Slot> s = slots();
  for (Slot& slot : s) {
    const std::vector<float> p0 = slot.param.to_vector<float>(), g = slot.grad.to_vector<float>();
    const AdamStepArgs a = adam_args(slot);
    op_adam_step.get(kCPU, DType::F32)(a);
    const float* p = static_cast<const float*>(a.param);
    for (size_t i = 0; i < p0.size(); ++i) {
      const double m = (1 - a.beta1) * g[i], v = (1 - a.beta2) * double(g[i]) * g[i];
      const double want = p0[i] * (1 - a.lr * a.weight_decay) -
                          a.step_size * m / (std::sqrt(v) / a.bias_correction2_sqrt + a.eps);
      if (std::fabs(p[i] - want) > 1e-6 * (1 + std::fabs(want))) return false;
    }
  }
  return true;
}

void set_counters(benchmark::State& state, int64_t elements, double bytes) {
  state.counters["elements"] = double(elements);
  state.counters["bytes"] = bytes;
  state.counters["bytes_per_second"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_AdamKernelF32_W3(benchmark::State& state) {
  if (!check_adam()) return state.SkipWithError("op_adam_step disagrees with Adam's formula");
  std::vector<Slot> s = slots();
  std::vector<AdamStepArgs> args;
  int64_t n = 0;
  for (Slot& slot : s) args.push_back(adam_args(slot)), n += slot.param.numel();
  for (auto _ : state)
    for (const AdamStepArgs& a : args) op_adam_step.get(kCPU, DType::F32)(a);
  set_counters(state, n, double(n) * 28);
}
BENCHMARK(BM_AdamKernelF32_W3)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The dynamic code (BM_Adam8bitKernel_W3) and the float8 codes (BM_Adam8bitFloat8Kernel_W3).
template <bool kFloat8>
void adam8bit_kernel(benchmark::State& state) {
  if (!check_8bit(kFloat8)) return state.SkipWithError("op_adam8bit_step disagrees with the naive reference");
  std::vector<Slot> s = slots();
  std::vector<Adam8bitStepArgs> args;
  int64_t n = 0, blocks = 0;
  for (Slot& slot : s)
    args.push_back(adam8bit_args(slot, kFloat8)), n += slot.param.numel(), blocks += slot.absmax1.numel();
  for (auto _ : state)
    for (const Adam8bitStepArgs& a : args) op_adam8bit_step.get(kCPU, DType::F32)(a);
  set_counters(state, n, double(n) * 16 + double(blocks) * 16);
}
void BM_Adam8bitKernel_W3(benchmark::State& state) { adam8bit_kernel<false>(state); }
void BM_Adam8bitFloat8Kernel_W3(benchmark::State& state) { adam8bit_kernel<true>(state); }
BENCHMARK(BM_Adam8bitKernel_W3)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Adam8bitFloat8Kernel_W3)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The optimizers' whole steps over the same parameters (their loops, checks and small tensors included).
template <typename Opt, typename Options>
void optimizer_step(benchmark::State& state, const Options& options) {
  if (!check_8bit(false) || !check_8bit(true) || !check_adam())
    return state.SkipWithError("a kernel disagrees with its reference");
  std::vector<Tensor> params = w3_parameters();
  Opt opt(params, options);
  int64_t n = 0;
  for (const Tensor& p : params) n += p.numel();
  for (auto _ : state) opt.step();
  state.counters["elements"] = double(n);
  state.counters["state_bytes"] = double(opt.num_state_bytes());
}
void BM_AdamWStep_W3(benchmark::State& state) {
  optimizer_step<optim::AdamW>(state, optim::AdamWOptions(1e-3));
}
void BM_AdamW8bitStep_W3(benchmark::State& state) {
  optimizer_step<optim::AdamW8bit>(state, optim::AdamW8bitOptions(1e-3));
}
void BM_AdamW8bitFloat8Step_W3(benchmark::State& state) {
  optimizer_step<optim::AdamW8bit>(state, optim::AdamW8bitOptions(1e-3).code(optim::Adam8bitCode::Float8));
}
BENCHMARK(BM_AdamWStep_W3)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_AdamW8bitStep_W3)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_AdamW8bitFloat8Step_W3)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

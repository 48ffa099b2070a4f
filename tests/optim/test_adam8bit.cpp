// optim::Adam8bit and AdamW8bit: the fused kernel against the naive reference bit for bit with either code
// (the codes themselves: test_adam8bit_codes.cpp), the state's size in the arena, small parameters exactly
// as Adam, convergence beside f32 AdamW, state dicts and resuming, non-finite gradients, master weights, a
// failed step, and option checks.
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/op_table_optim.h"
#include "frugal.h"
#include "kernels/cpu/reference.h"
#include "kernels/float8_code.h"
#include "optim/adam8bit.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;
namespace F = nn::functional;

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<uint8_t> b(size_t(c.nbytes()));
  if (!b.empty()) std::memcpy(b.data(), c.raw_data(), b.size());
  return b;
}

// One kernel step's buffers: parameter and gradient of dtype t, and the 8-bit state.
struct Buffers {
  Tensor param, grad, codes1, absmax1, codes2, absmax2;
  Buffers clone() const {
    return {param.clone(), grad.clone(), codes1.clone(), absmax1.clone(), codes2.clone(), absmax2.clone()};
  }
  Adam8bitStepArgs args(const Adam8bitStepArgs& base) const {
    Adam8bitStepArgs a = base;
    a.param = param.raw_data();
    a.grad = grad.raw_data();
    a.exp_avg_codes = static_cast<uint8_t*>(codes1.raw_data());
    a.exp_avg_absmax = static_cast<float*>(absmax1.raw_data());
    a.exp_avg_sq_codes = static_cast<uint8_t*>(codes2.raw_data());
    a.exp_avg_sq_absmax = static_cast<float*>(absmax2.raw_data());
    return a;
  }
};

void expect_same_bytes(const Buffers& a, const Buffers& b, const std::string& what) {
  EXPECT_EQ(bytes_of(a.param), bytes_of(b.param)) << what << ": parameter";
  EXPECT_EQ(bytes_of(a.codes1), bytes_of(b.codes1)) << what << ": exp_avg codes";
  EXPECT_EQ(bytes_of(a.absmax1), bytes_of(b.absmax1)) << what << ": exp_avg scales";
  EXPECT_EQ(bytes_of(a.codes2), bytes_of(b.codes2)) << what << ": exp_avg_sq codes";
  EXPECT_EQ(bytes_of(a.absmax2), bytes_of(b.absmax2)) << what << ": exp_avg_sq scales";
}

// The registered kernel against adam8bit_step_reference_cpu, six steps, bit for bit: both codes, every
// dtype, the three kinds of weight decay, block sizes with a short last block, enough blocks to run on
// several threads, and a NaN and an inf gradient element.
void expect_kernel_equals_reference(bool float8, std::vector<DType> dtypes = {DType::F32, DType::F64,
                                                                              DType::BF16, DType::F16}) {
  int64_t subnormal_codes = 0;  // float8: the codes of the last step below 2^M, zero aside
  for (DType t : dtypes)
    for (int decay = 0; decay < 3; ++decay)
      for (int64_t bs : {int64_t(64), int64_t(2048)}) {
        const int64_t n = bs == 64 ? 64 * 7 + 13 : 3 * kGrain + 2048 + 77;
        Buffers fast{testing::uniform({n}, -1, 1, t, 3), zeros({n}, t),         zeros({n}, DType::U8),
                     zeros({(n + bs - 1) / bs}),         zeros({n}, DType::U8), zeros({(n + bs - 1) / bs})};
        Adam8bitStepArgs base;
        base.float8 = float8;
        base.n = n;
        base.block_size = bs;
        base.lr = 1e-2;
        base.beta1 = 0.9;
        base.beta2 = 0.99;
        base.eps = 1e-8;
        base.weight_decay = decay ? 0.1 : 0;
        base.decoupled_weight_decay = decay == 2;
        Buffers naive = fast.clone();
        for (int step = 1; step <= 6; ++step) {
          // Gradients of every scale, some blocks small: the scales and codes vary.
          Tensor g = mul(testing::uniform({n}, -1, 1, DType::F64, uint64_t(20 + step)),
                         exp(testing::uniform({n}, -6, 1, DType::F64, uint64_t(40 + step))));
          if (step == 4) {
            std::vector<double> v = g.to_vector<double>();
            v[5] = std::nan("");
            v[size_t(n - 3)] = INFINITY;
            g = tensor(v);
          }
          fast.grad = g.to(t);
          naive.grad = fast.grad.clone();
          base.step_size = base.lr / (1 - std::pow(base.beta1, step));
          base.bias_correction2_sqrt = std::sqrt(1 - std::pow(base.beta2, step));
          op_adam8bit_step.get(kCPU, t)(fast.args(base));
          adam8bit_step_reference_cpu(t, naive.args(base));
          const std::string what = std::string(float8 ? "float8 " : "dynamic ") + dtype_name(t) + " decay " +
                                   std::to_string(decay) + " block " + std::to_string(bs) + " step " +
                                   std::to_string(step);
          expect_same_bytes(fast, naive, what);
          if (::testing::Test::HasFailure()) return;
        }
        for (uint8_t c : bytes_of(fast.codes1)) subnormal_codes += (c & 0x7f) > 0 && (c & 0x7f) < 8;
        for (uint8_t c : bytes_of(fast.codes2)) subnormal_codes += c > 0 && c < 16;
      }
  if (float8) {
    EXPECT_GT(subnormal_codes, 0) << "the steps reached no subnormal code";
  }
}
TEST(Adam8bitKernel, EqualsTheNaiveReferenceBitForBit) { expect_kernel_equals_reference(false); }
TEST(Adam8bitKernel, Float8EqualsTheNaiveReferenceBitForBit) { expect_kernel_equals_reference(true); }

#if defined(__x86_64__)
// Note [float8 moments with AVX2]: with MXCSR's DAZ set (by a caller) the kernel does not decode through
// f32 subnormals, so the codes below 2^M still decode to their values: the same bytes as the reference.
TEST(Adam8bitKernel, Float8DecodesItsSubnormalsUnderDenormalsAreZero) {
  const unsigned int csr = _mm_getcsr();
  _mm_setcsr(csr | 0x40);
  expect_kernel_equals_reference(true, {DType::F32});  // the dtype with a vector path
  _mm_setcsr(csr);
  // The codes the test reaches include subnormals: a plain decode of 0x01 under DAZ would give 0.
  EXPECT_EQ(float8_code::decode_signed(0x01), std::ldexp(1.0f, -17));
}
#endif

TEST(Adam8bitKernel, MissingDtypeIsAnError) {
  Adam8bitStepArgs args;
  expect_error<DTypeError>([&] { op_adam8bit_step.get(kCPU, DType::I64)(args); },
                           {"adam8bit_step", "i64", "f32"});
}

int64_t optimizer_tagged() {
  for (const auto& t : memory::tag_stats())
    if (t.tag == "optimizer") return t.allocated.current;
  return 0;
}

// Two u8 codes a parameter and two f32 scales a block, measured in the arena under the tag "optimizer"; the
// bias (below min_8bit_size) keeps Adam's two f32 moments.
TEST(Adam8bit, StateIsTwoBytesAParameterPlusScales) {
  constexpr int64_t rows = 256, cols = 512, n = rows * cols, blocks = n / 2048;
  Tensor w = testing::uniform({rows, cols}, -1, 1).requires_grad_();
  Tensor bias = testing::uniform({cols}, -1, 1).requires_grad_();
  const int64_t before = optimizer_tagged();
  optim::AdamW8bit opt({w, bias}, optim::AdamW8bitOptions(1e-3));
  for (Tensor p : {w, bias}) p.set_grad(testing::uniform(p.shape(), -1, 1, DType::F32, 9));
  opt.step();
  const StateDict s = opt.state_dict();
  EXPECT_EQ(s.at("state.0.exp_avg_codes").dtype(), DType::U8);
  EXPECT_EQ(s.at("state.0.exp_avg_codes").shape(), Shape({rows, cols}));
  EXPECT_EQ(s.at("state.0.exp_avg_sq_codes").dtype(), DType::U8);
  EXPECT_EQ(s.at("state.0.exp_avg_absmax").dtype(), DType::F32);
  EXPECT_EQ(s.at("state.0.exp_avg_absmax").shape(), Shape({blocks}));
  EXPECT_EQ(s.at("state.0.exp_avg_sq_absmax").shape(), Shape({blocks}));
  EXPECT_EQ(s.count("state.0.exp_avg"), 0u);
  EXPECT_EQ(s.at("state.1.exp_avg").dtype(), DType::F32);  // 512 < min_8bit_size
  EXPECT_EQ(s.count("state.1.exp_avg_codes"), 0u);
  EXPECT_EQ(s.at("param_groups.0.block_size").item<int64_t>(), 2048);
  EXPECT_EQ(s.at("param_groups.0.min_8bit_size").item<int64_t>(), 4096);
  const int64_t expected = 2 * n + 2 * 4 * blocks + 2 * 4 * cols;
  EXPECT_EQ(opt.num_state_bytes(), expected);
  const int64_t held = optimizer_tagged() - before;
  EXPECT_GE(held, expected);
  EXPECT_LE(held, expected + 6 * 512);  // the arena rounds each of the six tensors up
  std::printf(
      "AdamW8bit state of %lld + %lld parameters: %lld bytes in the arena (%.3f a parameter; "
      "AdamW's: %lld)\n",
      static_cast<long long>(n), static_cast<long long>(cols), static_cast<long long>(held),
      double(held) / double(n + cols), static_cast<long long>(8 * (n + cols)));
}

// Parameters below min_8bit_size are updated by Adam's own kernel with f32 moments: bit for bit Adam's.
TEST(Adam8bit, SmallParametersMatchAdamExactly) {
  auto params_of = [] {
    return std::vector<Tensor>{testing::uniform({3, 4}, -1, 1, DType::F32, 1).requires_grad_(),
                               testing::uniform({63, 64}, -1, 1, DType::F32, 2).requires_grad_()};
  };
  auto run = [&](auto& opt, std::vector<Tensor>& params) {
    for (int t = 1; t <= 5; ++t) {
      for (size_t k = 0; k < params.size(); ++k)
        params[k].set_grad(testing::uniform(params[k].shape(), -1, 1, DType::F32, uint64_t(10 * t + k)));
      opt.step();
    }
  };
  std::vector<Tensor> a = params_of(), b = params_of(), c = params_of(), d = params_of();
  optim::Adam adam(a, optim::AdamOptions(1e-2).weight_decay(0.01));
  optim::Adam8bit adam8(b, optim::Adam8bitOptions(1e-2).weight_decay(0.01));
  optim::AdamW adamw(c, optim::AdamWOptions(1e-2).weight_decay(0.1));
  optim::AdamW8bit adamw8(d, optim::AdamW8bitOptions(1e-2).weight_decay(0.1));
  run(adam, a), run(adam8, b), run(adamw, c), run(adamw8, d);
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(bytes_of(a[k]), bytes_of(b[k])) << "adam parameter " << k;
    EXPECT_EQ(bytes_of(c[k]), bytes_of(d[k])) << "adamw parameter " << k;
  }
  const StateDict sa = adam.state_dict(), sb = adam8.state_dict();
  for (const char* key : {"state.1.exp_avg", "state.1.exp_avg_sq"})
    EXPECT_EQ(bytes_of(sa.at(key)), bytes_of(sb.at(key))) << key;
}

// A noisy regression a small MLP fits (two weight matrices of 8192 and 4096 elements in 8 bits) on more
// samples than it can memorise: 8-bit AdamW ends within 3% of f32 AdamW's loss.
TEST(AdamW8bit, ReachesTheLossOfF32AdamW) {
  const Tensor x = testing::uniform({4096, 64}, -1, 1, DType::F32, 5);
  const Tensor teacher = testing::uniform({64, 2}, -0.5, 0.5, DType::F32, 6);
  const Tensor y = add(tanh(matmul(x, teacher)), testing::uniform({4096, 2}, -0.2, 0.2, DType::F32, 7));
  auto train = [&](bool eight_bit, optim::Adam8bitCode code = optim::Adam8bitCode::Dynamic) {
    manual_seed(11);
    nn::Sequential model;
    model->push_back(nn::Linear(64, 128));
    model->push_back(nn::Tanh());
    model->push_back(nn::Linear(128, 32));
    model->push_back(nn::Tanh());
    // Two outputs: with one, the weight gradient (an m = 1 GEMM) fails in dnnl_sgemm, lda 1 < k (gemm.cpp).
    model->push_back(nn::Linear(32, 2));
    std::unique_ptr<optim::Optimizer> opt;
    if (eight_bit)
      opt = std::make_unique<optim::AdamW8bit>(model->parameters(),
                                               optim::AdamW8bitOptions(3e-3).block_size(256).code(code));
    else
      opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions(3e-3));
    double loss = 0;
    for (int t = 0; t < 300; ++t) {
      opt->zero_grad();
      const Tensor l = F::mse_loss(model->forward(x), y);
      l.backward();
      opt->step();
      loss = l.item<double>();
    }
    if (eight_bit) {
      const char* codes = code == optim::Adam8bitCode::Float8 ? "exp_avg_e4m3" : "exp_avg_codes";
      EXPECT_EQ(opt->state_dict().count(std::string("state.0.") + codes), 1u);  // 64 x 128: in 8 bits
      EXPECT_EQ(opt->state_dict().count(std::string("state.2.") + codes), 1u);  // 128 x 32
    }
    return loss;
  };
  const double f32 = train(false), q8 = train(true), f8 = train(true, optim::Adam8bitCode::Float8);
  std::printf(
      "noisy regression, 300 steps: AdamW loss %.5f, AdamW8bit %.5f (%+.2f%%), float8 %.5f (%+.2f%%)\n", f32,
      q8, 100 * (q8 - f32) / f32, f8, 100 * (f8 - f32) / f32);
  EXPECT_LT(f32, 0.02);  // it learned: the noise alone is 0.0133, the targets' variance about 0.15
  EXPECT_LE(std::fabs(q8 - f32), 0.03 * f32);
  EXPECT_LE(std::fabs(f8 - f32), 0.03 * f32);
}

std::vector<Tensor> resume_params(DType t = DType::F32) {
  return {testing::uniform({64, 100}, -1, 1, t, 1).requires_grad_(),
          testing::uniform({100}, -1, 1, t, 2).requires_grad_()};
}
void set_grads(const std::vector<Tensor>& params, int t) {
  for (size_t k = 0; k < params.size(); ++k)
    params[k].set_grad(
        testing::uniform(params[k].shape(), -1, 1, params[k].dtype(), uint64_t(100 * t + int(k))));
}
std::vector<Tensor> copies(const std::vector<Tensor>& params) {
  std::vector<Tensor> c;
  for (const Tensor& p : params) c.push_back(p.detach().clone().requires_grad_());
  return c;
}

// 20 steps straight, against 10 steps, a state dict, a new optimizer (other options: the dict's come back,
// block_size included) over copies of the parameters, and 10 more: bit-identical parameters and state.
void expect_resumes_bit_for_bit(optim::Adam8bitCode code) {
  const auto opts = optim::AdamW8bitOptions(1e-2).block_size(256).weight_decay(0.05).code(code);
  std::vector<Tensor> straight = resume_params(), resumed = resume_params();
  optim::AdamW8bit a(straight, opts);
  for (int t = 1; t <= 20; ++t) set_grads(straight, t), a.step();
  StateDict saved;
  {
    optim::AdamW8bit first(resumed, opts);
    for (int t = 1; t <= 10; ++t) set_grads(resumed, t), first.step();
    saved = first.state_dict();
  }
  EXPECT_EQ(saved.at("state.0.exp_avg_absmax").shape(), Shape({25}));  // 6400 / 256
  std::vector<Tensor> continued = copies(resumed);
  optim::AdamW8bit second(continued,
                          optim::AdamW8bitOptions(0.5).code(code));  // block_size 2048 until the load
  second.load_state_dict(saved);
  EXPECT_EQ(static_cast<const optim::AdamW8bitOptions&>(second.param_groups()[0].options()).block_size(),
            256);
  for (int t = 11; t <= 20; ++t) set_grads(continued, t), second.step();
  for (size_t k = 0; k < straight.size(); ++k)
    EXPECT_EQ(bytes_of(straight[k]), bytes_of(continued[k])) << "parameter " << k;
  const StateDict sa = a.state_dict(), sb = second.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [key, t] : sa) EXPECT_EQ(bytes_of(t), bytes_of(sb.at(key))) << key;
}
TEST(Adam8bit, ResumesBitForBit) { expect_resumes_bit_for_bit(optim::Adam8bitCode::Dynamic); }
TEST(Adam8bit, ResumesBitForBitWithTheFloat8Codes) {
  expect_resumes_bit_for_bit(optim::Adam8bitCode::Float8);
}

// The float8 codes' state is named by its code, the same size as the dynamic code's; a dict of one code
// does not load into an optimizer of the other.
TEST(Adam8bit, Float8StateIsNamedByItsCodeAndLoadsOnlyIntoItsCode) {
  std::vector<Tensor> params = resume_params();
  optim::AdamW8bit dynamic(params, optim::AdamW8bitOptions().block_size(256));
  optim::AdamW8bit float8(params,
                          optim::AdamW8bitOptions().block_size(256).code(optim::Adam8bitCode::Float8));
  set_grads(params, 1);
  dynamic.step();
  float8.step();
  const StateDict s = float8.state_dict(), d = dynamic.state_dict();
  EXPECT_EQ(s.at("state.0.exp_avg_e4m3").dtype(), DType::U8);
  EXPECT_EQ(s.at("state.0.exp_avg_e4m3").shape(), Shape({64, 100}));
  EXPECT_EQ(s.at("state.0.exp_avg_sq_root_e4m4").dtype(), DType::U8);
  EXPECT_EQ(s.at("state.0.exp_avg_absmax").shape(), Shape({25}));
  EXPECT_EQ(s.at("state.0.exp_avg_sq_root_absmax").shape(), Shape({25}));
  EXPECT_EQ(s.count("state.0.exp_avg_codes"), 0u);
  EXPECT_EQ(s.at("state.1.exp_avg").dtype(), DType::F32);  // 100 < min_8bit_size: Adam's moments
  EXPECT_EQ(float8.num_state_bytes(), dynamic.num_state_bytes());
  // The root's scale is the largest root of exp_avg_sq: after one step from zero, (1 - beta2) g^2's.
  const std::vector<float> g = params[0].grad().to_vector<float>();
  float largest = 0;
  for (size_t i = 0; i < 256; ++i) largest = std::max(largest, std::sqrt(float(1 - 0.999) * (g[i] * g[i])));
  EXPECT_EQ(s.at("state.0.exp_avg_sq_root_absmax").to_vector<float>()[0], largest);
  expect_error<Error>([&] { dynamic.load_state_dict(s); }, {"has no 'state.0.exp_avg_codes'"});
  expect_error<Error>([&] { float8.load_state_dict(d); }, {"has no 'state.0.exp_avg_e4m3'"});
}

TEST(Adam8bit, LoadRejectsStateOfTheWrongShapeOrDtype) {
  std::vector<Tensor> params = resume_params();
  optim::Adam8bit opt(params, optim::Adam8bitOptions().block_size(256));
  set_grads(params, 1);
  opt.step();
  const StateDict good = opt.state_dict();
  StateDict s = good;
  s["state.0.exp_avg_absmax"] = zeros({4});
  expect_error<ShapeError>([&] { opt.load_state_dict(s); },
                           {"Adam8bit.load_state_dict", "'state.0.exp_avg_absmax' has shape [4]", "[25]"});
  s = good;
  s["state.0.exp_avg_codes"] = zeros({64, 100});  // f32 moments where codes belong
  expect_error<DTypeError>([&] { opt.load_state_dict(s); },
                           {"'state.0.exp_avg_codes' is f32", "f32 parameter is u8"});
  EXPECT_EQ(bytes_of(opt.state_dict().at("state.0.exp_avg_codes")),
            bytes_of(good.at("state.0.exp_avg_codes")));  // unchanged
}

// Note [non-finite 8-bit moments]: a NaN gradient element makes its parameter element NaN; the rest of its
// block is updated exactly as if that element's gradient had been 0, and its moment is stored as 0.
void expect_nan_poisons_only_its_element(optim::Adam8bitCode code) {
  std::vector<Tensor> with_nan = resume_params(), with_zero = resume_params();
  optim::Adam8bit a({with_nan[0]}, optim::Adam8bitOptions(1e-2).block_size(256).code(code));
  optim::Adam8bit b({with_zero[0]}, optim::Adam8bitOptions(1e-2).block_size(256).code(code));
  std::vector<double> g = testing::uniform({6400}, -1, 1, DType::F64, 3).to_vector<double>();
  g[300] = std::nan("");
  with_nan[0].set_grad(tensor(g, {64, 100}).to(DType::F32));
  g[300] = 0;
  with_zero[0].set_grad(tensor(g, {64, 100}).to(DType::F32));
  a.step();
  b.step();
  std::vector<float> pa = with_nan[0].to_vector<float>(), pb = with_zero[0].to_vector<float>();
  EXPECT_TRUE(std::isnan(pa[300]));
  pa[300] = pb[300];
  EXPECT_EQ(pa, pb);
  const StateDict sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [key, t] : sa) EXPECT_EQ(bytes_of(t), bytes_of(sb.at(key))) << key;
}
TEST(Adam8bit, NanGradientPoisonsOnlyItsElement) {
  expect_nan_poisons_only_its_element(optim::Adam8bitCode::Dynamic);
}
TEST(Adam8bit, NanGradientPoisonsOnlyItsElementWithTheFloat8Codes) {
  expect_nan_poisons_only_its_element(optim::Adam8bitCode::Float8);
}

// Note [master weights]: bf16 parameters updated through f32 copies follow, in the copies, exactly the f32
// run from the same (bf16-rounded) values and gradients.
TEST(Adam8bit, MasterWeightsFollowTheF32Run) {
  std::vector<Tensor> low = resume_params(DType::BF16), full;
  for (const Tensor& p : low) full.push_back(p.detach().to(DType::F32).requires_grad_());
  optim::AdamW8bit opt_low(low, optim::AdamW8bitOptions(1e-2).master_weights(true));
  optim::AdamW8bit opt_full(full, optim::AdamW8bitOptions(1e-2));
  for (int t = 1; t <= 5; ++t) {
    set_grads(low, t);
    for (size_t k = 0; k < low.size(); ++k) full[k].set_grad(low[k].grad().to(DType::F32));
    opt_low.step();
    opt_full.step();
  }
  const StateDict s = opt_low.state_dict();
  for (size_t k = 0; k < low.size(); ++k) {
    const Tensor master = s.at("state." + std::to_string(k) + ".master");
    EXPECT_EQ(master.dtype(), DType::F32);
    EXPECT_EQ(master.to_vector<float>(), full[k].to_vector<float>()) << k;
    EXPECT_EQ(low[k].to_vector<float>(), full[k].to(DType::BF16).to_vector<float>()) << k;
  }
  EXPECT_EQ(s.at("state.0.exp_avg_codes").dtype(), DType::U8);
  // Without master weights a bf16 parameter is updated in f32 and rounded; its state is the same kind.
  std::vector<Tensor> plain = resume_params(DType::BF16);
  optim::Adam8bit opt_plain(plain, optim::Adam8bitOptions(1e-2));
  set_grads(plain, 1);
  opt_plain.step();
  EXPECT_EQ(opt_plain.state_dict().at("state.1.exp_avg").dtype(), DType::F32);
}

// Note [a failed step changes nothing]: each allocation of a first step made to fail in turn.
TEST(Adam8bit, AFailedStepChangesNothing) {
  auto values = [](const std::vector<Tensor>& params) {
    std::vector<std::vector<float>> v;
    for (const Tensor& p : params) v.push_back(p.to_vector<float>());
    return v;
  };
  std::vector<Tensor> clean = resume_params();
  optim::Adam8bit clean_opt(clean, optim::Adam8bitOptions());
  set_grads(clean, 1);
  clean_opt.step();
  int64_t failures = 0;
  for (int64_t n = 1;; ++n) {
    std::vector<Tensor> params = resume_params();
    optim::Adam8bit opt(params, optim::Adam8bitOptions());
    set_grads(params, 1);
    const auto before = values(params);
    bool failed = false;
    memory::detail::fail_allocation_at(n);
    try {
      opt.step();
    } catch (const OutOfMemoryError&) {
      failed = true;
    }
    memory::detail::fail_allocation_at(0);
    if (!failed) break;
    ++failures;
    EXPECT_EQ(values(params), before) << "allocation " << n;
    EXPECT_EQ(opt.num_state_bytes(), 0) << "allocation " << n;
    opt.step();
    EXPECT_EQ(values(params), values(clean)) << "allocation " << n;
  }
  EXPECT_EQ(failures, 6);  // codes and scales of both moments of the matrix, the bias's two f32 moments
}

TEST(Adam8bit, BadOptionsAreClearErrors) {
  std::vector<Tensor> p = {zeros({2}).requires_grad_()};
  using O = optim::Adam8bitOptions;
  using W = optim::AdamW8bitOptions;
  expect_error<Error>([&] { optim::Adam8bit(p, O().block_size(100)); },
                      {"Adam8bitOptions", "invalid block_size 100", "multiple of 64 in [64, 4096]"});
  expect_error<Error>([&] { optim::Adam8bit(p, O().block_size(0)); }, {"invalid block_size 0"});
  expect_error<Error>([&] { optim::Adam8bit(p, O().block_size(8192)); }, {"invalid block_size 8192"});
  expect_error<Error>([&] { optim::AdamW8bit(p, W().block_size(-64)); },
                      {"AdamW8bitOptions", "invalid block_size -64"});
  expect_error<Error>([&] { optim::Adam8bit(p, O().min_8bit_size(-1)); },
                      {"Adam8bitOptions", "invalid min_8bit_size -1", ">= 0"});
  expect_error<Error>([&] { optim::AdamW8bit(p, W().amsgrad(true)); },
                      {"AdamW8bitOptions", "amsgrad is not supported", "optim::Adam"});
  expect_error<Error>([&] { optim::Adam8bit(p, O(-1)); }, {"Adam8bitOptions", "learning rate -1"});
  expect_error<Error>([&] { optim::Adam8bit(p, O().betas({0.9, 1.0})); }, {"invalid beta2 1"});
  expect_error<Error>([&] { optim::Adam8bit(p, O().eps(-1)); }, {"invalid eps -1"});
  expect_error<Error>([&] { optim::AdamW8bit(p, W().weight_decay(-0.1)); }, {"invalid weight_decay -0.1"});
  // Groups are checked with their own options.
  expect_error<Error>([&] { optim::Adam8bit({optim::ParamGroup(p, O().block_size(65))}, O()); },
                      {"invalid block_size 65"});
}

}  // namespace
}  // namespace frugal

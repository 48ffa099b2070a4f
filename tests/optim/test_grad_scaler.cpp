// amp::GradScaler (optim/grad_scaler.h): the fused check-and-unscale kernel against a naive loop, overflow
// skipping the step and halving the scale, growth after the interval, clipping after unscale_, gradient
// accumulation, state dicts, a disabled scaler, and each misuse error with PyTorch's message.
#include <cmath>
#include <limits>

#include "core/op_table_optim.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::uniform;

// The naive reference: each element converted to f32 (f64 stays f64), multiplied, stored back; found when
// some element is not finite.
template <typename T>
void check_kernel(DType dt) {
  const int64_t n = 3 * parallel_grain() + 17;  // several threads' chunks
  for (int bad_at : {-1, 5, int(2 * parallel_grain() + 3)}) {
    for (float inv : {1.0f / 65536, 1.0f, 0.375f}) {
      Tensor g = uniform({n}, -1000, 1000, dt, uint64_t(bad_at + 7));
      if (bad_at >= 0) g.data<T>()[bad_at] = T(bad_at == 5 ? INFINITY : NAN);
      const Tensor before = g.clone();
      float found = 0;
      UnscaleArgs a;
      a.grad = g.raw_data();
      a.n = n;
      a.inv_scale = inv;
      a.found_inf = &found;
      op_non_finite_check_and_unscale.get(kCPU, dt)(a);
      EXPECT_EQ(found, bad_at >= 0 ? 1.0f : 0.0f) << dtype_name(dt) << " inv " << inv;
      const T* in = before.data<T>();
      const T* out = g.data<T>();
      using C = acc_t<T>;
      for (int64_t i = 0; i < n; ++i) {
        const T expected = T(C(in[i]) * C(inv));
        const double e = double(C(expected)), o = double(C(out[i]));
        if (std::isnan(e))
          ASSERT_TRUE(std::isnan(o)) << i;
        else
          ASSERT_EQ(o, e) << dtype_name(dt) << " at " << i;
      }
    }
  }
}

TEST(GradScalerKernel, MatchesTheNaiveLoop) {
  check_kernel<float>(DType::F32);
  check_kernel<double>(DType::F64);
  check_kernel<Half>(DType::F16);
  check_kernel<BFloat16>(DType::BF16);
}

TEST(GradScalerKernel, FoundInfIsNeverCleared) {
  Tensor g = ones({8});
  float found = 1;
  UnscaleArgs a;
  a.grad = g.raw_data();
  a.n = 8;
  a.found_inf = &found;
  op_non_finite_check_and_unscale.get(kCPU, DType::F32)(a);
  EXPECT_EQ(found, 1.0f);  // an earlier gradient's overflow stays recorded
}

// A linear model y = x w with an MSE loss; w f32.
struct Problem {
  Tensor w = uniform({6, 3}, -0.5, 0.5, DType::F32, 11).requires_grad_();
  Tensor x = uniform({10, 6}, -1, 1, DType::F32, 12);
  Tensor t = uniform({10, 3}, -1, 1, DType::F32, 13);
  Tensor loss() const { return nn::functional::mse_loss(matmul(x, w), t); }
};

TEST(GradScaler, ScalesTheLossAndStepsLikeThePlainOptimizer) {
  Problem a, b;
  optim::SGD opt_a({a.w}, optim::SGDOptions(0.1)), opt_b({b.w}, optim::SGDOptions(0.1));
  amp::GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  for (int i = 0; i < 3; ++i) {
    opt_a.zero_grad();
    const Tensor l = a.loss();
    const Tensor scaled = scaler.scale(l);
    EXPECT_EQ(scaled.item<double>(), l.item<double>() * scaler.get_scale());
    scaled.backward();
    EXPECT_TRUE(scaler.step(opt_a));
    scaler.update();
    opt_b.zero_grad();
    b.loss().backward();
    opt_b.step();
  }
  // Powers of two scale and unscale exactly: the same parameters bit for bit.
  EXPECT_EQ(a.w.to_vector<float>(), b.w.to_vector<float>());
  EXPECT_EQ(scaler.growth_tracker(), 3);
}

TEST(GradScaler, OverflowSkipsTheStepAndHalvesTheScale) {
  Problem p;
  optim::Adam opt({p.w}, optim::AdamOptions(0.1));
  amp::GradScaler scaler;
  scaler.scale(p.loss()).backward();
  {
    NoGradGuard no_grad;
    Tensor g = p.w.grad();
    g.data<float>()[4] = INFINITY;  // an overflow, as f16 would give
  }
  const auto before = p.w.to_vector<float>();
  EXPECT_FALSE(scaler.step(opt));
  EXPECT_EQ(p.w.to_vector<float>(), before);              // untouched
  EXPECT_EQ(opt.state_dict().count("state.0.step"), 0u);  // Adam never ran
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  // The next clean step runs.
  opt.zero_grad();
  scaler.scale(p.loss()).backward();
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_NE(p.w.to_vector<float>(), before);
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  EXPECT_EQ(scaler.growth_tracker(), 1);
}

TEST(GradScaler, NanAlsoCountsAsOverflow) {
  Problem p;
  optim::SGD opt({p.w}, optim::SGDOptions(0.1));
  amp::GradScaler scaler(amp::GradScalerOptions().init_scale(1024).backoff_factor(0.25));
  scaler.scale(p.loss()).backward();
  {
    NoGradGuard no_grad;
    Tensor g = p.w.grad();
    g.data<float>()[0] = NAN;
  }
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 256.0);
}

// Many parameters share one flag per device (Note [one found_inf per device]): an inf or nan in any one of
// them, first, last or in the middle, skips the whole step and backs the scale off; with none, every
// parameter steps.
TEST(GradScaler, ANonFiniteGradientAnywhereAmongManySkipsTheStep) {
  const int kParams = 40;
  for (int bad : {-1, 0, 17, kParams - 1}) {
    std::vector<Tensor> params;
    for (int i = 0; i < kParams; ++i)
      params.push_back(uniform({1 + i % 5, 3}, -1, 1, DType::F32, uint64_t(100 + i)).requires_grad_());
    optim::SGD opt(params, optim::SGDOptions(0.1));
    amp::GradScaler scaler(amp::GradScalerOptions().init_scale(1024));
    Tensor loss = sum(params[0]);
    for (int i = 1; i < kParams; ++i) loss = add(loss, sum(mul(params[size_t(i)], params[size_t(i)])));
    scaler.scale(loss).backward();
    if (bad >= 0) {
      NoGradGuard no_grad;
      Tensor g = params[size_t(bad)].grad();
      g.data<float>()[g.numel() - 1] = bad == 17 ? NAN : INFINITY;
    }
    std::vector<std::vector<float>> before;
    for (const Tensor& p : params) before.push_back(p.to_vector<float>());
    EXPECT_EQ(scaler.step(opt), bad < 0) << "bad parameter " << bad;
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), bad < 0 ? 1024.0 : 512.0) << "bad parameter " << bad;
    for (int i = 0; i < kParams; ++i) {
      if (bad >= 0)
        EXPECT_EQ(params[size_t(i)].to_vector<float>(), before[size_t(i)]) << "parameter " << i;
      else
        EXPECT_NE(params[size_t(i)].to_vector<float>(), before[size_t(i)]) << "parameter " << i;
    }
  }
}

// unscale_ without step(): update() reads the flag itself; the next iteration starts from a clean flag.
TEST(GradScaler, UpdateReadsTheFlagAndTheNextIterationStartsClean) {
  Problem p;
  optim::SGD opt({p.w}, optim::SGDOptions(0.1));
  amp::GradScaler scaler(amp::GradScalerOptions().init_scale(1024));
  scaler.scale(p.loss()).backward();
  {
    NoGradGuard no_grad;
    p.w.grad().data<float>()[2] = INFINITY;
  }
  scaler.unscale_(opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 512.0);
  opt.zero_grad();
  scaler.scale(p.loss()).backward();
  EXPECT_TRUE(scaler.step(opt));  // the last iteration's inf is not carried over
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 512.0);
  EXPECT_EQ(scaler.growth_tracker(), 1);
}

TEST(GradScaler, GrowsAfterTheInterval) {
  Problem p;
  optim::SGD opt({p.w}, optim::SGDOptions(0.01));
  amp::GradScaler scaler(amp::GradScalerOptions().init_scale(8).growth_interval(3).growth_factor(4));
  const double expected[] = {8, 8, 32, 32, 32, 128};
  for (double e : expected) {
    opt.zero_grad();
    scaler.scale(p.loss()).backward();
    scaler.step(opt);
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), e);
  }
  EXPECT_EQ(scaler.growth_tracker(), 0);
  // A scale that would grow past f32's range stays.
  amp::GradScaler big(amp::GradScalerOptions().init_scale(3e38).growth_interval(1));
  opt.zero_grad();
  big.scale(p.loss() * 0.0).backward();
  big.step(opt);
  big.update();
  EXPECT_EQ(big.get_scale(), double(3e38f));
  big.update(4.0);  // set by hand
  EXPECT_EQ(big.get_scale(), 4.0);
}

TEST(GradScaler, ClipAfterUnscale) {
  Problem a, b;
  optim::SGD opt_a({a.w}, optim::SGDOptions(0.1)), opt_b({b.w}, optim::SGDOptions(0.1));
  amp::GradScaler scaler;
  scaler.scale(a.loss()).backward();
  scaler.unscale_(opt_a);
  const double norm_a = optim::clip_grad_norm_({a.w}, 0.05);
  EXPECT_TRUE(scaler.step(opt_a));  // does not unscale a second time
  scaler.update();
  b.loss().backward();
  const double norm_b = optim::clip_grad_norm_({b.w}, 0.05);
  opt_b.step();
  EXPECT_EQ(norm_a, norm_b);
  EXPECT_GT(norm_b, 0.05);  // the clip did act
  EXPECT_EQ(a.w.to_vector<float>(), b.w.to_vector<float>());
}

TEST(GradScaler, GradientAccumulation) {
  Problem a, b;
  optim::Adam opt_a({a.w}, optim::AdamOptions(0.01)), opt_b({b.w}, optim::AdamOptions(0.01));
  amp::GradScaler scaler;
  const Tensor xs[] = {uniform({10, 6}, -1, 1, DType::F32, 40), uniform({10, 6}, -1, 1, DType::F32, 41)};
  for (int step = 0; step < 2; ++step) {
    opt_a.zero_grad();
    opt_b.zero_grad();
    for (const Tensor& x : xs) {  // two micro-batches per step, each half of the loss
      a.x = x;
      b.x = x;
      scaler.scale(a.loss() * 0.5).backward();
      (b.loss() * 0.5).backward();
    }
    EXPECT_TRUE(scaler.step(opt_a));
    scaler.update();
    opt_b.step();
  }
  EXPECT_EQ(a.w.to_vector<float>(), b.w.to_vector<float>());
}

TEST(GradScaler, StateDictRoundTrip) {
  Problem p;
  optim::SGD opt({p.w}, optim::SGDOptions(0.01));
  amp::GradScaler scaler(amp::GradScalerOptions().growth_interval(5).growth_factor(3).backoff_factor(0.125));
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    scaler.scale(p.loss()).backward();
    scaler.step(opt);
    scaler.update();
  }
  scaler.update(1024.0);
  const StateDict s = scaler.state_dict();
  EXPECT_EQ(s.size(), 5u);
  EXPECT_EQ(s.at("scale").item<double>(), 1024.0);
  EXPECT_EQ(s.at("_growth_tracker").item<int64_t>(), 3);
  EXPECT_EQ(s.at("growth_interval").item<int64_t>(), 5);
  amp::GradScaler other;
  other.load_state_dict(s);
  EXPECT_EQ(other.get_scale(), 1024.0);
  EXPECT_EQ(other.growth_tracker(), 3);
  EXPECT_EQ(other.options().growth_factor(), 3.0);
  EXPECT_EQ(other.options().backoff_factor(), 0.125);
  EXPECT_EQ(other.options().growth_interval(), 5);
  // Two more clean steps reach the interval in both.
  for (amp::GradScaler* sc : {&scaler, &other}) {
    for (int i = 0; i < 2; ++i) {
      opt.zero_grad();
      sc->scale(p.loss()).backward();
      sc->step(opt);
      sc->update();
    }
    EXPECT_EQ(sc->get_scale(), 3072.0);
  }
  expect_error<Error>([&] { other.load_state_dict({}); },
                      {"The source state dict is empty, possibly because it was saved from a disabled "
                       "instance of GradScaler."});
  StateDict missing = s;
  missing.erase("growth_factor");
  expect_error<Error>([&] { other.load_state_dict(missing); }, {"no 'growth_factor'"});
  StateDict bad = s;
  bad["backoff_factor"] = scalar_tensor(2.0, DType::F64);
  expect_error<Error>([&] { other.load_state_dict(bad); }, {"The backoff factor must be < 1.0."});
  EXPECT_EQ(other.get_scale(), 3072.0);  // a refused dict changed nothing
}

TEST(GradScaler, DisabledIsANoOp) {
  Problem p;
  optim::SGD opt({p.w}, optim::SGDOptions(0.1));
  amp::GradScaler scaler(amp::GradScalerOptions().enabled(false).growth_factor(0.5));  // not validated
  EXPECT_FALSE(scaler.is_enabled());
  const Tensor l = p.loss();
  EXPECT_TRUE(scaler.scale(l).is_same(l));
  l.backward();
  const auto g = p.w.grad().to_vector<float>();
  scaler.unscale_(opt);
  EXPECT_EQ(p.w.grad().to_vector<float>(), g);
  const auto before = p.w.to_vector<float>();
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_NE(p.w.to_vector<float>(), before);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_TRUE(scaler.state_dict().empty());
  scaler.load_state_dict({});  // no-op
}

TEST(GradScaler, MisuseErrors) {
  Problem p;
  optim::SGD opt({p.w}, optim::SGDOptions(0.1));
  {
    amp::GradScaler scaler;
    p.loss().backward();
    expect_error<Error>([&] { scaler.step(opt); },
                        {"Attempted step but _scale is None.  This may indicate your script did not use "
                         "scaler.scale(loss or outputs) earlier in the iteration."});
    expect_error<Error>([&] { scaler.unscale_(opt); }, {"Attempted unscale_ but _scale is None."});
    expect_error<Error>([&] { scaler.update(); }, {"Attempted update but _scale is None."});
  }
  amp::GradScaler scaler;
  opt.zero_grad();
  scaler.scale(p.loss()).backward();
  expect_error<Error>([&] { scaler.update(); }, {"No inf checks were recorded prior to update."});
  scaler.unscale_(opt);
  expect_error<Error>([&] { scaler.unscale_(opt); },
                      {"unscale_() has already been called on this optimizer since the last update()."});
  scaler.step(opt);
  expect_error<Error>([&] { scaler.unscale_(opt); }, {"unscale_() is being called after step()."});
  expect_error<Error>([&] { scaler.step(opt); }, {"step() has already been called since the last update()."});
  scaler.update();
  // After update() the cycle starts again.
  opt.zero_grad();
  scaler.scale(p.loss()).backward();
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  // No gradient at all.
  opt.zero_grad();
  (void)scaler.scale(p.loss());
  expect_error<Error>([&] { scaler.step(opt); }, {"No inf checks were recorded for this optimizer."});
  // Bad options.
  expect_error<Error>([] { amp::GradScaler s(amp::GradScalerOptions().growth_factor(1.0)); },
                      {"The growth factor must be > 1.0."});
  expect_error<Error>([] { amp::GradScaler s(amp::GradScalerOptions().backoff_factor(1.0)); },
                      {"The backoff factor must be < 1.0."});
  expect_error<Error>([] { amp::GradScaler s(amp::GradScalerOptions().growth_interval(0)); },
                      {"growth_interval"});
}

TEST(GradScaler, RefusesF16GradientsWithoutMasterWeights) {
  Tensor w = uniform({4, 3}, -0.5, 0.5, DType::F16, 21).requires_grad_();
  const Tensor x = uniform({5, 4}, -1, 1, DType::F16, 22);
  auto loss = [&] { return mean(mul(matmul(x, w), matmul(x, w))); };
  {
    optim::Adam opt({w}, optim::AdamOptions(0.01));
    amp::GradScaler scaler(amp::GradScalerOptions().init_scale(256));
    scaler.scale(loss()).backward();
    const auto g = w.grad().to_vector<float>();
    expect_error<DTypeError>([&] { scaler.unscale_(opt); },
                             {"Attempting to unscale FP16 gradients.", "master_weights(true)"});
    EXPECT_EQ(w.grad().to_vector<float>(), g);  // nothing unscaled
    expect_error<DTypeError>([&] { scaler.step(opt); }, {"Attempting to unscale FP16 gradients."});
  }
  w.zero_grad();
  optim::Adam opt({w}, optim::AdamOptions(0.01).master_weights(true));
  amp::GradScaler scaler(amp::GradScalerOptions().init_scale(256));
  scaler.scale(loss()).backward();
  const auto before = w.to_vector<float>();
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_NE(w.to_vector<float>(), before);
  EXPECT_EQ(w.dtype(), DType::F16);
  // bf16 gradients need no master weights (bf16 has f32's range).
  Tensor v = uniform({4, 3}, -0.5, 0.5, DType::BF16, 23).requires_grad_();
  optim::SGD sgd({v}, optim::SGDOptions(0.1));
  amp::GradScaler s2(amp::GradScalerOptions().init_scale(256));
  s2.scale(mean(matmul(x.to(DType::BF16), v))).backward();
  EXPECT_TRUE(s2.step(sgd));
}

TEST(GradScaler, SparseGradientsOfSparseAdam) {
  nn::Embedding emb(nn::EmbeddingOptions(10, 4).sparse(true));
  optim::SparseAdam opt(emb->parameters(), optim::SparseAdamOptions(0.1));
  amp::GradScaler scaler(amp::GradScalerOptions().init_scale(1024));
  const Tensor idx = tensor<int64_t>({2, 5, 5});
  scaler.scale(sum(emb->forward(idx))).backward();
  scaler.unscale_(opt);
  // The sparse values are unscaled in place: row 5 was used twice.
  EXPECT_EQ(autograd::sparse_grad(emb->weight).values.to_vector<float>(),
            std::vector<float>({1, 1, 1, 1, 2, 2, 2, 2}));
  const auto before = emb->weight.to_vector<float>();
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_NE(emb->weight.to_vector<float>(), before);
  // An inf in a sparse gradient skips the step.
  opt.zero_grad();
  scaler.scale(sum(emb->forward(idx))).backward();
  {
    NoGradGuard no_grad;
    Tensor v = autograd::sparse_grad(emb->weight).values;
    v.data<float>()[3] = INFINITY;
  }
  const auto kept = emb->weight.to_vector<float>();
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(emb->weight.to_vector<float>(), kept);
  EXPECT_EQ(scaler.get_scale(), 512.0);
}

}  // namespace
}  // namespace frugal

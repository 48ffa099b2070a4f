// clip_grad_norm_ against PyTorch (tests/fixtures/optim_reference.json): 2-, 1-, 3- and inf-norms, clipping
// and not; and clip_grad_value_.
#include <cmath>

#include "frugal.h"
#include "optim/clip_grad.h"
#include "tests/optim/optim_fixture.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

TEST(ClipGradNorm, MatchesPyTorch) {
  for (const auto& c : testing::optim_reference()["clip_grad_norm"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const double norm_type = c["norm_type"].is_string() ? INFINITY : c["norm_type"].get<double>();
    auto params = testing::fixture_params();
    testing::set_fixture_grads(params, 1, c["grad_scale"]);
    const double total = optim::clip_grad_norm_(params, c["max_norm"], norm_type);
    EXPECT_NEAR(total, c["total_norm"].get<double>(), 1e-12 * c["total_norm"].get<double>());
    for (size_t k = 0; k < params.size(); ++k)
      testing::expect_close(params[k].grad(), c["grads"][k].get<std::vector<double>>(), {1e-14, 1e-12},
                            "grad " + std::to_string(k));
  }
}

TEST(ClipGradNorm, SkipsMissingGradientsAndChecksArguments) {
  auto params = testing::fixture_params();
  EXPECT_EQ(optim::clip_grad_norm_(params, 1.0), 0);
  params[0].set_grad(full({3, 4}, 2.0, DType::F64));
  EXPECT_NEAR(optim::clip_grad_norm_(params, 1.0), std::sqrt(12.0 * 4), 1e-12);
  EXPECT_NEAR(params[0].grad().to_vector<double>()[0], 2.0 / (std::sqrt(48.0) + 1e-6), 1e-12);
  testing::expect_error<Error>([&] { optim::clip_grad_norm_(params, 1.0, 0.0); },
                               {"clip_grad_norm_", "norm_type"});
  testing::expect_error<Error>([&] { optim::clip_grad_norm_(params, -1.0); },
                               {"clip_grad_norm_", "max_norm"});
}

TEST(ClipGradNorm, HalfPrecisionGradients) {
  Tensor p = zeros({1000}, DType::BF16).requires_grad_();
  p.set_grad(full({1000}, 16.0, DType::BF16));  // squares sum past bf16's precision, not f32's
  EXPECT_NEAR(optim::clip_grad_norm_({p}, 1.0), 16.0 * std::sqrt(1000.0), 1e-3);
}

// A large gradient's norm is taken a chunk at a time: the norm is the same (to f64 summation), and the
// temporaries are a chunk's size (2^20 elements: at most its f32 copy, its |x| and |x|^p), not the
// gradient's.
TEST(ClipGradNorm, ALargeGradientsNormTakesChunkSizedTemporaries) {
  constexpr int64_t n = (int64_t(1) << 22) + 12345;  // four chunks and a part
  for (DType dtype : {kF32, kBF16}) {
    for (double norm_type : {2.0, 1.0, 3.0, double(INFINITY)}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " norm " + std::to_string(norm_type));
      Tensor p = zeros({n}, dtype).requires_grad_();
      manual_seed(5);
      p.set_grad(ops::to(randn({n}), dtype));
      const std::vector<double> g = p.grad().to_vector<double>();
      double want = 0;
      for (double x : g)
        want =
            std::isinf(norm_type) ? std::max(want, std::fabs(x)) : want + std::pow(std::fabs(x), norm_type);
      if (!std::isinf(norm_type)) want = std::pow(want, 1 / norm_type);
      memory::reset_peak();
      const int64_t before = memory::stats().allocated.current;
      const double total = optim::clip_grad_norm_({p}, 1e9, norm_type);  // measures, does not clip
      EXPECT_NEAR(total, want, 1e-5 * want);
      EXPECT_LE(memory::stats().allocated.peak - before, 3 * (int64_t(4) << 20) + (64 << 10))
          << "a temporary of the gradient's size";
    }
  }
}

TEST(ClipGradValue, Clamps) {
  Tensor p = zeros({4}, DType::F64).requires_grad_();
  p.set_grad(tensor(std::vector<double>{-3, -0.2, 0.4, 9}));
  optim::clip_grad_value_({p}, 0.5);
  EXPECT_EQ(p.grad().to_vector<double>(), (std::vector<double>{-0.5, -0.2, 0.4, 0.5}));
  testing::expect_error<Error>([&] { optim::clip_grad_value_({p}, -1); }, {"clip_grad_value_", "clip_value"});
}

}  // namespace
}  // namespace frugal

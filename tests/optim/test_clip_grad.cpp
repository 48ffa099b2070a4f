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

TEST(ClipGradValue, Clamps) {
  Tensor p = zeros({4}, DType::F64).requires_grad_();
  p.set_grad(tensor(std::vector<double>{-3, -0.2, 0.4, 9}));
  optim::clip_grad_value_({p}, 0.5);
  EXPECT_EQ(p.grad().to_vector<double>(), (std::vector<double>{-0.5, -0.2, 0.4, 0.5}));
  testing::expect_error<Error>([&] { optim::clip_grad_value_({p}, -1); }, {"clip_grad_value_", "clip_value"});
}

}  // namespace
}  // namespace frugal

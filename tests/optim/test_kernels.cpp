// The fused optimizer kernels (op_sgd_step, op_adam_step, reached through optim::SGD/Adam/AdamW) against
// their composite references: the same update written as several frugal::ops passes in the compute dtype.
#include <cmath>

#include "core/op_table_optim.h"
#include "core/ops.h"
#include "frugal.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

// SGD as torch.optim.SGD writes it, one op per line. p, g, buf in the compute dtype.
struct SgdReference {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
  Tensor buf;
  void step(Tensor& p, Tensor g) {
    if (weight_decay != 0) g = ops::add(g, ops::mul(p, weight_decay));
    if (momentum != 0) {
      buf = buf.defined() ? ops::add(ops::mul(buf, momentum), ops::mul(g, 1 - dampening)) : ops::clone(g);
      g = nesterov ? ops::add(g, ops::mul(buf, momentum)) : buf;
    }
    p = ops::sub(p, ops::mul(g, lr));
  }
};

// Adam / AdamW as torch.optim.Adam / AdamW (non-fused) write them.
struct AdamReference {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad, decoupled;
  Tensor m, v, v_max;
  int64_t t = 0;
  void step(Tensor& p, Tensor g) {
    ++t;
    if (!m.defined()) m = zeros_like(p), v = zeros_like(p), v_max = zeros_like(p);
    if (weight_decay != 0 && !decoupled) g = ops::add(g, ops::mul(p, weight_decay));
    if (weight_decay != 0 && decoupled) p = ops::mul(p, 1 - lr * weight_decay);
    m = ops::add(ops::mul(m, beta1), ops::mul(g, 1 - beta1));
    v = ops::add(ops::mul(v, beta2), ops::mul(ops::mul(g, g), 1 - beta2));
    Tensor used = v;
    if (amsgrad) used = v_max = ops::maximum(v_max, v);
    const double step_size = lr / (1 - std::pow(beta1, double(t)));
    const double bc2_sqrt = std::sqrt(1 - std::pow(beta2, double(t)));
    Tensor denom = ops::add(ops::div(ops::sqrt(used), bc2_sqrt), eps);
    p = ops::sub(p, ops::mul(ops::div(m, denom), step_size));
  }
};

// Parameters big enough to cross the parallel grain, with a tail that is not a multiple of any vector width.
const int64_t kN = 3 * parallel_grain() + 17;

template <typename Ref>
void check_against_reference(optim::Optimizer& opt, Tensor& p, Ref& ref, DType dtype,
                             const std::string& what) {
  Tensor p_ref = p.detach().to(compute_dtype(dtype)).clone();  // not an alias of p
  for (int t = 1; t <= 4; ++t) {
    Tensor g = testing::uniform(p.shape(), -1, 1, dtype, uint64_t(10 + t));
    p.set_grad(g);
    opt.step();
    ref.step(p_ref, g.to(compute_dtype(dtype)));
    p_ref = p_ref.to(dtype).to(compute_dtype(dtype));  // the parameter is stored in its dtype between steps
    testing::expect_close(p, p_ref.to_vector<double>(), testing::tol_for(dtype),
                          what + " step " + std::to_string(t));
  }
}

class FusedKernels : public ::testing::TestWithParam<DType> {};

TEST_P(FusedKernels, SgdMatchesComposite) {
  const DType dtype = GetParam();
  struct Case {
    double momentum, dampening, wd;
    bool nesterov;
  };
  for (Case c : {Case{0, 0, 0, false}, Case{0.9, 0, 1e-2, true}, Case{0.8, 0.3, 0, false},
                 Case{0, 0, 0.1, false}, Case{0.9, 0, 0, false}, Case{0.9, 0, 0, true}}) {
    Tensor p = testing::uniform({kN}, -1, 1, dtype).requires_grad_();
    optim::SGD opt({p}, optim::SGDOptions(0.1)
                            .momentum(c.momentum)
                            .dampening(c.dampening)
                            .weight_decay(c.wd)
                            .nesterov(c.nesterov));
    SgdReference ref{0.1, c.momentum, c.dampening, c.wd, c.nesterov, {}};
    check_against_reference(opt, p, ref, dtype, "sgd momentum " + std::to_string(c.momentum));
  }
}

TEST_P(FusedKernels, AdamMatchesComposite) {
  const DType dtype = GetParam();
  for (bool amsgrad : {false, true})
    for (double wd : {0.0, 0.05}) {
      Tensor p = testing::uniform({kN}, -1, 1, dtype).requires_grad_();
      optim::Adam opt({p}, optim::AdamOptions(1e-2).betas({0.8, 0.9}).weight_decay(wd).amsgrad(amsgrad));
      AdamReference ref{1e-2, 0.8, 0.9, 1e-8, wd, amsgrad, false, {}, {}, {}};
      check_against_reference(opt, p, ref, dtype, "adam amsgrad " + std::to_string(amsgrad));
    }
}

TEST_P(FusedKernels, AdamWMatchesComposite) {
  const DType dtype = GetParam();
  for (bool amsgrad : {false, true}) {
    Tensor p = testing::uniform({kN}, -1, 1, dtype).requires_grad_();
    optim::AdamW opt({p}, optim::AdamWOptions(1e-2).weight_decay(0.1).amsgrad(amsgrad));
    AdamReference ref{1e-2, 0.9, 0.999, 1e-8, 0.1, amsgrad, true, {}, {}, {}};
    check_against_reference(opt, p, ref, dtype, "adamw amsgrad " + std::to_string(amsgrad));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FusedKernels,
                         ::testing::Values(DType::F32, DType::F64, DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(FusedKernels, MissingDtypeIsAnError) {
  AdamStepArgs args;
  testing::expect_error<DTypeError>([&] { op_adam_step.get(kCPU, DType::I64)(args); },
                                    {"adam_step", "i64", "f32"});
}

}  // namespace
}  // namespace frugal

// optim::Adafactor: option checks, the factored state's shapes, and the update as a plain loop over the
// parameter (CPU), following torch.optim.Adafactor's single-tensor code operation by operation.
#include "optim/adafactor.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/half.h"
#include "core/memory_history.h"

namespace frugal::optim {

namespace {

bool factored(const Tensor& param) { return param.dim() >= 2; }

// torch.finfo(dtype).eps: eps1's default, of the dtype the update runs in.
double machine_epsilon(DType dtype) {
  switch (dtype) {
    case DType::F64:
      return std::numeric_limits<double>::epsilon();
    case DType::F16:
      return 0.0009765625;  // 2^-10
    case DType::BF16:
      return 0.0078125;  // 2^-7
    default:
      return std::numeric_limits<float>::epsilon();
  }
}

// What one update needs besides the tensors; the scalars are python floats (f64) in torch too.
struct AdafactorArgs {
  int64_t numel = 0;
  int64_t batches = 1, rows = 1, cols = 1;  // [batches, rows, cols] when factored
  bool factored = false, maximize = false;
  double lr = 0, weight_decay = 0, one_minus_beta2 = 0, rho = 0, eps1 = 0, eps2 = 0, d = 1;
};

// ATen's lerp (self + w (end - self), from the nearer end), in the state's type.
template <typename S>
S lerp(S self, S end, S w) {
  return std::abs(w) < S(0.5) ? std::fma(w, end - self, self) : std::fma(self - end, S(1) - w, end);
}

// One step of param p (T: its dtype) from gradient g, the state in S (the dtype, f32 for f16/bf16): row
// [batches, rows] and col [batches, cols] when factored, else var [numel]. Allocates nothing; every sum
// accumulates in f64 and is rounded to S where torch keeps it as a tensor.
template <typename T, typename S>
void adafactor_step(const AdafactorArgs& a, T* p, const T* g, S* row, S* col, S* var) {
  auto grad_at = [&](int64_t k) { return a.maximize ? -S(g[k]) : S(g[k]); };
  const double sqrt_numel = std::sqrt(double(a.numel));

  // alpha from RMS(P) before weight decay, as torch (param.norm(2).item() / sqrt(numel)).
  double p_sq = 0;
  for (int64_t k = 0; k < a.numel; ++k) p_sq += double(S(p[k])) * double(S(p[k]));
  const double alpha = std::max(a.eps2, double(S(std::sqrt(p_sq))) / sqrt_numel) * a.rho;
  if (a.weight_decay != 0) {
    const S keep = S(1 - a.lr * a.weight_decay);
    for (int64_t k = 0; k < a.numel; ++k) p[k] = T(S(p[k]) * keep);
  }

  const S w = S(a.one_minus_beta2), eps1 = S(a.eps1), eps1_sq = S(a.eps1 * a.eps1);
  const int64_t m = a.rows, n = a.cols;
  // The mean of row_var over the rows of batch b, floored by eps1: V's denominator.
  auto row_mean = [&](int64_t b) {
    double sum = 0;
    for (int64_t i = 0; i < m; ++i) sum += double(row[b * m + i]);
    return std::max(S(sum / double(m)), eps1);
  };
  // U at flat index k (in batch b, row i, column j), recomputed each time it is needed rather than stored.
  auto update_at = [&](int64_t k, int64_t b, int64_t i, int64_t j, S denom) {
    const S v = a.factored ? row[b * m + i] * col[b * n + j] / denom : var[k];
    return grad_at(k) * (S(1) / std::sqrt(std::max(v, eps1_sq)));
  };

  // The second moment, then the sum of U² for the clipping.
  double u_sq = 0;
  if (a.factored) {
    for (int64_t b = 0; b < a.batches; ++b) {
      const int64_t base = b * m * n;
      for (int64_t i = 0; i < m; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < n; ++j)
          sum += double(grad_at(base + i * n + j)) * double(grad_at(base + i * n + j));
        row[b * m + i] = lerp(row[b * m + i], S(sum / double(n)), w);
      }
      // Column sums a block of columns at a time, walking the rows in order (no buffer but the stack's).
      constexpr int64_t kBlock = 16;
      for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
        const int64_t width = std::min(kBlock, n - j0);
        double sum[kBlock] = {};
        for (int64_t i = 0; i < m; ++i)
          for (int64_t jj = 0; jj < width; ++jj) {
            const double x = double(grad_at(base + i * n + j0 + jj));
            sum[jj] += x * x;
          }
        for (int64_t jj = 0; jj < width; ++jj)
          col[b * n + j0 + jj] = lerp(col[b * n + j0 + jj], S(sum[jj] / double(m)), w);
      }
      const S denom = row_mean(b);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          const double u = double(update_at(base + i * n + j, b, i, j, denom));
          u_sq += u * u;
        }
    }
  } else {
    for (int64_t k = 0; k < a.numel; ++k) {
      const S x = grad_at(k);
      var[k] = lerp(var[k], x * x, w);
      const double u = double(update_at(k, 0, 0, 0, S(1)));
      u_sq += u * u;
    }
  }

  const double clip = std::max(1.0, double(S(std::sqrt(u_sq))) / (sqrt_numel * a.d));
  const S scale = S(-alpha / clip);
  if (a.factored) {
    for (int64_t b = 0; b < a.batches; ++b) {
      const S denom = row_mean(b);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          const int64_t k = b * m * n + i * n + j;
          p[k] = T(std::fma(scale, update_at(k, b, i, j, denom), S(p[k])));
        }
    }
  } else {
    for (int64_t k = 0; k < a.numel; ++k) p[k] = T(std::fma(scale, update_at(k, 0, 0, 0, S(1)), S(p[k])));
  }
}

}  // namespace

std::vector<HyperParam> AdafactorOptions::hyperparams() {
  return {
      {"lr", &lr_}, {"beta2_decay", &beta2_decay_},   {"eps1", nullptr, nullptr, &eps1_}, {"eps2", &eps2_},
      {"d", &d_},   {"weight_decay", &weight_decay_}, {"maximize", nullptr, &maximize_}};
}

void AdafactorOptions::validate() const {
  // As torch.optim.Adafactor's checks, and finite.
  FRUGAL_CHECK(std::isfinite(lr_) && lr_ >= 0, "AdafactorOptions: invalid learning rate ", lr_,
               "; it must be finite and >= 0 (it caps the relative step size min(lr, 1/sqrt(t)))");
  FRUGAL_CHECK(std::isfinite(beta2_decay_) && beta2_decay_ <= 0, "AdafactorOptions: invalid beta2_decay ",
               beta2_decay_, "; it must be finite and <= 0 (beta2_t = 1 - t^beta2_decay; -0.8 by default)");
  FRUGAL_CHECK(!eps1_ || (std::isfinite(*eps1_) && *eps1_ >= 0), "AdafactorOptions: invalid eps1 ",
               eps1_.value_or(0), "; it must be finite and >= 0, or unset for the dtype's machine epsilon");
  FRUGAL_CHECK(std::isfinite(eps2_) && eps2_ >= 0, "AdafactorOptions: invalid eps2 ", eps2_,
               "; it must be finite and >= 0");
  FRUGAL_CHECK(std::isfinite(d_) && d_ >= 1, "AdafactorOptions: invalid clipping threshold d ", d_,
               "; it must be finite and >= 1");
  FRUGAL_CHECK(std::isfinite(weight_decay_) && weight_decay_ >= 0, "AdafactorOptions: invalid weight_decay ",
               weight_decay_, "; it must be finite and >= 0");
}

Adafactor::Adafactor(std::vector<Tensor> params, const AdafactorOptions& options)
    : Adafactor(std::vector<ParamGroup>{ParamGroup(std::move(params))}, options) {}
Adafactor::Adafactor(std::vector<ParamGroup> groups, const AdafactorOptions& defaults)
    : Optimizer("Adafactor", std::move(groups), defaults.clone()) {}

std::vector<std::string> Adafactor::state_names(const OptimizerOptions&, const Tensor& param) const {
  if (factored(param)) return {"row_var", "col_var"};
  return {"variance"};
}

Shape Adafactor::state_shape(const OptimizerOptions&, const std::string& name, const Tensor& param) const {
  if (!factored(param) || (name != "row_var" && name != "col_var")) return param.shape();
  Shape shape = param.shape();
  shape[param.dim() - (name == "row_var" ? 1 : 2)] = 1;
  return shape;
}

void Adafactor::check_param(const Tensor& param, int64_t index) const {
  FRUGAL_CHECK_T(DeviceError, param.device().is_cpu() || param.device().is_meta(),
                 "Adafactor.step: parameter ", index, " (shape ", param.shape(), ") is on ", param.device(),
                 "; Adafactor runs on the CPU only for now: keep the parameters there or use optim::Adam");
}

void Adafactor::update(const OptimizerOptions& options, Tensor& param, const Tensor& grad,
                       ParamState& state) {
  memory::OpScope op("adafactor", param);  // Note [op names in the history]
  const auto& o = static_cast<const AdafactorOptions&>(options);
  state.initialized = true;
  ++state.step;
  const double t = double(state.step);
  AdafactorArgs a;
  a.numel = param.numel();
  a.factored = factored(param);
  if (a.factored) {
    a.rows = param.size(-2);
    a.cols = param.size(-1);
    a.batches = a.rows * a.cols == 0 ? 0 : a.numel / (a.rows * a.cols);
  }
  a.maximize = o.maximize();
  a.lr = o.lr();
  a.weight_decay = o.weight_decay();
  a.one_minus_beta2 = std::pow(t, o.beta2_decay());
  a.rho = std::min(o.lr(), 1 / std::sqrt(t));
  a.eps1 = o.eps1().value_or(machine_epsilon(param.dtype()));
  a.eps2 = o.eps2();
  a.d = o.d();
  if (a.numel == 0 || param.device().is_meta()) return;  // a dry run: no arithmetic (core/estimate.h)
  // step() has made the state (Note [a failed step changes nothing]).
  auto state_data = [&](const char* name) { return state.tensors.at(name).raw_data(); };
  auto run = [&](auto* p, auto* s) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    using S = std::remove_pointer_t<decltype(s)>;
    S* row = a.factored ? static_cast<S*>(state_data("row_var")) : nullptr;
    S* col = a.factored ? static_cast<S*>(state_data("col_var")) : nullptr;
    S* var = a.factored ? nullptr : static_cast<S*>(state_data("variance"));
    adafactor_step<T, S>(a, p, static_cast<const T*>(grad.raw_data()), row, col, var);
  };
  switch (param.dtype()) {
    case DType::F32:
      return run(static_cast<float*>(param.raw_data()), static_cast<float*>(nullptr));
    case DType::F64:
      return run(static_cast<double*>(param.raw_data()), static_cast<double*>(nullptr));
    case DType::F16:
      return run(static_cast<Half*>(param.raw_data()), static_cast<float*>(nullptr));
    case DType::BF16:
      return run(static_cast<BFloat16*>(param.raw_data()), static_cast<float*>(nullptr));
    default:
      FRUGAL_ASSERT(false, "Adafactor: parameter of dtype ", dtype_name(param.dtype()),
                    " got past the check for floating dtypes");
  }
}

}  // namespace frugal::optim

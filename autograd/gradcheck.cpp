// gradcheck: one backward pass for v^T J, then central differences of v . fn(x) per input element.
#include "autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "autograd/functions.h"
#include "core/rng.h"

namespace frugal::autograd {

namespace {
// Pointer to element `flat` (row-major over the shape) of a strided f64 cpu tensor.
double* element(const Tensor& t, int64_t flat) {
  int64_t offset = 0;
  for (int d = t.dim() - 1; d >= 0; --d) {
    offset += (flat % t.shape()[d]) * t.strides()[d];
    flat /= t.shape()[d];
  }
  return static_cast<double*>(t.raw_data()) + offset;
}

double projected(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                 const std::vector<Tensor>& inputs, const Tensor& v) {
  NoGradGuard no_grad;
  return ops::sum(ops::mul(fn(inputs), v)).item<double>();
}
}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  GradcheckResult r;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined() || !t.requires_grad()) continue;
    FRUGAL_CHECK_DTYPE(t.dtype() == DType::F64 && t.device().is_cpu(), "gradcheck: input ", i,
                       " must be f64 on the cpu for finite differences to be accurate, got ",
                       dtype_name(t.dtype()), " on ", t.device());
    FRUGAL_CHECK(t.is_leaf(), "gradcheck: input ", i, " must be a leaf (it was produced by ",
                 t.grad_fn_name(), ")");
  }

  // Analytical: v^T J from one backward pass.
  std::vector<Tensor> saved_grads;
  for (const Tensor& t : inputs) {
    saved_grads.push_back(t.defined() ? t.grad() : Tensor());
    if (t.defined()) t.zero_grad();
  }
  Tensor y;
  {
    EnableGradGuard grad_on;
    y = fn(inputs);
  }
  FRUGAL_CHECK(y.defined() && y.requires_grad(),
               "gradcheck: the function's result does not require grad; does it "
               "use an input that requires grad?");
  Generator gen(options.seed);
  const Tensor v = randn(y.shape(), y.dtype(), &gen);
  y.backward(v);
  y = Tensor();

  double worst_excess = 0, worst_element_error = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined() || !t.requires_grad()) continue;
    const Tensor g = t.grad();
    const std::vector<double> analytical =
        g.defined() ? g.to_vector<double>() : std::vector<double>(size_t(t.numel()), 0.0);
    for (int64_t e = 0; e < t.numel(); ++e) {
      double* p = element(t, e);
      const double orig = *p;
      *p = orig + options.eps;
      const double plus = projected(fn, inputs, v);
      *p = orig - options.eps;
      const double minus = projected(fn, inputs, v);
      *p = orig;
      const double numerical = (plus - minus) / (2 * options.eps);
      const double err = std::fabs(analytical[size_t(e)] - numerical);
      // How far past its tolerance this element is (> 1 fails); nan counts as the worst.
      const double excess =
          std::isnan(err) ? INFINITY : err / (options.atol + options.rtol * std::fabs(numerical));
      if (excess > worst_excess || r.input < 0) {
        worst_excess = excess;
        r.input = int(i);
        r.element = e;
        r.analytical = analytical[size_t(e)];
        r.numerical = numerical;
        worst_element_error = err;
      }
      r.worst_error = std::max(r.worst_error, std::isnan(err) ? INFINITY : err);
      if (!(excess <= 1)) r.ok = false;
    }
  }
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined()) inputs[i].set_grad(saved_grads[i]);

  std::ostringstream os;
  os.precision(10);
  os << "gradcheck " << (r.ok ? "passed" : "FAILED") << ": worst element is input " << r.input << ", element "
     << r.element << ": analytical " << r.analytical << " vs numerical " << r.numerical << " (error "
     << worst_element_error << ", tolerance " << options.atol << " + " << options.rtol << " * |numerical|)";
  r.message = os.str();
  return r;
}

}  // namespace frugal::autograd

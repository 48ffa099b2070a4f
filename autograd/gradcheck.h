// Gradient checking: compares the gradients backward() computes with central finite differences, in f64.
//
//   auto r = autograd::gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
//                                {randn({3, 4}, DType::F64).requires_grad_(), randn({4, 2}, DType::F64)});
//   if (!r.ok) std::cerr << r.message;
//
// It checks v^T J for a random v against the finite difference of v . fn(x) element by element: one backward
// pass in all, and any wrong Jacobian entry shows (a random v cancels an error with probability 0).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "../core/tensor.h"

namespace frugal::autograd {

struct GradcheckOptions {
  double eps = 1e-6;   // finite-difference step
  double atol = 1e-7;  // |analytical - numerical| <= atol + rtol * |numerical|
  double rtol = 1e-5;
  uint64_t seed = 0;  // for the random projection v
};

struct GradcheckResult {
  bool ok = true;
  std::string message;   // the worst element, or why the check could not run
  int input = -1;        // where the element furthest past its tolerance is
  int64_t element = -1;  // flat index (row-major) within that input
  double analytical = 0, numerical = 0;
  double worst_error = 0;  // max |analytical - numerical| over all checked elements
};

// Checks every input that requires grad (each must be f64 on the cpu). fn must return a tensor that depends
// on them; it is called 2 * (elements checked) + 1 times.
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

}  // namespace frugal::autograd

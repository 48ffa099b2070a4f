// The cases shared by the fused linear ops' tests (test_linear.cpp, test_linear_relu.cpp): one layer's
// output and gradients through a fused op against its composite, in f32 and f64, over shapes, bias or none,
// leading dims and transposed views of x and the weight.
#pragma once

#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace frugal::testing {

struct LinearCase {
  Shape x_shape;
  int64_t out;
  bool bias, transposed_x, transposed_w;
};

inline std::string name(const LinearCase& c) {
  std::ostringstream s;
  s << c.x_shape << " -> " << c.out << (c.bias ? " bias" : "") << (c.transposed_x ? " x^T view" : "")
    << (c.transposed_w ? " w^T view" : "");
  return s.str();
}

using LinearFn = std::function<Tensor(const Tensor& x, const Tensor& w, const Tensor& b)>;

// y and the gradients of x, weight, bias for a fixed random upstream gradient.
inline std::vector<Tensor> run(const LinearCase& c, DType t, const LinearFn& layer) {
  Tensor x = c.transposed_x ? uniform({c.x_shape[1], c.x_shape[0]}, -2, 2, t, 1).t()
                            : uniform(c.x_shape, -2, 2, t, 1);
  const int64_t in = c.x_shape.back();
  Tensor w = c.transposed_w ? uniform({in, c.out}, -1, 1, t, 2).t() : uniform({c.out, in}, -1, 1, t, 2);
  Tensor b = c.bias ? uniform({c.out}, -1, 1, t, 3) : Tensor();
  x = x.detach().requires_grad_();
  w = w.detach().requires_grad_();
  if (b.defined()) b.requires_grad_();
  const Tensor y = layer(x, w, b);
  y.backward(uniform(y.shape(), -1, 1, t, 4));
  return {y.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : Tensor()};
}

// The fused op's output and gradients against the composite's, for every case, in f32 and f64.
inline void expect_matches_composite(const std::vector<LinearCase>& cases, const LinearFn& fused,
                                     const LinearFn& composite) {
  for (const LinearCase& c : cases)
    for (DType t : {DType::F32, DType::F64}) {
      const auto got = run(c, t, fused), ref = run(c, t, composite);
      const char* names[] = {"y", "dx", "dweight", "dbias"};
      const Tol tol = t == DType::F64 ? Tol{1e-12, 1e-12} : Tol{1e-5, 1e-5};
      for (size_t i = 0; i < got.size(); ++i) {
        const std::string what = name(c) + " " + dtype_name(t) + " " + names[i];
        ASSERT_EQ(got[i].defined(), ref[i].defined()) << what;
        if (!got[i].defined()) continue;
        EXPECT_EQ(got[i].shape(), ref[i].shape()) << what;
        EXPECT_EQ(got[i].dtype(), t) << what;
        expect_close(got[i], ref[i].to_vector<double>(), tol, what);
      }
    }
}

}  // namespace frugal::testing

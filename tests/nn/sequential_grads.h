// What the fused layers' tests (test_linear_relu.cpp, test_conv_relu.cpp) compare between a Sequential that
// fuses its pairs and one that runs them apart: the output and every parameter's gradient.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "nn/containers.h"
#include "tests/test_util.h"

namespace frugal::testing {

// Runs sum(net(x) * w) backward for a fixed random w (the output into y_out when given) and returns each
// parameter's gradient, in net.parameters() order.
inline std::vector<Tensor> sequential_grads(nn::SequentialImpl& net, const Tensor& x,
                                            Tensor* y_out = nullptr) {
  net.zero_grad();
  const Tensor y = net.forward(x);
  if (y_out) *y_out = y.detach();
  sum(mul(y, uniform(y.shape(), -1, 1, DType::F32, 31))).backward();
  std::vector<Tensor> g;
  for (const Tensor& p : net.parameters()) g.push_back(p.grad());
  return g;
}

// Expects `fused` and `plain` (the same layers, run fused and apart) to give the same output and parameter
// gradients on x within tol; returns fused's gradients.
inline std::vector<Tensor> expect_nets_agree(nn::SequentialImpl& fused, nn::SequentialImpl& plain,
                                             const Tensor& x, Tol tol) {
  Tensor y_fused, y_plain;
  const auto g_fused = sequential_grads(fused, x, &y_fused), g_plain = sequential_grads(plain, x, &y_plain);
  expect_close(y_fused, y_plain.to_vector<double>(), tol, "Sequential output");
  EXPECT_EQ(g_fused.size(), g_plain.size());
  for (size_t i = 0; i < std::min(g_fused.size(), g_plain.size()); ++i)
    expect_close(g_fused[i], g_plain[i].to_vector<double>(), tol, "parameter " + std::to_string(i));
  return g_fused;
}

}  // namespace frugal::testing

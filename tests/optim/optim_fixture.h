// The PyTorch reference of tests/fixtures/optim_reference.json (written by tests/fixtures/gen_optim.py) and
// the inputs it was computed from: the same formulas, evaluated in the same order as the script.
#pragma once

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "frugal.h"

namespace frugal::testing {

inline const nlohmann::json& optim_reference() {
  static const nlohmann::json j = [] {
    const std::string path = std::string(FRUGAL_FIXTURES_DIR) + "/optim_reference.json";
    std::ifstream in(path);
    if (!in)
      throw std::runtime_error("cannot open " + path + "; regenerate it with tests/fixtures/gen_optim.py");
    return nlohmann::json::parse(in);
  }();
  return j;
}

inline const std::vector<Shape> kFixtureShapes = {Shape{3, 4}, Shape{5}};

inline double fixture_initial_param(int k, int64_t i) {
  return k == 0 ? std::sin(double(i) + 1.0) : std::cos(0.5 * double(i)) - 0.25;
}
inline double fixture_grad(int t, int k, int64_t i) {
  return 0.5 * std::sin(0.7 * double(t) + 1.3 * double(i) + 2.1 * double(k)) + 0.05 * double(k);
}

// The two fixture parameters (leaves that require grad) in dtype t.
inline std::vector<Tensor> fixture_params(DType t = DType::F64) {
  std::vector<Tensor> params;
  for (int k = 0; k < 2; ++k) {
    std::vector<double> v(size_t(kFixtureShapes[size_t(k)].numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = fixture_initial_param(k, int64_t(i));
    params.push_back(tensor(v, kFixtureShapes[size_t(k)]).to(t).requires_grad_());
  }
  return params;
}

// Sets the gradients of step t (1-based), scaled.
inline void set_fixture_grads(const std::vector<Tensor>& params, int t, double scale = 1.0) {
  for (int k = 0; k < int(params.size()); ++k) {
    const Tensor& p = params[size_t(k)];
    std::vector<double> v(size_t(p.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = scale * fixture_grad(t, k, int64_t(i));
    p.set_grad(tensor(v, p.shape()).to(p.dtype()));
  }
}

}  // namespace frugal::testing

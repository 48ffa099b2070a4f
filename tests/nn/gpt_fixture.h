// Deterministic GPT weights shared with the PyTorch fixture scripts (tests/fixtures/gen_gpt_golden.py and
// gen_chargpt_golden.py): parameter number s (in the fixture's "params" order) with last dim f has element i
//   u = ((i * 2654435761 + s * 40503) mod 2^32) / 2^32,  w = (2u - 1) / sqrt(f)   (f64, stored as f32),
// plus 1 for LayerNorm weights.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "frugal.h"

namespace frugal::testing {

inline void fill_gpt_hashed(nn::Module& gpt, const std::vector<std::string>& names) {
  const auto params = gpt.named_parameters();
  ASSERT_EQ(names.size(), params.size());
  for (size_t s = 0; s < names.size(); ++s) {
    const auto it =
        std::find_if(params.begin(), params.end(), [&](const auto& p) { return p.first == names[s]; });
    ASSERT_NE(it, params.end()) << "no parameter " << names[s];
    Tensor p = it->second;
    std::vector<double> w(size_t(p.numel()));
    const double fan_in = double(p.size(-1));
    const bool layer_norm_weight = names[s].find("ln") != std::string::npos && names[s].ends_with("weight");
    for (size_t i = 0; i < w.size(); ++i) {
      const double u =
          double((uint64_t(i) * 2654435761ull + uint64_t(s) * 40503ull) % (1ull << 32)) / 4294967296.0;
      w[i] = double(float((2 * u - 1) / std::sqrt(fan_in))) + (layer_norm_weight ? 1 : 0);
    }
    NoGradGuard no_grad;
    ops::copy_(p, tensor(w, p.shape()));
  }
}

}  // namespace frugal::testing

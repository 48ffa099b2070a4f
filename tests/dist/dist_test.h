// The dist suites run twice: as every suite (one process: a world of one), and under `mpirun -np 2`
// (tests/CMakeLists.txt), where every rank runs every test in the same order, so the collectives match.
// dist::init() runs before the first test and dist::finalize() after the last.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "dist/dist.h"

namespace frugal::testing {

class DistEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { dist::init(); }
  void TearDown() override { dist::finalize(); }
};

inline const bool kDistEnvironment = [] {
  ::testing::AddGlobalTestEnvironment(new DistEnvironment);  // gtest owns it
  return true;
}();

// Every rank's copy of t's values, gathered: equal on every rank when the ranks agree.
inline std::vector<std::vector<float>> values_of_every_rank(const Tensor& t) {
  const Tensor all = dist::all_gather(t.reshape({-1}).to(DType::F32).contiguous());
  std::vector<std::vector<float>> out;
  const int64_t n = t.numel();
  for (int r = 0; r < dist::world_size(); ++r) out.push_back(all.narrow(0, r * n, n).to_vector<float>());
  return out;
}

}  // namespace frugal::testing

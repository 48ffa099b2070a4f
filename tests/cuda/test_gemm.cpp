// CUDA GEMM (cuBLASLt) against the CPU: f32, f16 and bf16, odd and tensor-core-friendly sizes, transposed and
// misaligned operands, batches with and without broadcasting, 1-D operands, more shapes than the plan cache
// keeps, and the backward of a linear layer. The CPU computes f16/bf16 products in f32 and rounds once, as
// the GPU accumulates. Skipped without a GPU.
#include <cmath>

#include "tests/cuda/gpu_test.h"

namespace frugal {
namespace {

using testing::expect_gpu_matches_cpu;
using testing::GpuTest;
using testing::tol_for;
using testing::uniform;

using Gemm = GpuTest;
using Inputs = std::vector<Tensor>;

// Products of k terms: f32 sums in another order differ by about sqrt(k) ulps of the terms.
testing::Tol gemm_tol(DType t, int64_t k) {
  if (t == DType::F32) return {2e-6 * std::sqrt(double(k)), 1e-5};
  return tol_for(t);
}

TEST_F(Gemm, MatricesOfEveryShapeAndLayoutMatchTheCpu) {
  const int64_t sizes[][3] = {{1, 1, 1},     {3, 5, 7},       {17, 33, 65},
                              {64, 128, 32}, {257, 100, 129}, {1, 300, 257}};
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    for (const auto& s : sizes) {
      const int64_t m = s[0], k = s[1], n = s[2];
      const Tensor a = uniform({m, k}, -1, 1, t, 41), b = uniform({k, n}, -1, 1, t, 42);
      const Tensor at = uniform({k, m}, -1, 1, t, 43), bt = uniform({n, k}, -1, 1, t, 44);
      const std::string what = std::string(dtype_name(t)) + " " + std::to_string(m) + "x" +
                               std::to_string(k) + "x" + std::to_string(n);
      const testing::Tol tol = gemm_tol(t, k);
      expect_gpu_matches_cpu([](const Inputs& in) { return ops::matmul(in[0], in[1]); }, {a, b}, tol, what);
      expect_gpu_matches_cpu([](const Inputs& in) { return ops::matmul(in[0].t(), in[1]); }, {at, b}, tol,
                             what + " A^T");
      expect_gpu_matches_cpu([](const Inputs& in) { return ops::matmul(in[0], in[1].t()); }, {a, bt}, tol,
                             what + " B^T");
      expect_gpu_matches_cpu([](const Inputs& in) { return ops::matmul(in[0].t(), in[1].t()); }, {at, bt},
                             tol, what + " A^T B^T");
    }
  }
}

// More distinct problems than the per-device plan cache keeps (kernels/cuda/gemm.cu, 256), then the first
// ones again: evicted plans are made anew, kept ones reused, and every product still matches the CPU.
TEST_F(Gemm, MoreShapesThanThePlanCacheHoldsMatchTheCpu) {
  const Tensor a = uniform({9, 300}, -1, 1, DType::F32, 45), b = uniform({300, 7}, -1, 1, DType::F32, 46);
  const Tensor ag = a.to(testing::kGpu), bg = b.to(testing::kGpu);
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t k = 1; k <= 300; ++k) {
      const Tensor want = ops::matmul(a.narrow(1, 0, k), b.narrow(0, 0, k));
      const Tensor got = ops::matmul(ag.narrow(1, 0, k), bg.narrow(0, 0, k));
      testing::expect_close(got.to(kCPU), want.to_vector<double>(), gemm_tol(DType::F32, k),
                            "pass " + std::to_string(pass) + " k " + std::to_string(k));
    }
  }
}

TEST_F(Gemm, MisalignedViewsAndVectors) {
  for (DType t : {DType::F32, DType::BF16}) {
    const Tensor a = uniform({40, 65}, -1, 1, t, 45), b = uniform({65, 48}, -1, 1, t, 46);
    // Starting one element in: the pointers lose their 16-byte alignment; the row strides stay.
    expect_gpu_matches_cpu(
        [](const Inputs& in) { return ops::matmul(in[0].narrow(1, 1, 64), in[1].narrow(0, 1, 64)); }, {a, b},
        gemm_tol(t, 64), std::string("misaligned ") + dtype_name(t));
    const Tensor v = uniform({65}, -1, 1, t, 47);
    expect_gpu_matches_cpu([](const Inputs& in) { return ops::matmul(in[0], in[1]); }, {a, v},
                           gemm_tol(t, 65), "matrix @ vector");
    expect_gpu_matches_cpu([](const Inputs& in) { return ops::matmul(in[1], in[0]); }, {b, v},
                           gemm_tol(t, 65), "vector @ matrix");
    expect_gpu_matches_cpu([](const Inputs& in) { return ops::matmul(in[0], in[0]); }, {v}, gemm_tol(t, 65),
                           "dot");
  }
}

TEST_F(Gemm, BatchesWithAndWithoutBroadcasting) {
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    const Tensor a = uniform({3, 4, 17, 24}, -1, 1, t, 48), b = uniform({3, 4, 24, 9}, -1, 1, t, 49);
    const Tensor w = uniform({24, 9}, -1, 1, t, 50), a1 = uniform({4, 1, 17, 24}, -1, 1, t, 51);
    const std::string name = dtype_name(t);
    expect_gpu_matches_cpu([](const Inputs& in) { return ops::matmul(in[0], in[1]); }, {a, b},
                           gemm_tol(t, 24), "batched " + name);
    expect_gpu_matches_cpu([](const Inputs& in) { return ops::matmul(in[0], in[1]); }, {a, w},
                           gemm_tol(t, 24), "batched @ shared weight " + name);
    expect_gpu_matches_cpu([](const Inputs& in) { return ops::matmul(in[0], in[1].transpose(-1, -2)); },
                           {a, uniform({3, 4, 9, 24}, -1, 1, t, 52)}, gemm_tol(t, 24), "batched B^T " + name);
    expect_gpu_matches_cpu([](const Inputs& in) { return ops::matmul(in[0], in[1]); },
                           {a1, uniform({3, 24, 9}, -1, 1, t, 53)}, gemm_tol(t, 24),
                           "broadcast batch " + name);
  }
}

TEST_F(Gemm, LinearLayerForwardAndBackward) {
  for (DType t : {DType::F32, DType::BF16}) {
    auto run = [&](Device d) {
      manual_seed(9);
      nn::Linear layer(48, 33);
      layer->to(t);
      layer->to(d);
      const Tensor x = uniform({16, 48}, -1, 1, t, 54).to(d).detach().requires_grad_();
      const Tensor y = layer->forward(x);
      (y * y).sum().backward();
      return std::vector<Tensor>{y.to(kCPU), x.grad().to(kCPU), layer->weight.grad().to(kCPU),
                                 layer->bias.grad().to(kCPU)};
    };
    const auto cpu = run(kCPU), gpu = run(testing::kGpu);
    const char* names[] = {"y", "dx", "dweight", "dbias"};
    for (size_t i = 0; i < cpu.size(); ++i)
      testing::expect_close(gpu[i], cpu[i].to_vector<double>(),
                            t == DType::F32 ? testing::Tol{1e-4, 1e-5} : tol_for(t),
                            std::string("linear ") + names[i] + " " + dtype_name(t));
  }
}

}  // namespace
}  // namespace frugal

// CUDA reductions, softmax / log-softmax and the fused cross-entropy against the CPU on random inputs:
// every dim set (row, column and chunked paths), non-contiguous inputs, f32/f16/bf16 and the integer sums.
// Skipped without a GPU.
#include "tests/cuda/gpu_test.h"

namespace frugal {
namespace {

using testing::expect_gpu_matches_cpu;
using testing::GpuTest;
using testing::tol_for;
using testing::uniform;

using Reduce = GpuTest;
using Inputs = std::vector<Tensor>;

// Sums of many elements: both sides round differently; allow for it.
testing::Tol sum_tol(DType t) { return t == DType::F32 ? testing::Tol{1e-4, 1e-5} : tol_for(t); }

TEST_F(Reduce, EveryDimSetAndDtypeMatchesTheCpu) {
  const std::vector<Shape> dim_sets = {{}, {0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1}};
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    const Tensor x = uniform({7, 33, 65}, -2, 3, t, 21);
    for (const Shape& dims : dim_sets) {
      const std::string what = std::string(dtype_name(t)) + " dims " + detail::str_cat(dims);
      expect_gpu_matches_cpu([&](const Inputs& in) { return ops::sum(in[0], dims); }, {x}, sum_tol(t),
                             "sum " + what);
      expect_gpu_matches_cpu([&](const Inputs& in) { return ops::mean(in[0], dims, true); }, {x}, sum_tol(t),
                             "mean " + what);
      expect_gpu_matches_cpu([&](const Inputs& in) { return ops::max(in[0], dims); }, {x}, {0, 0},
                             "max " + what);
      expect_gpu_matches_cpu([&](const Inputs& in) { return ops::min(in[0], dims); }, {x}, {0, 0},
                             "min " + what);
      expect_gpu_matches_cpu([&](const Inputs& in) { return ops::var(in[0], dims); }, {x}, sum_tol(t),
                             "var " + what);
      expect_gpu_matches_cpu([&](const Inputs& in) { return ops::sum(in[0].transpose(0, 2), dims); }, {x},
                             sum_tol(t), "sum of a transposed view " + what);
    }
    for (int64_t d = 0; d < 3; ++d) {
      expect_gpu_matches_cpu([&](const Inputs& in) { return ops::argmax(in[0], d); }, {x}, {0, 0}, "argmax");
      expect_gpu_matches_cpu([&](const Inputs& in) { return ops::argmin(in[0], d, true); }, {x}, {0, 0},
                             "argmin");
    }
  }
}

TEST_F(Reduce, LongAndColumnReductionsSplitIntoChunks) {
  // One output of 3 million elements, a column sum of a tall matrix (a bias gradient), few long rows.
  const Tensor flat = uniform({3000001}, -1, 1, DType::F32, 22);
  expect_gpu_matches_cpu([](const Inputs& in) { return ops::sum(in[0]); }, {flat}, {2e-3, 1e-5},
                         "sum of all");
  expect_gpu_matches_cpu([](const Inputs& in) { return ops::max(in[0]); }, {flat}, {0, 0}, "max of all");
  expect_gpu_matches_cpu([](const Inputs& in) { return ops::argmin(in[0]); }, {flat}, {0, 0},
                         "argmin of all");
  expect_gpu_matches_cpu([](const Inputs& in) { return ops::var(in[0]); }, {flat}, {1e-6, 1e-5},
                         "var of all");
  const Tensor tall = uniform({20000, 40}, -1, 1, DType::BF16, 23);
  expect_gpu_matches_cpu([](const Inputs& in) { return ops::sum(in[0], {0}); }, {tall}, {5e-2, 1.6e-2},
                         "column sum");
  const Tensor rows = uniform({3, 400000}, -1, 1, DType::F16, 24);
  expect_gpu_matches_cpu([](const Inputs& in) { return ops::sum(in[0], {1}); }, {rows}, {0.5, 2e-3},
                         "long rows");
}

TEST_F(Reduce, IntegerAndBoolSumsAndExtremes) {
  for (DType t : {DType::I64, DType::I32, DType::U8, DType::Bool}) {
    const Tensor x = uniform({9, 130}, 0, 100, DType::F64, 25).to(t);
    expect_gpu_matches_cpu([](const Inputs& in) { return ops::sum(in[0], {1}); }, {x}, {0, 0}, dtype_name(t));
    expect_gpu_matches_cpu([](const Inputs& in) { return ops::sum(in[0]); }, {x}, {0, 0}, dtype_name(t));
    expect_gpu_matches_cpu([](const Inputs& in) { return ops::max(in[0], {0}); }, {x}, {0, 0}, dtype_name(t));
    expect_gpu_matches_cpu([](const Inputs& in) { return ops::argmax(in[0], 1); }, {x}, {0, 0},
                           dtype_name(t));
  }
  // An empty reduction sums to zero.
  expect_gpu_matches_cpu([](const Inputs& in) { return ops::sum(in[0], {1}); }, {zeros({4, 0})}, {0, 0},
                         "empty");
}

TEST_F(Reduce, SoftmaxAndLogSoftmaxMatchTheCpu) {
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    for (const Shape& shape : {Shape{13, 7}, Shape{5, 3000}, Shape{4, 9, 130}}) {
      const Tensor x = uniform(shape, -20, 20, t, 26);
      for (int64_t d : {int64_t(-1), int64_t(0)}) {
        const std::string what =
            std::string(dtype_name(t)) + " " + detail::str_cat(shape) + " dim " + std::to_string(d);
        expect_gpu_matches_cpu([&](const Inputs& in) { return ops::softmax(in[0], d); }, {x}, tol_for(t),
                               "softmax " + what);
        expect_gpu_matches_cpu([&](const Inputs& in) { return ops::log_softmax(in[0], d); }, {x},
                               t == DType::F32 ? testing::Tol{1e-5, 1e-5} : tol_for(t),
                               "log_softmax " + what);
      }
    }
  }
  // Masked entries (-inf) take no probability.
  Tensor masked = uniform({6, 50}, -3, 3, DType::F32, 27);
  masked.narrow(1, 10, 20).fill_(-INFINITY);
  expect_gpu_matches_cpu([](const Inputs& in) { return ops::softmax(in[0], 1); }, {masked}, {1e-6, 1e-5},
                         "masked");
}

// The fused op, forward and backward, through nn::functional and autograd on each device.
TEST_F(Reduce, FusedCrossEntropyForwardAndBackwardMatchTheCpu) {
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t classes : {int64_t(10), int64_t(5003)}) {
      for (double eps : {0.0, 0.1}) {
        const Tensor logits = uniform({37, classes}, -4, 4, t, 28);
        Tensor target = uniform({37}, 0, double(classes), DType::F64, 29).to(DType::I64);
        target.narrow(0, 5, 2).fill_(-100);  // ignored rows
        auto run = [&](Device d) {
          const Tensor x = logits.to(d).detach().requires_grad_();
          const Tensor loss =
              nn::functional::cross_entropy(x, target.to(d), nn::functional::Reduction::Mean, -100, eps);
          loss.backward();
          return std::make_pair(loss.to(kCPU), x.grad().to(kCPU));
        };
        const auto [loss_cpu, grad_cpu] = run(kCPU);
        const auto [loss_gpu, grad_gpu] = run(testing::kGpu);
        const std::string what = std::string(dtype_name(t)) + " classes " + std::to_string(classes) +
                                 " eps " + std::to_string(eps);
        testing::expect_close(loss_gpu, loss_cpu.to_vector<double>(), sum_tol(t), "loss " + what);
        testing::expect_close(grad_gpu, grad_cpu.to_vector<double>(),
                              t == DType::F32 ? testing::Tol{1e-7, 1e-5} : tol_for(t), "grad " + what);
      }
    }
  }
}

}  // namespace
}  // namespace frugal

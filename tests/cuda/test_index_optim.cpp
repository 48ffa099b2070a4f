// CUDA index ops (index_select, gather, scatter_add, the embedding forward and backward, dense and sparse)
// and the fused optimizer steps (SGD, Adam, AdamW, Adam8bit, AdamW8bit, SparseAdam) against the CPU, and the
// GradScaler's per-device overflow flags. Skipped without a GPU.
#include <algorithm>
#include <climits>

#include "tests/cuda/gpu_test.h"

namespace frugal {
namespace {

using testing::expect_gpu_matches_cpu;
using testing::GpuTest;
using testing::tol_for;
using testing::uniform;

using IndexOptim = GpuTest;
using Inputs = std::vector<Tensor>;

TEST_F(IndexOptim, IndexSelectGatherScatterAddMatchTheCpu) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32}) {
    const Tensor x = uniform({6, 11, 9}, -3, 3, DType::F64, 31).to(t);
    const Tensor idx = tensor<int64_t>({3, 0, 10, 3, -1, 7});  // repeats and a negative index
    expect_gpu_matches_cpu([&](const Inputs& in) { return ops::index_select(in[0], 1, in[1]); }, {x, idx},
                           {0, 0}, std::string("index_select ") + dtype_name(t));
    const Tensor small = tensor<int64_t>({1, 0, 5, 1});
    expect_gpu_matches_cpu([&](const Inputs& in) { return ops::index_select(in[0], 0, in[1]); }, {x, small},
                           {0, 0}, "index_select dim 0");
    const Tensor gidx = uniform({6, 4, 9}, 0, 11, DType::F64, 32).to(DType::I64);
    expect_gpu_matches_cpu([&](const Inputs& in) { return ops::gather(in[0], 1, in[1]); }, {x, gidx}, {0, 0},
                           std::string("gather ") + dtype_name(t));
    const Tensor src = uniform({6, 4, 9}, -2, 2, DType::F64, 33).to(t);
    // Duplicate indices accumulate; f16/bf16 round at every addition, in an order the GPU does not fix.
    expect_gpu_matches_cpu([&](const Inputs& in) { return ops::scatter_add(in[0], 1, in[1], in[2]); },
                           {x, gidx, src}, is_floating(t) ? tol_for(t) : testing::Tol{0, 0},
                           std::string("scatter_add ") + dtype_name(t));
  }
}

TEST_F(IndexOptim, EmbeddingForwardAndBackwardMatchTheCpu) {
  for (bool sparse : {false, true}) {
    for (DType t : {DType::F32, DType::BF16}) {
      const Tensor weight = uniform({50, 24}, -1, 1, t, 34);
      const Tensor ids = uniform({7, 13}, 0, 50, DType::F64, 35).to(DType::I64);
      const Tensor dy = uniform({7, 13, 24}, -1, 1, t, 36);
      auto run = [&](Device d) {
        const Tensor w = weight.to(d).detach().requires_grad_();
        const Tensor y = nn::functional::embedding(ids.to(d), w, std::nullopt, sparse);
        (y * dy.to(d)).sum().backward();
        const Tensor g = sparse ? autograd::to_dense(autograd::sparse_grad(w)) : w.grad();
        return std::make_pair(y.to(kCPU), g.to(kCPU));
      };
      const auto [y_cpu, g_cpu] = run(kCPU);
      const auto [y_gpu, g_gpu] = run(testing::kGpu);
      const std::string what = std::string(dtype_name(t)) + (sparse ? " sparse" : " dense");
      testing::expect_close(y_gpu, y_cpu.to_vector<double>(), {0, 0}, "embedding " + what);
      testing::expect_close(g_gpu, g_cpu.to_vector<double>(),
                            t == DType::F32 ? testing::Tol{1e-6, 1e-5} : tol_for(t),
                            "embedding grad " + what);
    }
  }
}

// Three steps of an optimizer on the same parameters and gradients on each device.
template <typename Opt, typename Options>
void check_optimizer(const Options& options, DType t, const std::string& what) {
  auto run = [&](Device d) {
    Tensor p = uniform({1000, 7}, -1, 1, t, 37).to(d).detach().requires_grad_();
    Opt opt({p}, options);
    for (int step = 0; step < 3; ++step) {
      p.set_grad(uniform({1000, 7}, -1, 1, t, uint64_t(38 + step)).to(d));
      opt.step();
    }
    return p.detach().to(kCPU);
  };
  const Tensor cpu = run(kCPU), gpu = run(testing::kGpu);
  testing::expect_close(gpu, cpu.to_vector<double>(), t == DType::F32 ? testing::Tol{1e-6, 1e-5} : tol_for(t),
                        what);
}

TEST_F(IndexOptim, FusedOptimizerStepsMatchTheCpu) {
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    const std::string name = dtype_name(t);
    check_optimizer<optim::SGD>(optim::SGDOptions(0.1), t, "sgd " + name);
    check_optimizer<optim::SGD>(optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01), t,
                                "sgd nesterov " + name);
    check_optimizer<optim::SGD>(optim::SGDOptions(0.05).momentum(0.8).dampening(0.1), t,
                                "sgd dampening " + name);
    check_optimizer<optim::Adam>(optim::AdamOptions(1e-2).weight_decay(0.01), t, "adam " + name);
    check_optimizer<optim::Adam>(optim::AdamOptions(1e-2).amsgrad(true), t, "adam amsgrad " + name);
    check_optimizer<optim::AdamW>(optim::AdamWOptions(1e-2).weight_decay(0.1), t, "adamw " + name);
    // 7,000 elements: in 8 bits, four blocks of 2048 (the last short), or 110 of 64.
    check_optimizer<optim::Adam8bit>(optim::Adam8bitOptions(1e-2).weight_decay(0.01), t, "adam8bit " + name);
    check_optimizer<optim::AdamW8bit>(optim::AdamW8bitOptions(1e-2).weight_decay(0.1).block_size(64), t,
                                      "adamw8bit " + name);
  }
}

TEST_F(IndexOptim, SparseAdamUpdatesOnlyTheRowsPresent) {
  for (DType t : {DType::F32, DType::BF16}) {
    auto run = [&](Device d) {
      manual_seed(5);
      nn::Embedding emb(nn::EmbeddingOptions(40, 16).sparse(true));
      emb->to(t);
      emb->to(d);
      optim::SparseAdam opt(emb->parameters(), optim::SparseAdamOptions(1e-2));
      for (int step = 0; step < 3; ++step) {
        const Tensor ids = uniform({5, 6}, 0, 40, DType::F64, uint64_t(40 + step)).to(DType::I64).to(d);
        const Tensor y = emb->forward(ids);
        opt.zero_grad();
        (y * y).sum().backward();
        opt.step();
      }
      return emb->weight.detach().to(kCPU);
    };
    const Tensor cpu = run(kCPU), gpu = run(testing::kGpu);
    testing::expect_close(gpu, cpu.to_vector<double>(),
                          t == DType::F32 ? testing::Tol{1e-6, 1e-5} : tol_for(t),
                          std::string("sparse adam ") + dtype_name(t));
  }
}

// Out-of-range indices on the GPU are refused before any kernel runs (Note [index bounds on a GPU]), with the
// CPU's messages; the {min, max} read behind the check (one reduction, one copy) matches the CPU's, also at
// the ends of i64, where negating would overflow.
TEST_F(IndexOptim, OutOfRangeIndicesAreRefusedWithTheCpusMessages) {
  const Tensor x = uniform({6, 11}, -1, 1, DType::F32, 34);
  for (Device d : {kCPU, testing::kGpu}) {
    const Tensor xd = x.to(d);
    const std::string where = std::string(" on ") + (d == kCPU ? "cpu" : "cuda:0");
    testing::expect_error<IndexError>(
        [&] {
          ops::index_select(xd, 1, tensor<int64_t>({3, 11}).to(d));
        },
        {"index_select", "index 11", "size 11"});
    testing::expect_error<IndexError>(
        [&] {
          ops::index_select(xd, 1, tensor<int64_t>({-12, 0}).to(d));
        },
        {"index_select", "index -12", "size 11"});
    testing::expect_error<IndexError>(
        [&] {
          ops::gather(xd, 0, tensor<int64_t>({0, 6}).reshape({1, 2}).to(d));
        },
        {"gather", "index 6"});
    testing::expect_error<IndexError>(
        [&] {
          nn::functional::embedding(tensor<int64_t>({2, 6}).to(d), xd);
        },
        {"embedding", "index 6"});
    testing::expect_error<IndexError>(
        [&] {
          nn::functional::cross_entropy(xd, tensor<int64_t>({0, 1, 2, 3, 4, 11}).to(d));
        },
        {"cross_entropy", "target 11"});
    for (const std::vector<int64_t>& v : {std::vector<int64_t>{5},
                                          {3, -7, 2, 9},
                                          {INT64_MIN, 0, INT64_MAX},
                                          {INT64_MAX, INT64_MAX - 1},
                                          {INT64_MIN, INT64_MIN + 1}}) {
      const auto [lo, hi] = ops::integer_range(tensor<int64_t>(v).to(d));
      EXPECT_EQ(lo, *std::min_element(v.begin(), v.end())) << where;
      EXPECT_EQ(hi, *std::max_element(v.begin(), v.end())) << where;
    }
    const auto [lo32, hi32] = ops::integer_range(tensor<int32_t>({-4, 8, 1}).to(d));
    EXPECT_EQ(lo32, -4) << where;
    EXPECT_EQ(hi32, 8) << where;
  }
}

// The GradScaler's flags (Note [one found_inf per device] in optim/grad_scaler.cpp): parameters on cuda:0 and
// on the CPU in one optimizer, so that each device has its own flag; an inf or nan in any one gradient, on
// either device, skips the step for all and backs the scale off; a clean iteration steps like the CPU.
TEST_F(IndexOptim, GradScalerSkipsTheStepForANonFiniteGradientOnAnyDevice) {
  const int kParams = 12;
  // bad: the parameter whose gradient gets an inf (even) or a nan (odd); -1 for none.
  for (int bad : {-1, 0, 5, 6, kParams - 1}) {
    std::vector<Tensor> params;
    for (int i = 0; i < kParams; ++i) {
      Tensor p = uniform({3 + i, 4}, -1, 1, DType::F32, uint64_t(40 + i));
      if (i % 2 == 0) p = p.to(testing::kGpu);  // even ones on the GPU, odd ones on the CPU
      params.push_back(p.requires_grad_());
    }
    optim::SGD opt(params, optim::SGDOptions(0.1).momentum(0.9));
    amp::GradScaler scaler(amp::GradScalerOptions().init_scale(4096));
    Tensor loss;
    for (const Tensor& p : params) {
      const Tensor term = sum(mul(p, p)).to(kCPU);
      loss = loss.defined() ? add(loss, term) : term;
    }
    scaler.scale(loss).backward();
    if (bad >= 0) {
      NoGradGuard no_grad;
      Tensor g = params[size_t(bad)].grad();
      g.narrow(0, 1, 1).fill_(bad % 2 ? double(NAN) : double(INFINITY));
    }
    std::vector<std::vector<float>> before;
    for (const Tensor& p : params) before.push_back(p.to(kCPU).to_vector<float>());
    const std::string what = "bad parameter " + std::to_string(bad);
    EXPECT_EQ(scaler.step(opt), bad < 0) << what;
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), bad < 0 ? 4096.0 : 2048.0) << what;
    for (int i = 0; i < kParams; ++i) {
      const Tensor after = params[size_t(i)].to(kCPU);
      if (bad >= 0) {
        EXPECT_EQ(after.to_vector<float>(), before[size_t(i)]) << what << ", parameter " << i;
        continue;
      }
      // SGD's first step with momentum: p - lr * 2p (the unscaled gradient of p^2).
      std::vector<double> want;
      for (float v : before[size_t(i)]) want.push_back(double(v) - 0.1 * 2 * double(v));
      testing::expect_close(after, want, {1e-6, 1e-6}, what + ", parameter " + std::to_string(i));
    }
  }
}

}  // namespace
}  // namespace frugal

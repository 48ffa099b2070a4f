// Pruning (nn/prune.h): which elements each method prunes (against the rule written out here), the packed
// masks and their bytes, masks holding through fine-tuning (forward and gradient), remove, shrink giving the
// same outputs from fewer parameters, the CSR Linear against the dense one, and bad inputs.
#include <algorithm>
#include <cmath>

#include "nn/containers.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/prune.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

namespace prune = nn::prune;
using testing::expect_error;
using testing::uniform;

int64_t zeros(const Tensor& t) {
  const std::vector<float> v = t.to_vector<float>();
  return std::count(v.begin(), v.end(), 0.0f);
}

// Every pruned (zero) element's |w| in `before` is at most every kept one's.
void expect_smallest_pruned(const std::vector<float>& before, const Tensor& after) {
  const std::vector<float> a = after.to_vector<float>();
  float max_pruned = 0, min_kept = INFINITY;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == 0)
      max_pruned = std::max(max_pruned, std::abs(before[i]));
    else
      min_kept = std::min(min_kept, std::abs(before[i]));
    if (a[i] != 0) {
      EXPECT_EQ(a[i], before[i]) << "a kept element changed at " << i;
    }
  }
  EXPECT_LE(max_pruned, min_kept);
}

// The mask's bits are exactly the nonzero elements.
void expect_mask_matches(const nn::Module& m, const std::string& name, const Tensor& p) {
  const Tensor bits = m.mask(name);
  ASSERT_TRUE(bits.defined());
  ASSERT_EQ(bits.numel(), (p.numel() + 7) / 8);
  const std::vector<uint8_t> b = bits.to_vector<uint8_t>();
  const std::vector<float> v = p.to_vector<float>();
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(((b[i >> 3] >> (i & 7)) & 1) != 0, v[i] != 0) << i;
}

TEST(Prune, L1PrunesTheSmallestAndPruningAgainPrunesTheRemaining) {
  manual_seed(1);
  nn::Linear fc(8, 6);
  const std::vector<float> before = fc->weight.to_vector<float>();
  prune::l1_unstructured(*fc, "weight", 0.5);
  EXPECT_EQ(zeros(fc->weight), 24);
  expect_smallest_pruned(before, fc->weight);
  expect_mask_matches(*fc, "weight", fc->weight);
  EXPECT_EQ(fc->mask("weight").dtype(), DType::U8);
  prune::l1_unstructured(*fc, "weight", 0.5);  // half of the 24 left
  EXPECT_EQ(zeros(fc->weight), 36);
  expect_smallest_pruned(before, fc->weight);
  expect_mask_matches(*fc, "weight", fc->weight);
  EXPECT_DOUBLE_EQ(prune::sparsity(fc->weight), 0.75);
  EXPECT_FALSE(prune::is_pruned(*fc, "bias"));
}

TEST(Prune, RandomIsReproducibleAndKeepsTheRest) {
  auto pruned = [](uint64_t seed) {
    manual_seed(7);
    nn::Linear fc(10, 10);
    manual_seed(seed);
    prune::random_unstructured(*fc, "weight", 0.3);
    return fc->weight.to_vector<float>();
  };
  const std::vector<float> a = pruned(3), b = pruned(3), c = pruned(4);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(std::count(a.begin(), a.end(), 0.0f), 30);
}

TEST(Prune, LnStructuredPrunesWholeRowsByNormAndTheirBias) {
  manual_seed(2);
  nn::Linear fc(5, 6);
  const std::vector<float> w = fc->weight.to_vector<float>(), bias = fc->bias.to_vector<float>();
  prune::ln_structured(*fc, "weight", 0.5, 2, 0);
  std::vector<std::pair<double, int>> norms;
  for (int r = 0; r < 6; ++r) {
    double s = 0;
    for (int c = 0; c < 5; ++c) s += double(w[size_t(r * 5 + c)]) * w[size_t(r * 5 + c)];
    norms.emplace_back(std::sqrt(s), r);
  }
  std::sort(norms.begin(), norms.end());
  const std::vector<float> after = fc->weight.to_vector<float>(), bias_after = fc->bias.to_vector<float>();
  for (int k = 0; k < 6; ++k) {
    const int r = norms[size_t(k)].second;
    const bool pruned = k < 3;
    for (int c = 0; c < 5; ++c)
      EXPECT_EQ(after[size_t(r * 5 + c)], pruned ? 0.0f : w[size_t(r * 5 + c)]) << "row " << r;
    EXPECT_EQ(bias_after[size_t(r)], pruned ? 0.0f : bias[size_t(r)]) << "bias " << r;
  }
  EXPECT_TRUE(prune::is_pruned(*fc, "bias"));
  // Along dim 1: columns, and the bias is left alone.
  nn::Linear g(6, 4);
  prune::ln_structured(*g, "weight", 0.5, 1, 1);
  const std::vector<float> gw = g->weight.to_vector<float>();
  int zero_columns = 0;
  for (int c = 0; c < 6; ++c) {
    bool all = true;
    for (int r = 0; r < 4; ++r) all = all && gw[size_t(r * 6 + c)] == 0;
    zero_columns += all;
  }
  EXPECT_EQ(zero_columns, 3);
  EXPECT_FALSE(prune::is_pruned(*g, "bias"));
}

TEST(Prune, GlobalUsesOneThresholdAcrossParameters) {
  manual_seed(3);
  nn::Linear small(10, 10), large(10, 10);
  NoGradGuard no_record;
  large->weight.mul_(10.0);  // all of large's |w| above small's but a few
  std::vector<float> before = small->weight.to_vector<float>();
  const std::vector<float> large_before = large->weight.to_vector<float>();
  before.insert(before.end(), large_before.begin(), large_before.end());
  prune::global_unstructured({{small.get(), "weight"}, {large.get(), "weight"}}, 0.5);
  EXPECT_EQ(zeros(small->weight) + zeros(large->weight), 100);
  EXPECT_GT(zeros(small->weight), 80);
  Tensor both = cat({small->weight.reshape({100}), large->weight.reshape({100})}, 0);
  expect_smallest_pruned(before, both);
}

// After pruning, fine-tuning keeps the pruned weights at 0: with Adam whose moments predate the pruning
// (the forward re-zeroes them) and with plain SGD (the gradient is masked, so they never move).
TEST(Prune, FineTuningKeepsPrunedWeightsAtZero) {
  for (bool adam : {true, false}) {
    manual_seed(4);
    nn::Sequential net{nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 3)};
    std::unique_ptr<optim::Optimizer> opt;
    if (adam)
      opt = std::make_unique<optim::Adam>(net->parameters(), optim::AdamOptions(0.05).weight_decay(0.1));
    else
      opt = std::make_unique<optim::SGD>(net->parameters(), optim::SGDOptions(0.1));
    const Tensor x = uniform({16, 4}, -1, 1, DType::F32, 5);
    auto step = [&] {
      opt->zero_grad();
      Tensor loss = mean(net->forward(x) * net->forward(x));
      loss.backward();
      return loss;
    };
    step();
    opt->step();  // state before pruning
    auto& fc0 = *std::dynamic_pointer_cast<nn::LinearImpl>((*net)[0]);
    auto& fc2 = *std::dynamic_pointer_cast<nn::LinearImpl>((*net)[2]);
    prune::l1_unstructured(fc0, "weight", 0.6);
    prune::l1_unstructured(fc2, "weight", 0.6);
    const std::vector<float> w0 = fc0.weight.to_vector<float>();
    for (int i = 0; i < 3; ++i) {
      step();
      // The gradient is masked.
      const std::vector<float> g = fc0.weight.grad().to_vector<float>();
      for (size_t k = 0; k < w0.size(); ++k)
        if (w0[k] == 0) {
          EXPECT_EQ(g[k], 0.0f) << "gradient of a pruned weight, element " << k;
        }
      opt->step();
      if (!adam) {
        EXPECT_EQ(zeros(fc0.weight), 19) << "plain SGD moved a pruned weight";
      }
    }
    net->forward(x);  // re-applies the masks
    const std::vector<float> w = fc0.weight.to_vector<float>();
    int changed = 0;
    for (size_t k = 0; k < w.size(); ++k) {
      if (w0[k] == 0) {
        EXPECT_EQ(w[k], 0.0f) << (adam ? "adam" : "sgd") << " revived element " << k;
      }
      changed += w0[k] != 0 && w[k] != w0[k];
    }
    EXPECT_EQ(changed, 32 - 19) << "every kept weight trains";
  }
}

TEST(Prune, MaskIsABitPerElementAndRemoveFreesIt) {
  nn::Linear fc(64, 64);  // 4096 weights: a 512-byte mask
  const int64_t before = memory::stats(kCPU).allocated.current;
  prune::l1_unstructured(*fc, "weight", 0.9);
  const int64_t with_mask = memory::stats(kCPU).allocated.current;
  EXPECT_EQ(with_mask - before, 512) << "4096 bits, one arena block of 512 bytes";
  {
    const StateDict state = fc->state_dict();
    ASSERT_TRUE(state.count("weight_mask"));
    EXPECT_EQ(state.at("weight_mask").shape(), (Shape{512}));
  }
  prune::remove(*fc, "weight");
  EXPECT_EQ(memory::stats(kCPU).allocated.current, before);
  EXPECT_FALSE(prune::is_pruned(*fc, "weight"));
  EXPECT_FALSE(fc->state_dict().count("weight_mask"));
  EXPECT_EQ(zeros(fc->weight), 3686);  // the zeros stay
}

TEST(Prune, ShrinkRemovesPrunedRowsWithTheSameOutputs) {
  manual_seed(5);
  nn::Sequential mlp{nn::Linear(6, 10), nn::ReLU(), nn::Linear(10, 8), nn::ReLU(), nn::Linear(8, 3)};
  prune::ln_structured(*(*mlp)[0], "weight", 0.5, 2, 0);
  prune::ln_structured(*(*mlp)[2], "weight", 0.5, 2, 0);
  const Tensor x = uniform({5, 6}, -1, 1, DType::F32, 6);
  const std::vector<float> y = mlp->forward(x).to_vector<float>();
  const int64_t params = mlp->num_parameters();
  prune::shrink(*mlp);
  testing::expect_close(mlp->forward(x), std::vector<double>(y.begin(), y.end()), {1e-6, 1e-5}, "mlp");
  EXPECT_EQ(std::dynamic_pointer_cast<nn::LinearImpl>((*mlp)[0])->weight.shape(), (Shape{5, 6}));
  EXPECT_EQ(std::dynamic_pointer_cast<nn::LinearImpl>((*mlp)[2])->weight.shape(), (Shape{4, 5}));
  EXPECT_EQ(std::dynamic_pointer_cast<nn::LinearImpl>((*mlp)[4])->weight.shape(), (Shape{3, 4}));
  EXPECT_LT(mlp->num_parameters(), params * 6 / 10);

  // Conv2d -> ReLU -> MaxPool2d -> Flatten -> Linear: a channel is 16 consecutive features of the Linear.
  nn::Sequential cnn{nn::Conv2d(nn::Conv2dOptions(1, 4, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                     nn::Flatten(), nn::Linear(64, 5)};
  prune::ln_structured(*(*cnn)[0], "weight", 0.5, 1, 0);
  const Tensor img = uniform({2, 1, 8, 8}, -1, 1, DType::F32, 7);
  const std::vector<float> z = cnn->forward(img).to_vector<float>();
  prune::shrink(*cnn);
  testing::expect_close(cnn->forward(img), std::vector<double>(z.begin(), z.end()), {1e-6, 1e-5}, "cnn");
  EXPECT_EQ(std::dynamic_pointer_cast<nn::Conv2dImpl>((*cnn)[0])->weight.shape(), (Shape{2, 1, 3, 3}));
  EXPECT_EQ(std::dynamic_pointer_cast<nn::LinearImpl>((*cnn)[4])->weight.shape(), (Shape{5, 32}));
}

TEST(Prune, SparseLinearEqualsTheDenseOneInItsBytes) {
  manual_seed(8);
  nn::Linear fc(30, 20);
  prune::l1_unstructured(*fc, "weight", 0.9);
  const int64_t before = memory::stats(kCPU).allocated.current;
  nn::SparseLinear sparse(*fc);
  const int64_t bytes = memory::stats(kCPU).allocated.current - before;
  EXPECT_EQ(sparse->nnz(), 60);
  // values (240 B), columns (240 B), row offsets (84 B), bias (80 B): a 512-byte block each.
  EXPECT_EQ(bytes, 4 * 512);
  InferenceMode no_record;
  const Tensor x = uniform({2, 7, 30}, -1, 1, DType::F32, 9);
  const std::vector<float> dense = fc->forward(x).to_vector<float>();
  testing::expect_close(sparse->forward(x), std::vector<double>(dense.begin(), dense.end()), {1e-6, 1e-5},
                        "csr");
  EXPECT_EQ(sparse->forward(x).shape(), (Shape{2, 7, 20}));
  // An input that is not contiguous (a window of wider rows) gives what its contiguous copy gives.
  const Tensor view = uniform({9, 40}, -1, 1, DType::F32, 10).narrow(1, 5, 30);
  ASSERT_FALSE(view.is_contiguous());
  EXPECT_EQ(sparse->forward(view).to_vector<float>(), sparse->forward(view.contiguous()).to_vector<float>());
}

TEST(Prune, ToSparseReplacesTheSparseLinearsOnly) {
  nn::Sequential net{nn::Linear(16, 16), nn::ReLU(), nn::Linear(16, 4)};
  prune::l1_unstructured(*(*net)[0], "weight", 0.8);
  prune::l1_unstructured(*(*net)[2], "weight", 0.2);
  const Tensor x = uniform({3, 16}, -1, 1);
  InferenceMode no_record;
  const std::vector<float> y = net->forward(x).to_vector<float>();
  EXPECT_EQ(prune::to_sparse(*net, 0.5), 1);
  EXPECT_NE(std::dynamic_pointer_cast<nn::SparseLinearImpl>((*net)[0]), nullptr);
  EXPECT_NE(std::dynamic_pointer_cast<nn::LinearImpl>((*net)[2]), nullptr);
  testing::expect_close(net->forward(x), std::vector<double>(y.begin(), y.end()), {1e-6, 1e-5}, "net");
}

TEST(Prune, BadInputs) {
  nn::Linear fc(4, 3);
  const std::vector<float> w = fc->weight.to_vector<float>();
  expect_error<Error>([&] { prune::l1_unstructured(*fc, "weight", 1.5); },
                      {"l1_unstructured", "[0, 1]", "1.5"});
  expect_error<Error>([&] { prune::random_unstructured(*fc, "weight", -0.1); },
                      {"random_unstructured", "-0.1"});
  expect_error<Error>([&] { prune::l1_unstructured(*fc, "wieght", 0.5); },
                      {"Linear", "no parameter named 'wieght'"});
  expect_error<Error>([&] { prune::ln_structured(*fc, "weight", 0.5, 2, 2); },
                      {"ln_structured", "dim 2", "[3, 4]"});
  expect_error<Error>([&] { prune::ln_structured(*fc, "weight", 0.5, 0, 0); },
                      {"ln_structured", "n must be > 0"});
  expect_error<Error>([&] { prune::remove(*fc, "weight"); }, {"remove", "not pruned"});
  expect_error<Error>([&] { prune::global_unstructured({}, 0.5); }, {"global_unstructured", "no parameters"});
  EXPECT_EQ(fc->weight.to_vector<float>(), w) << "a refused call changed the weight";
  EXPECT_FALSE(prune::is_pruned(*fc, "weight"));
  nn::SparseLinear sparse(*fc);
  expect_error<Error>(
      [&] {
        sparse->forward(uniform({2, 4}, -1, 1).requires_grad_(true));
      },
      {"SparseLinear", "inference"});
  expect_error<ShapeError>([&] { sparse->forward(uniform({2, 5}, -1, 1)); }, {"SparseLinear", "[2, 5]", "4"});
  nn::Sequential with_norm{nn::Conv2d(1, 2, 3), nn::BatchNorm2d(2), nn::Conv2d(2, 2, 3)};
  expect_error<Error>([&] { prune::shrink(*with_norm); }, {"shrink", "BatchNorm2d", "parameters"});
}

}  // namespace
}  // namespace frugal

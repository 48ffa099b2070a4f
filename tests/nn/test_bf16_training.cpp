// A model and its data in bf16 end to end: a small MLP converted with module->to(DType::BF16), fed bf16
// batches by a DataLoader, trained a few dozen Adam steps. Every tensor stays bf16 and the loss goes down.
#include <cmath>

#include "data/dataloader.h"
#include "nn/containers.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "optim/adam.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

namespace F = nn::functional;
using testing::uniform;

// 512 points in [-1, 1)^8, labelled by which of 4 fixed directions they point furthest along: learnable by a
// small MLP within a few dozen steps. Inputs in the dtype the loader asks for.
class Directions : public data::Dataset {
 public:
  Directions() : x_(uniform({512, 8}, -1, 1, DType::F32, 5)) {
    const Tensor directions = uniform({8, 4}, -1, 1, DType::F32, 6);
    labels_ = ops::argmax(ops::matmul(x_, directions), 1);
  }
  int64_t size() const override { return 512; }
  data::Batch get_batch(std::span<const int64_t> indices, DType dtype) const override {
    const Tensor idx = tensor(std::vector<int64_t>(indices.begin(), indices.end()));
    return {ops::index_select(x_, 0, idx).to(dtype), ops::index_select(labels_, 0, idx)};
  }

 private:
  Tensor x_, labels_;
};

TEST(Bf16Training, MlpLearnsWithModelAndDataInBf16) {
  manual_seed(7);
  nn::Sequential net;
  net->push_back(nn::Linear(8, 64));
  net->push_back(nn::ReLU());
  net->push_back(nn::Linear(64, 4));
  net->to(DType::BF16);
  for (const Tensor& p : net->parameters()) ASSERT_EQ(p.dtype(), DType::BF16);

  data::DataLoader loader(std::make_shared<Directions>(),
                          data::DataLoaderOptions().batch_size(64).shuffle(true).seed(3).dtype(DType::BF16));
  optim::Adam opt(net->parameters(), optim::AdamOptions(1e-2));
  std::vector<double> losses;
  for (int64_t epoch = 0; epoch < 6; ++epoch)
    for (data::Batch& b : loader.epoch(epoch)) {
      ASSERT_EQ(b.input.dtype(), DType::BF16);
      opt.zero_grad();
      const Tensor logits = (*net)(b.input);
      ASSERT_EQ(logits.dtype(), DType::BF16);
      const Tensor loss = F::cross_entropy(logits, b.target);
      loss.backward();
      for (const Tensor& p : net->parameters()) ASSERT_EQ(p.grad().dtype(), DType::BF16);
      opt.step();
      losses.push_back(loss.item<double>());
      ASSERT_TRUE(std::isfinite(losses.back())) << "step " << losses.size();
    }
  ASSERT_EQ(losses.size(), 48u);
  auto mean_of = [&](size_t begin, size_t end) {
    double s = 0;
    for (size_t i = begin; i < end; ++i) s += losses[i];
    return s / double(end - begin);
  };
  // First epoch near log(4) = 1.39; by the last the classes are mostly separated.
  const double first = mean_of(0, 8), last = mean_of(40, 48);
  EXPECT_LT(last, 0.6 * first) << "first epoch " << first << ", last epoch " << last;
  std::cout << "mean loss, first epoch " << first << ", last epoch " << last << "\n";
  for (const Tensor& p : net->parameters()) EXPECT_EQ(p.dtype(), DType::BF16);
}

}  // namespace
}  // namespace frugal

// Sequential and ModuleList: chaining, child names, indexing, and recompute_every giving bit-identical
// gradients (with dropout inside) for less memory.
#include "nn/containers.h"
#include "nn/layers.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::uniform;

nn::Sequential mlp(int layers, int64_t width, double p_drop) {
  nn::Sequential seq;
  for (int i = 0; i < layers; ++i) {
    seq->push_back(nn::Linear(width, width));
    seq->push_back(nn::ReLU());
    if (p_drop > 0) seq->push_back(nn::Dropout(p_drop));
  }
  return seq;
}

TEST(Containers, SequentialChainsAndNamesChildren) {
  auto fc1 = nn::Linear(3, 5);
  auto fc2 = nn::Linear(5, 2);
  nn::Sequential seq({fc1, nn::Tanh(), fc2});
  EXPECT_EQ(seq->size(), 3u);
  EXPECT_EQ(seq[0], fc1.ptr());
  std::vector<std::string> names;
  for (const auto& [n, m] : seq->named_children()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(seq->named_parameters()[2].first, "2.weight");
  const Tensor x = uniform({4, 3}, -1, 1);
  EXPECT_EQ(seq(x).to_vector<float>(), fc2->forward(tanh(fc1->forward(x))).to_vector<float>());
  int count = 0;
  for (const auto& m : seq) count += m != nullptr;
  EXPECT_EQ(count, 3);
  expect_error<IndexError>([&] { seq[3]; }, {"Sequential", "index 3", "3 modules"});
  expect_error<Error>([&] { seq->recompute_every(-1); }, {"recompute_every", "-1"});
}

TEST(Containers, ModuleListHoldsIndexesAndIterates) {
  nn::ModuleList list;
  list->push_back(nn::Linear(2, 3));
  list->push_back(nn::ReLU());
  EXPECT_EQ(list->size(), 2u);
  ASSERT_NE(list->at<nn::LinearImpl>(0), nullptr);
  EXPECT_EQ(list->at<nn::LinearImpl>(1), nullptr);
  EXPECT_EQ(list->at<nn::LinearImpl>(0)->weight.shape(), (Shape{3, 2}));
  EXPECT_EQ(list->named_parameters()[0].first, "0.weight");
  Tensor h = uniform({1, 2}, -1, 1);
  for (const auto& m : list) h = m->forward(h);
  EXPECT_EQ(h.shape(), (Shape{1, 3}));
  expect_error<Error>([&] { list->forward(h); }, {"ModuleList", "no forward"});
  expect_error<IndexError>([&] { list[2]; }, {"ModuleList", "index 2"});
}

TEST(Containers, ReplaceModuleSwapsAChildInPlaceAndTheListFollows) {
  nn::Sequential inner{nn::Linear(2, 3), nn::ReLU()};
  nn::Sequential outer{nn::Linear(4, 2), inner};
  nn::Linear wider(2, 5);
  const std::shared_ptr<nn::Module> old = outer->replace_module("1.0", wider.ptr());
  EXPECT_EQ(old->type_name(), "Linear");
  EXPECT_EQ((*inner)[0], wider.ptr());  // the list a forward runs, not only the named children
  EXPECT_EQ(outer->named_parameters()[2].first, "1.0.weight");
  EXPECT_EQ(outer->named_parameters()[2].second.shape(), (Shape{5, 2}));
  EXPECT_EQ(outer(uniform({3, 4}, -1, 1)).shape(), (Shape{3, 5}));
  nn::ModuleList list{nn::Linear(2, 3)};
  list->replace_module("0", nn::ReLU().ptr());
  EXPECT_EQ(list->at<nn::LinearImpl>(0), nullptr);
  expect_error<Error>([&] { outer->replace_module("2", wider.ptr()); },
                      {"replace_module", "no module at '2'"});
  expect_error<Error>([&] { outer->replace_module("0.x", wider.ptr()); }, {"no module at '0.x'"});
  expect_error<Error>([&] { outer->replace_module("0", nullptr); }, {"null"});
}

// Runs a step of net on x (seeded for dropout) and returns the loss and every parameter's gradient.
std::pair<float, std::vector<std::vector<float>>> step(nn::SequentialImpl& net, const Tensor& x,
                                                       int64_t* peak) {
  net.zero_grad();
  manual_seed(11);
  memory::reset_peak(kCPU);
  const int64_t before = memory::stats(kCPU).allocated.current;
  const Tensor y = net(x);
  Tensor loss = mean(y * y);
  const float l = loss.item<float>();
  loss.backward();
  if (peak) *peak = memory::stats(kCPU).allocated.peak - before;
  std::vector<std::vector<float>> g;
  for (const Tensor& p : net.parameters()) g.push_back(p.grad().to_vector<float>());
  return {l, g};
}

TEST(Containers, SequentialRecomputeEveryIsBitIdentical) {
  manual_seed(3);
  auto net = mlp(8, 64, 0.2);
  const Tensor x = uniform({128, 64}, -1, 1, DType::F32, 5);
  int64_t peak_plain = 0, peak_rec = 0;
  const auto plain = step(*net, x, &peak_plain);
  for (int k : {1, 3, 6, 100}) {
    net->recompute_every(k);
    EXPECT_EQ(net->recompute_every(), k);
    const auto rec = step(*net, x, k == 6 ? &peak_rec : nullptr);
    EXPECT_EQ(rec.first, plain.first) << "k=" << k;
    ASSERT_EQ(rec.second.size(), plain.second.size());
    for (size_t i = 0; i < plain.second.size(); ++i)
      EXPECT_EQ(rec.second[i], plain.second[i]) << "k=" << k << " p" << i;
  }
  EXPECT_LT(peak_rec, peak_plain);
  // Without grad mode it is a plain forward.
  net->recompute_every(2);
  NoGradGuard g;
  manual_seed(11);
  const auto a = net->forward(x).to_vector<float>();
  net->recompute_every(0);
  manual_seed(11);
  EXPECT_EQ(net->forward(x).to_vector<float>(), a);
}

}  // namespace
}  // namespace frugal

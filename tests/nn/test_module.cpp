// nn::Module with real layers: parameter paths in nested modules, state dict round trip and strict errors,
// dtype conversion in place, train/eval propagation, summary and counts.
#include "nn/containers.h"
#include "nn/layers.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::uniform;

struct Block : nn::Module {
  nn::Linear fc{nullptr};
  nn::LayerNorm ln{nullptr};
  nn::Dropout drop{nullptr};
  Block()
      : Module("Block"),
        fc(register_module("fc", nn::Linear(4, 4))),
        ln(register_module("ln", nn::LayerNorm(Shape{4}))),
        drop(register_module("drop", nn::Dropout(0.1))) {}
  Tensor forward(const Tensor& x) override { return drop->forward(ln->forward(relu(fc->forward(x)))); }
};

struct Net : nn::Module {
  std::shared_ptr<Block> block;
  nn::BatchNorm2d bn{nullptr};
  nn::Linear head{nullptr};
  Net()
      : Module("Net"),
        block(register_module("block", std::make_shared<Block>())),
        bn(register_module("bn", nn::BatchNorm2d(2))),
        head(register_module("head", nn::Linear(nn::LinearOptions(4, 2).bias(false)))) {}
  Tensor forward(const Tensor& x) override { return head->forward(block->forward(x)); }
};

std::vector<std::string> names(const OrderedDict<std::string, Tensor>& v) {
  std::vector<std::string> out;
  for (const auto& [n, t] : v) out.push_back(n);
  return out;
}

TEST(Module, NamedParametersAndBuffersInNestedModules) {
  Net net;
  EXPECT_EQ(names(net.named_parameters()),
            (std::vector<std::string>{"block.fc.weight", "block.fc.bias", "block.ln.weight", "block.ln.bias",
                                      "bn.weight", "bn.bias", "head.weight"}));
  EXPECT_EQ(names(net.named_buffers()),
            (std::vector<std::string>{"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}));
  EXPECT_EQ(net.num_parameters(), 16 + 4 + 4 + 4 + 2 + 2 + 8);
  EXPECT_EQ(net.parameter_bytes(), net.num_parameters() * 4);
  for (const Tensor& p : net.parameters()) EXPECT_TRUE(p.requires_grad());
  EXPECT_EQ(net.state_dict().size(), 10u);
}

TEST(Module, StateDictRoundTrip) {
  manual_seed(1);
  Net a;
  manual_seed(2);
  Net b;
  ASSERT_NE(a.block->fc->weight.to_vector<float>(), b.block->fc->weight.to_vector<float>());
  {
    NoGradGuard g;
    a.bn->running_mean.copy_(uniform({2}, -1, 1));
    a.bn->num_batches_tracked.fill_(7);
  }
  const Tensor handle = b.block->fc->weight;
  b.load_state_dict(a.state_dict());
  for (const auto& [name, t] : a.state_dict())
    EXPECT_EQ(b.state_dict().at(name).to_vector<double>(), t.to_vector<double>()) << name;
  EXPECT_TRUE(handle.is_same(b.block->fc->weight));  // values copied into the existing tensors
  EXPECT_FALSE(b.block->fc->weight.storage() == a.block->fc->weight.storage());
  const Tensor x = uniform({3, 4}, -1, 1, DType::F32, 3);
  a.eval();
  b.eval();
  EXPECT_EQ(a(x).to_vector<float>(), b(x).to_vector<float>());
}

TEST(Module, LoadStateDictStrictErrors) {
  Net net;
  StateDict sd = net.state_dict();
  sd.erase("head.weight");
  sd["extra.weight"] = zeros({1});
  sd["block.fc.bias"] = zeros({5});
  expect_error<ShapeError>([&] { net.load_state_dict(sd); },
                           {"missing keys: head.weight", "unexpected keys: extra.weight",
                            "mis-shaped keys: block.fc.bias (expected [4], got [5])"});
  sd["block.fc.bias"] = zeros({4});
  expect_error<ShapeError>([&] { net.load_state_dict(sd); }, {"head.weight", "extra.weight"});
  net.load_state_dict(sd, /*strict=*/false);  // missing and unexpected keys are fine without strict
  EXPECT_EQ(sum(abs(net.block->fc->bias)).item<double>(), 0.0);
}

TEST(Module, ToBf16ConvertsParametersInPlace) {
  Net net;
  const Tensor w = net.block->fc->weight;
  const auto before = w.to_vector<float>();
  sum(net(uniform({2, 4}, -1, 1))).backward();
  ASSERT_TRUE(w.grad().defined());
  net.to(DType::BF16);
  EXPECT_EQ(w.dtype(), DType::BF16);  // the same handle sees the new dtype
  EXPECT_TRUE(w.requires_grad());
  EXPECT_FALSE(w.grad().defined());
  expect_close(w, std::vector<double>(before.begin(), before.end()), testing::tol_for(DType::BF16), "bf16");
  EXPECT_EQ(net.bn->running_var.dtype(), DType::BF16);
  EXPECT_EQ(net.bn->num_batches_tracked.dtype(), DType::I64);  // integers stay
  EXPECT_EQ(net.parameter_bytes(), net.num_parameters() * 2);
  // The converted model runs in bf16 end to end.
  const Tensor y = net(uniform({2, 4}, -1, 1).to(DType::BF16));
  EXPECT_EQ(y.dtype(), DType::BF16);
}

TEST(Module, TrainEvalPropagate) {
  Net net;
  net.eval();
  for (const auto& [path, m] : net.named_modules()) EXPECT_FALSE(m->is_training()) << path;
  const Tensor x = uniform({64, 4}, -1, 1, DType::F32, 4);
  EXPECT_EQ(net(x).to_vector<float>(), net(x).to_vector<float>());  // dropout off: deterministic
  net.train();
  for (const auto& [path, m] : net.named_modules()) EXPECT_TRUE(m->is_training()) << path;
  EXPECT_NE(net(x).to_vector<float>(), net(x).to_vector<float>());
}

TEST(Module, SummaryRows) {
  Net net;
  const std::string s = net.summary();
  for (const char* row : {"(root)", "block.fc", "Linear", "block.ln", "LayerNorm", "block.drop", "Dropout",
                          "bn", "BatchNorm2d", "head"})
    EXPECT_NE(s.find(row), std::string::npos) << row << " missing from\n" << s;
  EXPECT_NE(s.find(std::to_string(net.num_parameters())), std::string::npos) << s;
  // One header line, the root, and one row per module below it.
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 2 + long(net.named_modules().size()));
}

}  // namespace
}  // namespace frugal

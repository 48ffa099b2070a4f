// Rewriting a model in place (Note [rewriting a model in place], nn/module.h): quantisation and pruning put
// new modules in the module tree; a layer its parent also holds in a typed member (whose forward would go on
// calling the old layer) makes the rewrite refuse with the model unchanged, and a parent that re-points its
// members in child_replaced gets the new layers into its forward.
#include <memory>

#include "autograd/graph.h"
#include "core/memory.h"
#include "nn/containers.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/prune.h"
#include "nn/quant.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::uniform;

// A model as written in libtorch style (nn/module.h's MlpImpl): its forward calls typed members.
struct TypedMlpImpl : nn::Module {
  nn::Linear fc1{nullptr}, fc2{nullptr};
  TypedMlpImpl()
      : fc1(register_module("fc1", nn::Linear(16, 32))), fc2(register_module("fc2", nn::Linear(32, 4))) {}
  Tensor forward(const Tensor& x) override { return fc2(relu(fc1(x))); }
};
FRUGAL_MODULE(TypedMlp);

// The same model with members of the base type, re-pointed when a rewrite replaces the child.
struct RepointingMlpImpl : nn::Module {
  std::shared_ptr<nn::Module> fc1, fc2;
  RepointingMlpImpl()
      : fc1(register_module("fc1", nn::Linear(16, 32)).ptr()),
        fc2(register_module("fc2", nn::Linear(32, 4)).ptr()) {}
  Tensor forward(const Tensor& x) override { return fc2->forward(relu(fc1->forward(x))); }

 protected:
  void child_replaced(const std::string& name, const std::shared_ptr<nn::Module>& module) override {
    (name == "fc1" ? fc1 : fc2) = module;
  }
};
FRUGAL_MODULE(RepointingMlp);

// The tree's module at path, and what its type name is.
std::string type_at(const nn::Module& model, const std::string& path) {
  return model.named_modules().at(path)->type_name();
}

std::vector<float> forward_no_grad(nn::Module& model, const Tensor& x) {
  NoGradGuard ng;
  return model.forward(x).to_vector<float>();
}

TEST(Rewrite, TypedMembersMakeEveryRewriteRefuseWithTheModelUnchanged) {
  manual_seed(5);
  TypedMlp net;
  const Tensor x = uniform({8, 16}, -1, 1);
  const std::vector<float> before = forward_no_grad(*net, x);
  nn::Module* const fc1 = net->fc1.get();
  nn::Module* const fc2 = net->fc2.get();
  auto unchanged = [&] {
    EXPECT_EQ(net->named_modules().at("fc1").get(), fc1);
    EXPECT_EQ(net->named_modules().at("fc2").get(), fc2);
    EXPECT_EQ(forward_no_grad(*net, x), before);
  };
  // The first layer found is named, its parent and the member that holds it; both layers are put back.
  const std::vector<std::string> named{"'fc1'", "TypedMlp", "nn::Linear fc1", "Nothing was replaced"};
  auto with = [&](const char* who) {
    std::vector<std::string> parts{who};
    parts.insert(parts.end(), named.begin(), named.end());
    return parts;
  };
  expect_error<Error>([&] { nn::quant::quantize_dynamic(*net); }, with("quantize_dynamic"));
  unchanged();
  expect_error<Error>([&] { nn::quant::prepare(*net); }, with("quant::prepare"));
  unchanged();
  expect_error<Error>([&] { nn::quant::prepare_qat(*net); }, with("prepare_qat"));
  unchanged();
  nn::prune::l1_unstructured(*net->fc1, "weight", 0.95);
  nn::prune::l1_unstructured(*net->fc2, "weight", 0.95);
  const std::vector<float> pruned = forward_no_grad(*net, x);
  expect_error<Error>([&] { nn::prune::to_sparse(*net, 0.9); }, with("prune::to_sparse"));
  EXPECT_EQ(type_at(*net, "fc1"), "Linear");
  EXPECT_EQ(type_at(*net, "fc2"), "Linear");
  EXPECT_EQ(forward_no_grad(*net, x), pruned);
}

TEST(Rewrite, APointerKeptIntoASequentialMakesTheRewriteRefuse) {
  manual_seed(6);
  nn::Linear kept(16, 32);
  nn::Sequential net{kept, nn::ReLU(), nn::Linear(32, 4)};
  expect_error<Error>([&] { nn::quant::quantize_dynamic(*net); },
                      {"quantize_dynamic", "'0'", "Sequential", "pointer of yours", "Nothing was replaced"});
  EXPECT_EQ(type_at(*net, "0"), "Linear");
  EXPECT_EQ(type_at(*net, "2"), "Linear");
  EXPECT_EQ(net->named_modules().at("0").get(), kept.get());
  kept = nullptr;  // the pointer dropped, the rewrite goes through
  EXPECT_EQ(nn::quant::quantize_dynamic(*net), 2);
  EXPECT_EQ(type_at(*net, "0"), "QuantizedLinear");
  EXPECT_EQ(type_at(*net, "2"), "QuantizedLinear");
}

// A forward in recompute segments keeps its segments' modules in the graph until backward: the refusal says
// so (naming the Sequential), and after backward the rewrite goes through.
TEST(Rewrite, ALiveRecomputeGraphIsNamedAsTheHolder) {
  manual_seed(7);
  nn::Sequential inner{nn::Linear(8, 16), nn::ReLU(), nn::Linear(16, 16), nn::ReLU(), nn::Linear(16, 4)};
  inner->recompute_every(2);
  nn::Sequential net{nn::Linear(8, 8), inner};
  const Tensor x = uniform({3, 8}, -1, 1).requires_grad_(true);
  Tensor out = net->forward(x);
  expect_error<Error>([&] { nn::quant::quantize_dynamic(*net); },
                      {"quantize_dynamic", "'1.0'", "Nothing was replaced", "the Sequential at '1'",
                       "recompute segments", "until backward runs or the output is dropped"});
  EXPECT_EQ(type_at(*net, "1.0"), "Linear");
  out.sum().backward();
  out = Tensor();
  EXPECT_EQ(nn::quant::quantize_dynamic(*net), 4);
  EXPECT_EQ(type_at(*net, "1.0"), "QuantizedLinear");
  // The model itself the Sequential that runs segments.
  nn::Sequential top{nn::Linear(8, 8), nn::ReLU(), nn::Linear(8, 4)};
  top->recompute_every(2);
  const Tensor live = top->forward(x);
  expect_error<Error>([&] { nn::quant::quantize_dynamic(*top); }, {"'0'", "the Sequential at the top"});
  // A pointer kept into a model without recompute segments: no word of them.
  nn::Linear kept(4, 4);
  nn::Sequential plain{kept};
  try {
    nn::quant::quantize_dynamic(*plain);
    ADD_FAILURE() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("recompute"), std::string::npos) << e.what();
  }
}

TEST(Rewrite, AParentThatRePointsItsMembersRunsTheRewrittenLayers) {
  manual_seed(7);
  RepointingMlp net;
  nn::Sequential same{nn::Linear(16, 32), nn::ReLU(), nn::Linear(32, 4)};
  same->load_state_dict({{"0.weight", net->fc1->named_parameters()["weight"]},
                         {"0.bias", net->fc1->named_parameters()["bias"]},
                         {"2.weight", net->fc2->named_parameters()["weight"]},
                         {"2.bias", net->fc2->named_parameters()["bias"]}});
  const Tensor x = uniform({8, 16}, -1, 1);
  const std::vector<float> f32 = forward_no_grad(*net, x);
  EXPECT_EQ(nn::quant::quantize_dynamic(*net), 2);
  EXPECT_EQ(nn::quant::quantize_dynamic(*same), 2);
  EXPECT_EQ(net->fc1->type_name(), "QuantizedLinear");
  EXPECT_EQ(net->fc1.get(), net->named_modules().at("fc1").get());
  EXPECT_EQ(net->fc2.get(), net->named_modules().at("fc2").get());
  const std::vector<float> int8 = forward_no_grad(*net, x);
  EXPECT_EQ(int8, forward_no_grad(*same, x));  // the int8 layers ran, as in the Sequential
  EXPECT_NE(int8, f32);
}

TEST(Rewrite, ALayerAtTwoPathsIsRewrittenAtBoth) {
  manual_seed(9);
  nn::Linear shared(16, 16);
  nn::Sequential net{shared, nn::ReLU(), shared};
  shared = nullptr;
  EXPECT_EQ(nn::quant::quantize_dynamic(*net), 2);
  EXPECT_EQ(type_at(*net, "0"), "QuantizedLinear");
  EXPECT_EQ(type_at(*net, "2"), "QuantizedLinear");
}

// One layer at a time: the f32 weight of each goes as soon as its int8 form is in place, so the arena's peak
// during quantize_dynamic stays below one f32 layer over what the model held (8 of them: all the int8 layers
// at once would be two).
TEST(Rewrite, QuantizeDynamicNeedsOneLayerAtATime) {
  manual_seed(10);
  nn::Sequential net;
  for (int i = 0; i < 8; ++i) net->push_back(nn::Linear(nn::LinearOptions(256, 256).bias(false)));
  const int64_t layer_bytes = 256 * 256 * 4;
  const int64_t before = memory::stats(kCPU).allocated.current;
  memory::reset_peak(kCPU);
  EXPECT_EQ(nn::quant::quantize_dynamic(*net), 8);
  const int64_t rise = memory::stats(kCPU).allocated.peak - before;
  EXPECT_LT(rise, layer_bytes) << "the arena rose by " << rise << " bytes during the rewrite";
  // The f32 weights are gone; what stays is int8 weights and one f32 scale per row.
  EXPECT_LE(memory::stats(kCPU).allocated.current,
            before - 8 * layer_bytes + 8 * (layer_bytes / 4 + 256 * 4));
}

// A container whose child_replaced fails: the tree keeps its old module.
struct RefusingListImpl : nn::Module {
  RefusingListImpl() { register_module("0", nn::Linear(4, 4)); }
  Tensor forward(const Tensor& x) override { return x; }

 protected:
  void child_replaced(const std::string&, const std::shared_ptr<nn::Module>& m) override {
    FRUGAL_CHECK(m->type_name() == "Linear", "RefusingList takes Linears only");
  }
};
FRUGAL_MODULE(RefusingList);

TEST(Rewrite, AFailingChildReplacedLeavesTheOldModule) {
  RefusingList net;
  nn::Module* const old = net->named_modules().at("0").get();
  expect_error<Error>([&] { net->replace_module("0", nn::ReLU().ptr()); }, {"Linears only"});
  EXPECT_EQ(net->named_modules().at("0").get(), old);
  expect_error<Error>([&] { nn::quant::quantize_dynamic(*net); }, {"Linears only"});
  EXPECT_EQ(net->named_modules().at("0").get(), old);
}

// shrink refuses before it makes any mask permanent.
TEST(Rewrite, ARefusedShrinkKeepsTheMasks) {
  manual_seed(11);
  nn::Linear kept(8, 16);
  nn::Sequential net{kept, nn::ReLU(), nn::Linear(16, 4)};
  nn::prune::ln_structured(*kept, "weight", 0.5, 2, 0);
  expect_error<Error>([&] { nn::prune::shrink(*net); }, {"prune::shrink", "'0'", "pointer of yours"});
  EXPECT_TRUE(kept->mask("weight").defined());
  EXPECT_EQ(type_at(*net, "0"), "Linear");
}

TEST(Rewrite, QuantizeDynamicRefusesTheGptWhoseBlocksCallTheirMembers) {
  manual_seed(8);
  nn::GPT gpt(nn::GPTConfig{.vocab = 13, .d_model = 16, .n_layers = 2, .n_heads = 2, .context = 8});
  const auto before = gpt->named_modules();
  expect_error<Error>([&] { nn::quant::quantize_dynamic(*gpt); }, {"quantize_dynamic", "held outside"});
  const auto after = gpt->named_modules();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i].value().get(), before[i].value().get()) << i;
}

}  // namespace
}  // namespace frugal

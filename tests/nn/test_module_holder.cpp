// The libtorch habits of nn/: module holders (FRUGAL_MODULE and the built-in ones), register_module and
// push_back taking holders, named_parameters() as an ordered dict, summary() naming a custom module by its
// class, and a forward taken by value caught at compile time (the compile failure itself is the ctest
// nn_forward_by_value_*, tests/nn/compile_fail_forward_by_value.cpp).
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "frugal.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::uniform;

struct TwoLayerImpl : nn::Module {
  nn::Linear fc1{nullptr}, fc2{nullptr};
  TwoLayerImpl(int64_t in, int64_t out)
      : fc1(register_module("fc1", nn::Linear(in, 8))), fc2(register_module("fc2", nn::Linear(8, out))) {}
  Tensor forward(const Tensor& x) override { return fc2(relu(fc1(x))); }
};
FRUGAL_MODULE(TwoLayer);

struct DefaultNetImpl : nn::Module {
  nn::Sequential body{nullptr};
  DefaultNetImpl() : body(register_module("body", nn::Sequential{nn::Linear(3, 3), nn::Tanh()})) {}
  Tensor forward(const Tensor& x) override { return body(x); }
};
FRUGAL_MODULE(DefaultNet);

TEST(ModuleHolder, BuiltFromTheImplsConstructorArguments) {
  TwoLayer net(4, 3);
  ASSERT_FALSE(net.is_empty());
  EXPECT_TRUE(bool(net));
  EXPECT_EQ(net->fc1->weight.shape(), (Shape{8, 4}));
  EXPECT_EQ((*net).fc2->weight.shape(), (Shape{3, 8}));
  EXPECT_EQ(net->parameters().size(), 4u);
  const Tensor x = uniform({2, 4}, -1, 1, DType::F32, 1);
  EXPECT_EQ(net(x).to_vector<float>(), net->forward(x).to_vector<float>());  // operator() is forward
  EXPECT_EQ(net(x).shape(), (Shape{2, 3}));
  static_assert(std::is_same_v<decltype(net.ptr()), const std::shared_ptr<TwoLayerImpl>&>);

  // Copies share the module; conversions give the same object.
  TwoLayer copy = net;
  EXPECT_EQ(copy.get(), net.get());
  std::shared_ptr<nn::Module> as_module = net;
  std::shared_ptr<TwoLayerImpl> as_impl = net;
  EXPECT_EQ(as_module.get(), net.ptr().get());
  EXPECT_EQ(as_impl, net.ptr());
  EXPECT_EQ(net.ptr().use_count(), 4);

  // Built-in modules are holders too, with the same interface.
  nn::Linear fc(nn::LinearOptions(4, 2).bias(false));
  EXPECT_FALSE(fc->bias.defined());
  EXPECT_EQ(fc(x).shape(), (Shape{2, 2}));
  static_assert(std::is_same_v<nn::Linear::ContainedType, nn::LinearImpl>);
  static_assert(std::is_same_v<nn::Sequential::ContainedType, nn::SequentialImpl>);
  static_assert(std::is_same_v<nn::GPT::ContainedType, nn::GPTImpl>);
}

TEST(ModuleHolder, NullptrMakesAnEmptyHolderThatRefusesAccess) {
  nn::Linear fc{nullptr};
  EXPECT_TRUE(fc.is_empty());
  EXPECT_FALSE(bool(fc));
  EXPECT_EQ(fc.ptr(), nullptr);
  expect_error<Error>([&] { (void)fc->weight; }, {"Linear", "empty", "nullptr"});
  expect_error<Error>([&] { fc(randn({1, 2})); }, {"Linear", "empty"});
  nn::Sequential seq{nullptr};  // the nullptr constructor, not a one-module list
  EXPECT_TRUE(seq.is_empty());
  fc = nn::Linear(2, 2);
  EXPECT_FALSE(fc.is_empty());
  fc = nullptr;
  EXPECT_TRUE(fc.is_empty());
}

TEST(ModuleHolder, DefaultConstructionMakesTheModule) {
  DefaultNet net;
  ASSERT_FALSE(net.is_empty());
  EXPECT_EQ(net->body->size(), 2u);
  EXPECT_EQ(net(randn({2, 3})).shape(), (Shape{2, 3}));
  nn::Sequential seq;  // an empty Sequential, not an empty holder
  ASSERT_FALSE(seq.is_empty());
  EXPECT_TRUE(seq->empty());
}

TEST(ModuleHolder, RegisterModuleAndPushBackTakeHolders) {
  TwoLayer net(4, 3);
  std::vector<std::string> names;
  for (const auto& c : net->named_children()) names.push_back(c.key());
  EXPECT_EQ(names, (std::vector<std::string>{"fc1", "fc2"}));
  // The holder member and the registered child are one module.
  EXPECT_EQ(net->named_children()["fc1"].get(), net->fc1.get());

  nn::Sequential seq;
  nn::Linear first = seq->push_back(nn::Linear(4, 5));  // returns the holder as given
  seq->push_back(nn::ReLU());
  seq->push_back(std::make_shared<nn::LinearImpl>(5, 2));  // shared_ptrs still work
  ASSERT_EQ(seq->size(), 3u);
  EXPECT_EQ((*seq)[0].get(), first.get());
  EXPECT_EQ(seq->named_parameters().keys(),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ(seq(randn({3, 4})).shape(), (Shape{3, 2}));

  nn::ModuleList list{nn::Linear(2, 2), TwoLayer(2, 2)};
  EXPECT_EQ(list->size(), 2u);
  EXPECT_NE(list->at<TwoLayerImpl>(1), nullptr);
  EXPECT_EQ(list->at<nn::LinearImpl>(1), nullptr);
}

TEST(ModuleHolder, NamedParametersIsAnOrderedDict) {
  TwoLayer net(4, 3);
  const auto params = net->named_parameters();
  ASSERT_EQ(params.size(), 4u);
  std::vector<std::string> keys;
  for (const auto& p : params) {
    keys.push_back(p.key());
    EXPECT_TRUE(p.value().requires_grad()) << p.key();
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  EXPECT_EQ(params.keys(), keys);
  EXPECT_EQ(params.values().size(), 4u);
  EXPECT_TRUE(params.values()[2].is_same(net->fc2->weight));
  EXPECT_TRUE(params["fc2.weight"].is_same(net->fc2->weight));
  EXPECT_TRUE(params.contains("fc1.bias"));
  EXPECT_FALSE(params.contains("fc3.bias"));
  EXPECT_EQ(params[1].key(), "fc1.bias");  // by position, in insertion order
  // A missing key is an error that names it.
  expect_error<IndexError>([&] { (void)params["fc3.weight"]; },
                           {"named_parameters", "fc3.weight", "contains"});
  // .first / .second and structured bindings still work.
  EXPECT_EQ(params[0].first, "fc1.weight");
  for (const auto& [name, t] : net->named_buffers()) ADD_FAILURE() << "unexpected buffer " << name;
  EXPECT_EQ(net->named_modules().keys(), (std::vector<std::string>{"fc1", "fc2"}));

  OrderedDict<std::string, int> d("counts");
  d.insert("b", 2);
  d.insert("a", 1);
  EXPECT_EQ(d.keys(), (std::vector<std::string>{"b", "a"}));
  expect_error<Error>([&] { d.insert("a", 3); }, {"counts", "'a'", "already"});
}

TEST(ModuleHolder, SummaryNamesACustomModuleByItsClass) {
  TwoLayer net(4, 3);
  EXPECT_EQ(net->type_name(), "TwoLayer");  // TwoLayerImpl, its namespaces and "Impl" dropped
  EXPECT_EQ(net->fc1->type_name(), "Linear");
  const std::string s = net->summary();
  EXPECT_NE(s.find("TwoLayer"), std::string::npos) << s;
  EXPECT_EQ(s.find("Module "), std::string::npos) << s;
  EXPECT_EQ(nn::demangled_type_name(typeid(nn::LayerNormImpl)), "LayerNorm");
  EXPECT_EQ(nn::demangled_type_name(typeid(Tensor)), "Tensor");
  EXPECT_EQ(nn::demangled_type_name(typeid(OrderedDict<std::string, Tensor>)).rfind("OrderedDict<", 0), 0u);
}

// The detection behind Note [forward by value]: these static_asserts are the compile-time check itself. The
// modules hide Module::forward on purpose (that is what is detected), which clang warns of.
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Woverloaded-virtual"
#endif
struct ByValueImpl : nn::Module {
  Tensor forward(Tensor x) { return x; }
};
struct ByNonConstRefImpl : nn::Module {
  Tensor forward(Tensor& x) { return x; }
};
struct OverridesImpl : nn::Module {
  Tensor forward(const Tensor& x) override { return x; }
};
struct TwoInputsImpl : nn::Module {
  Tensor forward(const Tensor& x, const Tensor& y) { return add(x, y); }
};
#if defined(__clang__)
#pragma clang diagnostic pop
#endif
static_assert(!nn::module_detail::forward_overrides_v<ByValueImpl>);
static_assert(!nn::module_detail::forward_overrides_v<ByNonConstRefImpl>);
static_assert(nn::module_detail::forward_overrides_v<OverridesImpl>);
static_assert(nn::module_detail::forward_overrides_v<TwoInputsImpl>);
static_assert(nn::module_detail::forward_overrides_v<nn::ModuleListImpl>);  // no forward of its own
static_assert(nn::module_detail::forward_overrides_v<nn::GPTImpl>);

FRUGAL_MODULE(TwoInputs);

TEST(ModuleHolder, AForwardOfOtherArgumentsStillGetsAHolder) {
  TwoInputs adder;
  EXPECT_EQ(adder(ones({2}), ones({2})).to_vector<float>(), (std::vector<float>{2, 2}));
}

}  // namespace
}  // namespace frugal

// frugal::save / frugal::load (io/serialize.h): a module's weights and an optimizer's state round-trip
// through a file; wrong shapes, missing files and another kind's file are clear errors that change nothing.
#include "io/serialize.h"

#include "frugal.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

namespace F = nn::functional;
using testing::expect_error;
using testing::uniform;

class Serialize : public testing::ScratchDirTest {};

std::vector<std::vector<double>> values_of(const nn::Module& m) {
  std::vector<std::vector<double>> out;
  for (const auto& [name, t] : m.state_dict()) out.push_back(t.to_vector<double>());
  return out;
}

void train_step(const nn::Sequential& net, optim::Optimizer& opt, uint64_t seed) {
  opt.zero_grad();
  F::mse_loss(net(uniform({4, 3}, -1, 1, DType::F32, seed)), uniform({4, 2}, -1, 1, DType::F32, seed + 1))
      .backward();
  opt.step();
}

TEST_F(Serialize, ModuleRoundTrip) {
  manual_seed(1);
  nn::Sequential a{nn::Linear(3, 5), nn::ReLU(), nn::Linear(5, 2)};
  manual_seed(2);
  nn::Sequential b{nn::Linear(3, 5), nn::ReLU(), nn::Linear(5, 2)};
  ASSERT_NE(values_of(*a), values_of(*b));
  const Tensor handle = (*b)[0]->parameters()[0];
  save(a, path("net.safetensors"));
  load(b, path("net.safetensors"));
  EXPECT_EQ(values_of(*a), values_of(*b));
  EXPECT_TRUE(handle.is_same((*b)[0]->parameters()[0]));  // copied into the existing tensors
  // The file is plain safetensors with the module's state dict.
  const io::SafetensorsFile f = io::load_safetensors(path("net.safetensors"));
  EXPECT_EQ(f.tensors.size(), 4u);
  EXPECT_EQ(f.metadata.at("module"), "Sequential");
  // A module (not a holder) works the same.
  save(*(*a)[2], path("head.safetensors"));
  nn::Linear head(5, 2);
  load(*head, path("head.safetensors"));
  EXPECT_EQ(head->weight.to_vector<float>(), (*a)[2]->parameters()[0].to_vector<float>());
}

TEST_F(Serialize, ModuleBadInputsChangeNothing) {
  nn::Linear small(3, 2), wide(4, 2);
  save(small, path("small.safetensors"));
  const auto before = values_of(*wide);
  expect_error<ShapeError>([&] { load(wide, path("small.safetensors")); },
                           {"small.safetensors", "weight", "expected [2, 4], got [2, 3]"});
  EXPECT_EQ(values_of(*wide), before);
  expect_error<Error>([&] { load(wide, path("missing.safetensors")); }, {"missing.safetensors"});
  EXPECT_EQ(values_of(*wide), before);
  nn::Sequential extra{nn::Linear(3, 2), nn::Linear(2, 2)};
  expect_error<ShapeError>(
      [&] { load(extra, path("small.safetensors")); },
      {"missing keys: 0.bias, 0.weight, 1.bias, 1.weight", "unexpected keys: bias, weight"});
}

TEST_F(Serialize, OptimizerRoundTrip) {
  manual_seed(3);
  nn::Sequential net{nn::Linear(3, 4), nn::Tanh(), nn::Linear(4, 2)};
  optim::Adam opt(net->parameters(), optim::AdamOptions(1e-2));
  for (uint64_t s = 0; s < 3; ++s) train_step(net, opt, 10 * s);
  save(net, path("net.safetensors"));
  save(opt, path("adam.safetensors"));

  // A fresh model and optimizer loaded from the files continue exactly as the original does.
  manual_seed(4);
  nn::Sequential again{nn::Linear(3, 4), nn::Tanh(), nn::Linear(4, 2)};
  optim::Adam opt2(again->parameters(), optim::AdamOptions(1e-3));
  load(again, path("net.safetensors"));
  load(opt2, path("adam.safetensors"));
  EXPECT_EQ(opt2.param_groups()[0].options().get_lr(), 1e-2);
  train_step(net, opt, 100);
  train_step(again, opt2, 100);
  EXPECT_EQ(values_of(*again), values_of(*net));
}

TEST_F(Serialize, OptimizerBadInputsAreClearErrors) {
  nn::Linear fc(3, 2);
  optim::Adam adam(fc->parameters(), optim::AdamOptions(1e-2));
  optim::SGD sgd(fc->parameters(), optim::SGDOptions(0.1));
  sum(fc(ones({1, 3}))).backward();
  adam.step();  // state to save
  save(adam, path("adam.safetensors"));
  save(fc, path("fc.safetensors"));
  expect_error<Error>([&] { load(sgd, path("adam.safetensors")); }, {"adam.safetensors", "Adam", "SGD"});
  expect_error<Error>([&] { load(adam, path("fc.safetensors")); }, {"fc.safetensors", "no optimizer state"});
  expect_error<Error>([&] { load(fc, path("adam.safetensors")); }, {"adam.safetensors", "optimizer Adam"});
  expect_error<Error>([&] { load(adam, path("missing.safetensors")); }, {"missing.safetensors"});
  nn::Linear other(4, 2);
  optim::Adam adam_other(other->parameters(), optim::AdamOptions(1e-2));
  expect_error<Error>([&] { load(adam_other, path("adam.safetensors")); },
                      {"adam.safetensors", "does not fit"});
}

}  // namespace
}  // namespace frugal

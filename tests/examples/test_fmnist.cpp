// The Fashion-MNIST trainer: the first 10 losses of W1 and W2 equal PyTorch's from the same weights and
// batches (golden fixture tests/fixtures/fmnist_golden.json), a resumed run continues the same loss sequence,
// a memory limit below what a step needs fails with the advice while gradient accumulation fits under it,
// and a checkpoint resumes whole or not at all (weights and state of different saves, another optimizer, a
// save killed or failing at any step).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "examples/fmnist.h"
#include "tests/test_util.h"

namespace {

using namespace frugal;

bool have_data() {
  return std::filesystem::exists(std::string(data::kFashionMNISTRoot) + "/train-images-idx3-ubyte.gz");
}

// Element i of a parameter with fan-in f and seed s: (2u - 1) / sqrt(f), u = ((i * 2654435761 + s * 40503)
// mod 2^32) / 2^32 -- the formula tests/fixtures/gen_fmnist_golden.py uses.
void fill_hashed(const Tensor& t, int64_t fan_in, uint64_t seed) {
  std::vector<float> v(size_t(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    const uint64_t h = (uint64_t(i) * 2654435761ull + seed * 40503ull) % (uint64_t(1) << 32);
    v[i] = float((2.0 * (double(h) / 4294967296.0) - 1.0) / std::sqrt(double(fan_in)));
  }
  NoGradGuard guard;
  Tensor dst = t;
  dst.copy_(tensor<float>(v, t.shape()));
}

// The first 10 losses of a model from hashed weights (parameter k takes seed k; a bias uses its weight's
// fan-in) on the training set in file order, against tests/fixtures/fmnist_golden.json.
void expect_golden(const char* workload, nn::SequentialImpl& model, int64_t batch) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  std::ifstream in(std::string(FRUGAL_FIXTURES_DIR) + "/fmnist_golden.json");
  ASSERT_TRUE(in) << "missing tests/fixtures/fmnist_golden.json";
  const auto fixture = nlohmann::json::parse(in)[workload];
  ASSERT_EQ(fixture["batch"].get<int64_t>(), batch);
  const auto golden = fixture["losses"].get<std::vector<double>>();
  ASSERT_EQ(golden.size(), 10u);
  const std::vector<Tensor> params = model.parameters();
  int64_t fan_in = 1;
  for (size_t k = 0; k < params.size(); ++k) {
    if (params[k].dim() > 1) fan_in = params[k].numel() / params[k].size(0);
    fill_hashed(params[k], fan_in, uint64_t(k));
  }
  optim::Adam opt(params, optim::AdamOptions(1e-3));
  data::DataLoader loader(std::make_shared<data::FashionMNIST>(),
                          data::DataLoaderOptions().batch_size(batch));
  const std::vector<double> losses = fmnist::train_epoch(model, opt, loader, 0, 10, 1);
  ASSERT_EQ(losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i)
    EXPECT_NEAR(losses[i], golden[i], 2e-5 * golden[i])
        << workload << " step " << i;  // f32 sums in another order
}

TEST(Fmnist, FirstTenLossesMatchPyTorchMlp) { expect_golden("W1", *fmnist::make_mlp(), 128); }
TEST(Fmnist, FirstTenLossesMatchPyTorchCnn) { expect_golden("W2", *fmnist::make_cnn(), 64); }

TEST(Fmnist, ResumedRunContinuesTheSameLosses) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  auto train = std::make_shared<data::FashionMNIST>();
  auto run = [&](int64_t from_epoch, int64_t to_epoch, const std::string& resume, const std::string& save) {
    manual_seed(5);
    auto model = fmnist::make_mlp();
    auto opt = fmnist::make_optimizer("adam", model->parameters(), 1e-3);
    data::DataLoader loader(train, data::DataLoaderOptions().batch_size(64).shuffle(true).seed(3));
    fmnist::TrainingState st;
    if (!resume.empty()) st = fmnist::load_checkpoint(resume, *model, *opt);
    EXPECT_EQ(st.epoch, from_epoch);
    std::vector<double> losses;
    for (int64_t e = from_epoch; e < to_epoch; ++e) {
      const auto l = fmnist::train_epoch(*model, *opt, loader, e, 6, 1);
      losses.insert(losses.end(), l.begin(), l.end());
      st.epoch = e + 1;
      st.rng = default_generator().state();
      if (!save.empty()) fmnist::save_checkpoint(save, *model, *opt, st, {"mlp"});
    }
    return losses;
  };
  const std::string path =
      std::filesystem::temp_directory_path() / ("frugal_resume_" + std::to_string(getpid()));
  const std::vector<double> straight = run(0, 3, "", "");
  const std::vector<double> first = run(0, 1, "", path);
  const std::vector<double> rest = run(1, 3, path, "");
  std::vector<double> joined = first;
  joined.insert(joined.end(), rest.begin(), rest.end());
  EXPECT_EQ(joined, straight);  // bit for bit
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".state");
}

// Note [the model file is the whole model]: the weights file alone gives the trained model's accuracy, with
// the input's normalisation read from its metadata and applied by hand to the raw test images, as a user of
// another tool would.
TEST(Fmnist, WeightsFileCarriesItsPreprocessing) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  auto train = std::make_shared<data::FashionMNIST>();
  auto test = std::make_shared<data::FashionMNIST>(data::kFashionMNISTRoot, data::Split::Test);
  const auto [mean, std] = train->pixel_stats();
  train->normalize(mean, std);
  test->normalize(mean, std);
  manual_seed(2);
  auto model = fmnist::make_mlp();
  auto opt = fmnist::make_optimizer("adam", model->parameters(), 1e-3);
  data::DataLoader loader(train, data::DataLoaderOptions().batch_size(128).shuffle(true).seed(1));
  fmnist::train_epoch(*model, *opt, loader, 0, 60, 1);
  data::DataLoader test_loader(test, data::DataLoaderOptions().batch_size(250));
  const double trained = fmnist::evaluate(*model, test_loader);
  const std::string path =
      std::filesystem::temp_directory_path() / ("frugal_model_file_" + std::to_string(getpid()));
  fmnist::save_checkpoint(path, *model, *opt, {}, {"mlp", mean, std});

  const io::SafetensorsFile file = io::load_safetensors(path);
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".state");
  EXPECT_EQ(file.metadata.at("model"), "mlp");
  EXPECT_EQ(file.metadata.at("input_shape"), "[1, 28, 28]");
  EXPECT_EQ(file.metadata.at("input_scale"), "1/255");
  const auto classes = nlohmann::json::parse(file.metadata.at("classes")).get<std::vector<std::string>>();
  ASSERT_EQ(classes.size(), 10u);
  EXPECT_EQ(classes[0], "T-shirt/top");
  EXPECT_EQ(classes[9], "Ankle boot");
  const double m = std::stod(file.metadata.at("input_mean")), s = std::stod(file.metadata.at("input_std"));
  EXPECT_EQ(m, mean);  // written to round-trip exactly
  EXPECT_EQ(s, std);
  EXPECT_NEAR(m, 0.2860, 1e-4);
  EXPECT_NEAR(s, 0.3530, 1e-4);

  auto loaded = fmnist::make_mlp();
  loaded->load_state_dict(file.tensors);
  loaded->eval();
  InferenceMode no_record;
  const int64_t n = test->size();
  const Tensor x = ((test->images().to(DType::F32) / 255.0 - m) / s).reshape({n, 1, 28, 28});
  const Tensor predicted = ops::argmax(loaded->forward(x), 1);
  const double accuracy =
      double(ops::sum(ops::eq(predicted, test->labels().to(DType::I64))).item<int64_t>()) / double(n);
  EXPECT_GT(trained, 0.6);
  EXPECT_NEAR(accuracy, trained, 3e-4);  // at most 3 of 10,000 predictions flip with the rounding order
}

// --amp: the first 20 losses of W1 (same weights, same batches) under bf16 and f16 autocast stay near f32's,
// and the f16 run goes through its loss scaler.
TEST(Fmnist, AutocastFollowsF32) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  auto train = std::make_shared<data::FashionMNIST>();
  struct Run {
    std::vector<double> losses;
    bool scaled = false;
    int64_t clean_steps = 0;
  };
  auto run = [&](std::optional<DType> amp) {
    manual_seed(9);
    auto model = fmnist::make_mlp();
    auto opt = fmnist::make_optimizer("adam", model->parameters(), 1e-3);
    data::DataLoader loader(train, data::DataLoaderOptions().batch_size(128).shuffle(true).seed(4));
    fmnist::Precision precision(amp);
    Run r;
    r.losses = fmnist::train_epoch(*model, *opt, loader, 0, 20, 1, {}, &precision);
    r.scaled = precision.scaler.is_enabled();
    r.clean_steps = precision.scaler.growth_tracker();
    return r;
  };
  const Run f32 = run(std::nullopt);
  for (DType dt : {DType::BF16, DType::F16}) {
    const Run low = run(dt);
    ASSERT_EQ(low.losses.size(), f32.losses.size());
    const double tol = dt == DType::BF16 ? 0.03 : 0.01;
    for (size_t i = 0; i < f32.losses.size(); ++i)
      EXPECT_NEAR(low.losses[i], f32.losses[i], tol * f32.losses[i]) << dtype_name(dt) << " step " << i;
    EXPECT_EQ(low.scaled, dt == DType::F16);
    EXPECT_EQ(low.clean_steps, dt == DType::F16 ? 20 : 0);  // f16: 20 clean steps, none skipped
  }
  EXPECT_LT(f32.losses.back(), f32.losses.front());
}

// --- checkpoints (Note [checkpoint pairs] in io/checkpoint.h); no data needed
// ------------------------------------------------------------------------

// A model and optimizer after `steps` steps on random batches (the same ones for the same seed).
struct Trained {
  nn::Sequential model{nullptr};
  std::unique_ptr<optim::Optimizer> opt;
};
Trained trained(const std::string& optimizer, int steps, uint64_t seed) {
  manual_seed(seed);
  Trained t{fmnist::make_mlp(), nullptr};
  t.opt = fmnist::make_optimizer(optimizer, t.model->parameters(), 1e-3);
  for (int i = 0; i < steps; ++i) {
    t.opt->zero_grad();
    const data::Batch b{frugal::testing::uniform({4, 1, 28, 28}, 0, 1, DType::F32, seed * 100 + uint64_t(i)),
                        randint(0, 10, {4}, DType::I64)};
    fmnist::forward_backward(*t.model, b, 1.0);
    t.opt->step();
  }
  return t;
}

// The bytes of every tensor of a dict, by name.
std::map<std::string, std::vector<double>> values_of(const StateDict& d) {
  std::map<std::string, std::vector<double>> v;
  for (const auto& [name, t] : d) v[name] = t.to_vector<double>();
  return v;
}

class FmnistCheckpoint : public frugal::testing::ScratchDirTest {
 protected:
  void TearDown() override {
    io::detail::inject_fault(0);
    frugal::testing::ScratchDirTest::TearDown();
  }
};

// What a resume found: the epoch and every tensor of the model and the optimizer.
struct Resumed {
  int64_t epoch = -1;
  std::map<std::string, std::vector<double>> weights, state;
  bool operator==(const Resumed&) const = default;
};
Resumed resume(const std::string& path, const std::string& optimizer = "adam") {
  Trained t = trained(optimizer, 0, 99);
  Resumed r;
  r.epoch = fmnist::load_checkpoint(path, *t.model, *t.opt).epoch;
  r.weights = values_of(t.model->state_dict());
  r.state = values_of(t.opt->state_dict());
  return r;
}
Resumed saved(const Trained& t, int64_t epoch) {
  return {epoch, values_of(t.model->state_dict()), values_of(t.opt->state_dict())};
}

TEST_F(FmnistCheckpoint, ResumeRefusesWeightsAndStateOfDifferentSaves) {
  // Epoch 2's weights beside epoch 1's state: what a save killed between its two renames used to leave.
  const std::string p = path("ckpt"), q = path("other");
  const Trained one = trained("adam", 1, 1), two = trained("adam", 2, 2);
  fmnist::save_checkpoint(p, *one.model, *one.opt, {1, {}}, {"mlp"});
  fmnist::save_checkpoint(q, *two.model, *two.opt, {2, {}}, {"mlp"});
  std::filesystem::copy_file(q, p, std::filesystem::copy_options::overwrite_existing);
  Trained fresh = trained("adam", 0, 3);
  const Resumed before = saved(fresh, -1);
  frugal::testing::expect_error<Error>([&] { fmnist::load_checkpoint(p, *fresh.model, *fresh.opt); },
                                       {p, "another save"});
  EXPECT_TRUE(saved(fresh, -1) == before) << "the refused resume changed the model or the optimizer";
}

TEST_F(FmnistCheckpoint, ResumeRefusesTheStateOfAnotherOptimizer) {
  const std::string p = path("ckpt");
  const Trained adam = trained("adam", 1, 1);
  fmnist::save_checkpoint(p, *adam.model, *adam.opt, {1, {}}, {"mlp"});
  for (const char* other : {"adamw", "sgd", "adam8bit"}) {
    SCOPED_TRACE(other);
    Trained fresh = trained(other, 0, 3);
    const Resumed before = saved(fresh, -1);
    frugal::testing::expect_error<Error>([&] { fmnist::load_checkpoint(p, *fresh.model, *fresh.opt); },
                                         {p, "Adam", fresh.opt->name(), "--optimizer"});
    EXPECT_TRUE(saved(fresh, -1) == before) << "the refused resume changed the model or the optimizer";
  }
  EXPECT_TRUE(resume(p) == saved(adam, 1));
}

// --optimizer adam8bit: its codes and scales go into the checkpoint and come back whole (W1's first layer,
// 784 x 256, is in 8 bits).
TEST_F(FmnistCheckpoint, Adam8bitStateResumesWhole) {
  const std::string p = path("ckpt");
  const Trained t = trained("adam8bit", 2, 1);
  EXPECT_EQ(t.opt->state_dict().count("state.0.exp_avg_codes"), 1u);
  fmnist::save_checkpoint(p, *t.model, *t.opt, {1, {}}, {"mlp"});
  EXPECT_TRUE(resume(p, "adam8bit") == saved(t, 1));
}

TEST_F(FmnistCheckpoint, ResumeRefusesACheckpointWithoutTheLossScalersState) {
  const std::string p = path("ckpt");
  const Trained f32 = trained("adam", 1, 1);
  fmnist::save_checkpoint(p, *f32.model, *f32.opt, {1, {}}, {"mlp"});  // no scaler: saved without --amp f16
  Trained fresh = trained("adam", 0, 3);
  const Resumed before = saved(fresh, -1);
  fmnist::Precision f16(DType::F16);
  frugal::testing::expect_error<Error>(
      [&] { fmnist::load_checkpoint(p, *fresh.model, *fresh.opt, &f16.scaler); },
      {p, "no loss scaler state", "--amp f16"});
  EXPECT_TRUE(saved(fresh, -1) == before) << "the refused resume changed the model or the optimizer";
}

// Note [save fault injection]: a save of a whole checkpoint (weights and state) made to fail, or killed, at
// each of its steps in turn; every time, a resume gets exactly the old checkpoint or exactly the new one.
TEST_F(FmnistCheckpoint, ASaveStoppedAtAnyStepLeavesTheOldCheckpointOrTheNew) {
  const Trained old_run = trained("adam", 1, 1), new_run = trained("adam", 2, 2);
  const Resumed old_ckpt = saved(old_run, 1), new_ckpt = saved(new_run, 2);
  const std::string dry = path("dry");
  fmnist::save_checkpoint(dry, *old_run.model, *old_run.opt, {1, {}}, {"mlp"});
  io::detail::inject_fault(0);
  fmnist::save_checkpoint(dry, *new_run.model, *new_run.opt, {2, {}}, {"mlp"});
  const int64_t steps = io::detail::fault_steps();
  ASSERT_GT(steps, 10);
  for (const auto kind : {io::detail::Fault::Error, io::detail::Fault::Crash}) {
    int got_old = 0, got_new = 0;
    for (int64_t n = 1; n <= steps; ++n) {
      const bool crash = kind == io::detail::Fault::Crash;
      SCOPED_TRACE((crash ? "killed at step " : "failing at step ") + std::to_string(n) + " of " +
                   std::to_string(steps));
      const std::string p = path(std::to_string(n) + (crash ? "k" : "e"));
      fmnist::save_checkpoint(p, *old_run.model, *old_run.opt, {1, {}}, {"mlp"});
      io::detail::inject_fault(n, kind);
      bool threw = false;
      try {
        fmnist::save_checkpoint(p, *new_run.model, *new_run.opt, {2, {}}, {"mlp"});
      } catch (const io::detail::SimulatedCrash&) {
        threw = crash;
      } catch (const Error& e) {
        threw = !crash;
      }
      io::detail::inject_fault(0);
      EXPECT_TRUE(threw);
      const Resumed r = resume(p);
      EXPECT_TRUE(r == old_ckpt || r == new_ckpt)
          << "a mixture: epoch " << r.epoch << ", weights of the "
          << (r.weights == new_ckpt.weights ? "new" : "old") << " save, optimizer state of the "
          << (r.state == new_ckpt.state ? "new" : "old") << " save";
      (r == new_ckpt ? got_new : got_old)++;
    }
    EXPECT_GT(got_old, 0);  // the sweep reached both sides of the commit point
    EXPECT_GT(got_new, 0);
  }
}

TEST(Fmnist, MemoryLimitFailsWithAdviceAndAccumulationFits) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  std::shared_ptr<data::FashionMNIST> train;
  int64_t dataset_bytes = 0;
  {
    const int64_t before = memory::stats().allocated.current;
    train = std::make_shared<data::FashionMNIST>();
    dataset_bytes = memory::stats().allocated.current - before;
  }
  // Two steps of the MLP on batches of 4096 under a limit; returns whether they fit.
  auto fits = [&](int accum, int64_t limit, std::string* message) {
    memory::empty_cache();
    memory::set_memory_limit(kCPU, limit);
    bool ok = true;
    try {
      manual_seed(1);
      auto model = fmnist::make_mlp();
      optim::Adam opt(model->parameters(), optim::AdamOptions(1e-3));
      data::DataLoader loader(train, data::DataLoaderOptions().batch_size(4096 / accum).prefetch(0));
      fmnist::train_epoch(*model, opt, loader, 0, 2, accum);
    } catch (const OutOfMemoryError& e) {
      ok = false;
      if (message) *message = e.what();
    }
    memory::set_memory_limit(kCPU, 0);
    return ok;
  };
  // The peak bytes held from the system above the dataset (kept in memory) in a run without a limit.
  auto peak_above_dataset = [&](int accum) {
    memory::empty_cache();
    memory::reset_peak();
    EXPECT_TRUE(fits(accum, 0, nullptr)) << "accum " << accum << " without a limit";
    return memory::stats().reserved.peak - dataset_bytes;
  };
  const int64_t whole = peak_above_dataset(1), accumulated = peak_above_dataset(16);
  // Accumulating over 16 micro-batches of 256 holds less than half of what a batch of 4096 holds.
  EXPECT_LT(2 * accumulated, whole) << "accum 1: " << whole << " bytes, accum 16: " << accumulated;
  // The arena holds whole segments (a 12.8 MB batch in a 14 MiB one, 4 MiB activations carved from 20 MiB
  // ones): a batch of 4096 needs about 41 MiB above the dataset, 16 micro-batches about 9 MiB, and the budget
  // is 32 MiB. The system allocator holds the live tensors alone (rounded to 64 bytes): the batch of 4096
  // needs about 31.6 MiB there and fits in 32 MiB, so its budget lies halfway between the two runs' needs.
  const bool arena = std::string(memory::allocator(kCPU).kind()) == "arena";
  const int64_t budget = arena ? int64_t(32) << 20 : (whole + accumulated) / 2;
  EXPECT_LT(accumulated, budget);
  EXPECT_GT(whole, budget);
  const int64_t limit = dataset_bytes + budget;
  std::string message;
  EXPECT_FALSE(fits(1, limit, &message));
  EXPECT_NE(message.find("limit"), std::string::npos) << message;
  EXPECT_NE(message.find("accum"), std::string::npos) << message;
  EXPECT_TRUE(fits(16, limit, nullptr));
}

}  // namespace

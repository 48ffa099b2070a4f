// The Fashion-MNIST trainer: the first 10 losses of W1 and W2 equal PyTorch's from the same weights and
// batches (golden fixture tests/fixtures/fmnist_golden.json), a resumed run continues the same loss sequence,
// and a memory limit below what a step needs fails with the advice while gradient accumulation fits under it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "examples/fmnist.h"

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
void expect_golden(const char* workload, nn::Sequential& model, int64_t batch) {
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

// The compression report (examples/compress.h) on a briefly trained W1: each row's model bytes are what its
// technique should leave in the arena (the f32 model's blocks exactly; the masks' bits on top; a quarter for
// int8; less for CSR and the shrunk model), the file holds the int8 weights as I8, and every row still
// classifies.
#include <gtest/gtest.h>

#include <filesystem>

#include "examples/compress.h"
#include "tests/test_util.h"

namespace frugal::testing {
namespace {

bool have_data() {
  return std::filesystem::exists(std::filesystem::path(data::kFashionMNISTRoot) /
                                 "train-images-idx3-ubyte.gz");
}

int64_t block(int64_t bytes) { return (bytes + 511) / 512 * 512; }  // the arena's rounding

TEST(Compress, EachRowHoldsTheBytesItsTechniqueLeaves) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  compress::Setup s;
  s.model = "mlp";
  s.train_set = std::make_shared<data::FashionMNIST>(data::kFashionMNISTRoot, data::Split::Train);
  s.test_set = std::make_shared<data::FashionMNIST>(data::kFashionMNISTRoot, data::Split::Test);
  s.max_steps = 20, s.epochs = 1, s.student_epochs = 1, s.finetune_steps = 3, s.repeats = 1;
  {
    manual_seed(0);
    nn::Sequential m = fmnist::make_mlp();
    optim::Adam opt(m->parameters(), optim::AdamOptions(1e-3));
    data::DataLoader train(s.train_set, data::DataLoaderOptions().batch_size(128).shuffle(true).seed(0));
    fmnist::train_epoch(*m, opt, train, 0, s.max_steps, 1);
    for (auto& [k, t] : m->state_dict()) s.trained[k] = t.detach().clone();
  }
  std::vector<int64_t> first(256);
  std::iota(first.begin(), first.end(), int64_t(0));
  s.infer_batch = s.test_set->get_batch(first, DType::F32).input;
  s.scratch = (std::filesystem::temp_directory_path() / "frugal-test-compress.safetensors").string();
  const std::vector<compress::Row> rows = compress::run_rows(s);
  std::map<std::string, compress::Row> by;
  for (const compress::Row& r : rows) by[r.technique] = r;

  int64_t f32 = 0, masks = 0;
  for (const auto& [k, t] : s.trained) {
    f32 += block(t.numel() * 4);
    if (k.find("weight") != std::string::npos) masks += block((t.numel() + 7) / 8);
  }
  ASSERT_TRUE(by.count("f32"));
  EXPECT_EQ(by["f32"].model_bytes, f32);
  EXPECT_EQ(by["l1 global 80% + fine-tune"].model_bytes, f32 + masks);
  for (const char* t : {"int8 dynamic", "int8 static (histogram)", "int8 QAT + fine-tune",
                        "l1 global 80% + fine-tune + int8 dynamic"}) {
    ASSERT_TRUE(by.count(t)) << t;
    EXPECT_LE(by[t].model_bytes, 0.26 * double(f32)) << t;
    EXPECT_LE(by[t].file_bytes, 0.26 * double(by["f32"].file_bytes))
        << t << ": the int8 weights go to the file as I8";
  }
  EXPECT_LE(by["CSR at 90% + fine-tune"].model_bytes, 0.25 * double(f32));
  EXPECT_LE(by["structured 50% + shrink + fine-tune"].model_bytes, 0.5 * double(f32));
  EXPECT_LE(by["distilled student 784-64-10"].model_bytes, 0.2 * double(f32));
  for (const compress::Row& r : rows) {
    EXPECT_GT(r.test_accuracy, 0.3) << r.technique;  // 20 steps reach about 0.7
    EXPECT_GT(r.infer_ms, 0) << r.technique;
    EXPECT_GT(r.infer_ratio, 0) << r.technique;
    EXPECT_GT(r.file_bytes, 0) << r.technique;
  }
}

}  // namespace
}  // namespace frugal::testing

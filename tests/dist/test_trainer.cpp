// The char-GPT trainer under --ddp and --zero (examples/chargpt.h): a run saved and resumed on the same
// ranks continues each rank's loss sequence bit for bit (weights, ZeRO's gathered AdamW state, schedule and
// every rank's windows), and every rank ends with the same weights.
#include <filesystem>
#include <fstream>

#include "examples/chargpt.h"
#include "tests/dist/dist_test.h"
#include "tests/test_util.h"

namespace frugal::testing {
namespace {

class DistTrainer : public ::testing::Test {
 protected:
  // One folder for every rank: rank 0's process id names it (a checkpoint rank 0 writes, every rank reads).
  void SetUp() override {
    Tensor id = tensor<int64_t>({int64_t(::getpid())}, Shape{1});
    dist::broadcast(id, 0);
    dir_ = std::filesystem::temp_directory_path() /
           ("frugal_dist_trainer_" + std::to_string(id.item<int64_t>()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    if (dist::rank() == 0) {
      std::filesystem::remove_all(dir_);
      std::filesystem::create_directories(dir_);
      std::ofstream out(dir_ / "corpus", std::ios::binary);
      for (int i = 0; i < 400; ++i) out << "the quick brown fox " << i << " jumps over the lazy dog.\n";
    }
    dist::barrier();
  }
  void TearDown() override {
    dist::barrier();
    if (dist::rank() == 0) std::filesystem::remove_all(dir_);
  }

  // This rank's losses of steps [from, to), resuming from `resume` and saving to `save` when given.
  std::vector<double> run(const chargpt::Options& o, int64_t from, int64_t to, const std::string& resume,
                          const std::string& save, std::vector<std::vector<float>>* weights = nullptr) {
    const data::TextDataset train(data::TextDatasetOptions().root(dir_.string()).context(o.context));
    chargpt::Trainer t(o, train.vocab_size());
    if (!resume.empty()) t.load(resume);
    EXPECT_EQ(t.step(), from);
    std::vector<double> losses;
    while (t.step() < to) losses.push_back(t.train_step(train));
    if (!save.empty()) t.save(save, train.vocabulary());
    dist::barrier();  // rank 0 has written the checkpoint
    if (weights)
      for (const Tensor& p : t.model->parameters()) weights->push_back(p.to_vector<float>());
    return losses;
  }

  void expect_resume_continues(const chargpt::Options& o) {
    const std::string ckpt = (dir_ / "ckpt.safetensors").string();
    std::vector<std::vector<float>> weights;
    const std::vector<double> straight = run(o, 0, o.steps, "", "", &weights);
    std::vector<double> joined = run(o, 0, 3, "", ckpt);
    const std::vector<double> rest = run(o, 3, o.steps, ckpt, "");
    joined.insert(joined.end(), rest.begin(), rest.end());
    EXPECT_EQ(joined, straight);
    EXPECT_LT(straight.back(), straight.front());
    for (const std::vector<float>& w : weights) {
      const auto all = values_of_every_rank(tensor(w));
      for (const auto& v : all) ASSERT_EQ(v, all.front());
    }
  }

  static chargpt::Options tiny() {
    chargpt::Options o;
    o.layers = 1, o.width = 16, o.heads = 2, o.context = 8, o.batch = 4, o.steps = 7, o.lr = 1e-2, o.seed = 3;
    o.ddp = true;
    return o;
  }

  std::filesystem::path dir_;
};

TEST_F(DistTrainer, DdpResumeContinuesTheSameLosses) { expect_resume_continues(tiny()); }

TEST_F(DistTrainer, ZeroResumeContinuesTheSameLosses) {
  chargpt::Options o = tiny();
  o.zero = true;
  expect_resume_continues(o);
}

TEST_F(DistTrainer, WithAccumulationToo) {
  chargpt::Options o = tiny();
  o.accum = 2;
  o.batch = 8;
  expect_resume_continues(o);
}

}  // namespace
}  // namespace frugal::testing

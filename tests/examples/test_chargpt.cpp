// The char-GPT trainer (examples/chargpt.h): the first 5 losses of W3 equal PyTorch's from the same weights
// and corpus windows (golden fixture tests/fixtures/chargpt_golden.json), a resumed run continues the same
// loss sequence bit for bit (dense and sparse embeddings), and a mismatched checkpoint (without the
// SparseAdam state, or weights and state of different saves) is refused before anything changes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "examples/chargpt.h"
#include "tests/nn/gpt_fixture.h"
#include "tests/test_util.h"

namespace frugal::testing {
namespace {

TEST(CharGPT, FirstFiveLossesMatchPyTorch) {
  if (!std::filesystem::is_directory(data::kFortunesRoot))
    GTEST_SKIP() << "the fortunes corpus is not installed (apt-get install fortunes)";
  std::ifstream in(std::string(FRUGAL_FIXTURES_DIR) + "/chargpt_golden.json");
  ASSERT_TRUE(in) << "missing tests/fixtures/chargpt_golden.json";
  const auto golden = nlohmann::json::parse(in);
  const auto& c = golden["config"];
  chargpt::Options o;
  o.layers = c["layers"], o.width = c["width"], o.heads = c["heads"], o.context = c["context"];
  o.batch = c["batch"], o.lr = c["lr"], o.steps = c["steps"];
  const data::TextDataset train(data::TextDatasetOptions().context(o.context));
  ASSERT_EQ(train.vocab_size(), c["vocab"].get<int64_t>());
  ASSERT_EQ(train.size(), c["windows"].get<int64_t>());
  chargpt::Trainer trainer(o, train.vocab_size());
  fill_gpt_hashed(*trainer.model, golden["params"].get<std::vector<std::string>>());
  if (HasFatalFailure()) return;
  const auto expected = golden["losses"].get<std::vector<double>>();
  const auto starts = golden["starts"].get<std::vector<std::vector<int64_t>>>();
  ASSERT_EQ(starts.size(), expected.size());
  for (size_t step = 0; step < expected.size(); ++step) {
    std::vector<int64_t> s;
    for (int64_t b = 0; b < o.batch; ++b)
      s.push_back(int64_t((uint64_t(step) * uint64_t(o.batch) + uint64_t(b)) * 2654435761ull + 12345ull) %
                  train.size());
    ASSERT_EQ(s, starts[step]) << "the window formula differs from the fixture script's";
    const double loss = trainer.train_step({train.get_batch(s)});
    EXPECT_NEAR(loss, expected[step], 2e-5 * expected[step]) << "step " << step;
  }
}

class CharGPTResume : public ScratchDirTest {
 protected:
  // A small corpus of its own, so the test does not depend on the fortunes package.
  std::string write_corpus() {
    std::ofstream out(path("corpus"), std::ios::binary);
    for (int i = 0; i < 400; ++i) out << "the quick brown fox " << i << " jumps over the lazy dog.\n";
    return dir_.string();
  }

  // Losses of steps [from, to) of a tiny model, resuming from `resume` and saving to `save` when given.
  std::vector<double> run(const chargpt::Options& o, int64_t from, int64_t to, const std::string& resume,
                          const std::string& save) {
    const data::TextDataset train(data::TextDatasetOptions().root(corpus_).context(o.context));
    chargpt::Trainer t(o, train.vocab_size());
    if (!resume.empty()) t.load(resume);
    EXPECT_EQ(t.step(), from);
    std::vector<double> losses;
    while (t.step() < to) losses.push_back(t.train_step(train));
    if (!save.empty()) t.save(save, train.vocabulary());
    return losses;
  }

  void expect_resume_continues(const chargpt::Options& o) {
    corpus_ = write_corpus();
    const std::vector<double> straight = run(o, 0, o.steps, "", "");
    std::vector<double> joined = run(o, 0, 3, "", path("ckpt.safetensors"));
    const std::vector<double> rest = run(o, 3, o.steps, path("ckpt.safetensors"), "");
    joined.insert(joined.end(), rest.begin(), rest.end());
    EXPECT_EQ(joined, straight);  // bit for bit: weights, optimizer state, schedule and batches all resume
    EXPECT_LT(straight.back(), straight.front());
  }

  static chargpt::Options tiny() {
    chargpt::Options o;
    o.layers = 1, o.width = 16, o.heads = 2, o.context = 8, o.batch = 4, o.steps = 7, o.lr = 1e-2, o.seed = 3;
    return o;
  }

  std::string corpus_;
};

TEST_F(CharGPTResume, DenseContinuesTheSameLosses) { expect_resume_continues(tiny()); }

// Note [the model file is the whole model]: the weights file says how to rebuild the model and how to turn
// text into its tokens; a GPT made from that metadata alone takes the weights and gives the same logits.
TEST_F(CharGPTResume, WeightsFileCarriesTheModelShapeAndVocabulary) {
  corpus_ = write_corpus();
  const chargpt::Options o = tiny();
  const std::string file_path = path("model.safetensors");
  run(o, 0, 2, "", file_path);
  const io::SafetensorsFile file = io::load_safetensors(file_path);
  EXPECT_EQ(file.metadata.at("model"), "gpt");
  const data::TextDataset train(data::TextDatasetOptions().root(corpus_).context(o.context));
  const auto vocabulary = nlohmann::json::parse(file.metadata.at("vocabulary")).get<std::vector<int>>();
  EXPECT_EQ(vocabulary, std::vector<int>(train.vocabulary().begin(), train.vocabulary().end()));
  nn::GPTConfig cfg;
  cfg.vocab = int64_t(vocabulary.size());
  cfg.n_layers = std::stoll(file.metadata.at("layers"));
  cfg.d_model = std::stoll(file.metadata.at("width"));
  cfg.n_heads = std::stoll(file.metadata.at("heads"));
  cfg.context = std::stoll(file.metadata.at("context"));
  EXPECT_EQ(cfg.n_layers, o.layers);
  EXPECT_EQ(cfg.d_model, o.width);
  EXPECT_EQ(cfg.n_heads, o.heads);
  EXPECT_EQ(cfg.context, o.context);
  nn::GPT rebuilt(cfg);
  rebuilt->load_state_dict(file.tensors);
  chargpt::Trainer trained(o, train.vocab_size());
  trained.load(file_path);
  NoGradGuard no_grad;
  const Tensor tokens = train.encode("lazy dog");
  expect_close(rebuilt->forward(tokens.unsqueeze(0)).to_vector<double>(),
               trained.model->forward(tokens.unsqueeze(0)).to_vector<double>(), Tol{0, 0},
               "logits of the rebuilt model");
}

// --optimizer adamw8bit, wide enough (64) that the blocks' matrices are in 8 bits: its codes and scales are
// saved under its name and the run resumes bit for bit.
TEST_F(CharGPTResume, AdamW8bitContinuesTheSameLosses) {
  chargpt::Options o = tiny();
  o.optimizer = "adamw8bit";
  o.width = 64;
  expect_resume_continues(o);
}

// The same with the float8 codes (--optimizer adamw8bit-float8).
TEST_F(CharGPTResume, AdamW8bitFloat8ContinuesTheSameLosses) {
  chargpt::Options o = tiny();
  o.optimizer = "adamw8bit-float8";
  o.width = 64;
  expect_resume_continues(o);
}

TEST_F(CharGPTResume, SparseEmbeddingsAndAccumulationContinueTheSameLosses) {
  chargpt::Options o = tiny();
  o.sparse_embeddings = true;
  o.accum = 2;
  expect_resume_continues(o);
}

// --amp f16 with clipping: the loss scaler's state goes into the checkpoint and the run resumes bit for bit.
TEST_F(CharGPTResume, F16AutocastWithClippingContinuesTheSameLosses) {
  chargpt::Options o = tiny();
  o.autocast = DType::F16;
  o.clip = 0.5;
  expect_resume_continues(o);
  const auto st = io::load_safetensors(path("ckpt.safetensors") + ".state");
  ASSERT_TRUE(st.tensors.count("scaler.scale"));
  EXPECT_EQ(st.tensors.at("scaler._growth_tracker").item<int64_t>(), 3);
}

// bf16 and f16 autocast follow the f32 losses of the same tiny run.
TEST_F(CharGPTResume, AutocastFollowsF32) {
  corpus_ = write_corpus();
  chargpt::Options o = tiny();
  const std::vector<double> f32 = run(o, 0, o.steps, "", "");
  for (DType dt : {DType::BF16, DType::F16}) {
    o.autocast = dt;
    const std::vector<double> low = run(o, 0, o.steps, "", "");
    ASSERT_EQ(low.size(), f32.size());
    for (size_t i = 0; i < f32.size(); ++i)
      EXPECT_NEAR(low[i], f32[i], (dt == DType::BF16 ? 0.03 : 0.01) * f32[i])
          << dtype_name(dt) << " step " << i;
  }
}

TEST_F(CharGPTResume, CheckpointWithoutSparseStateIsRefused) {
  corpus_ = write_corpus();
  run(tiny(), 0, 2, "", path("ckpt.safetensors"));
  chargpt::Options o = tiny();
  o.sparse_embeddings = true;
  const data::TextDataset train(data::TextDatasetOptions().root(corpus_).context(o.context));
  chargpt::Trainer t(o, train.vocab_size());
  expect_error<Error>([&] { t.load(path("ckpt.safetensors")); }, {"no SparseAdam state"});
}

// Note [checkpoint pairs]: the weights of one save beside the state of another (what a save killed between
// its two renames used to leave) are refused, and the trainer is left as it was.
TEST_F(CharGPTResume, WeightsAndStateOfDifferentSavesAreRefused) {
  corpus_ = write_corpus();
  run(tiny(), 0, 2, "", path("ckpt.safetensors"));
  run(tiny(), 0, 3, "", path("later.safetensors"));
  std::filesystem::copy_file(path("later.safetensors"), path("ckpt.safetensors"),
                             std::filesystem::copy_options::overwrite_existing);
  const data::TextDataset train(data::TextDatasetOptions().root(corpus_).context(tiny().context));
  chargpt::Trainer t(tiny(), train.vocab_size());
  std::map<std::string, std::vector<double>> before;
  for (const auto& [name, w] : t.model->state_dict()) before[name] = w.to_vector<double>();
  expect_error<Error>([&] { t.load(path("ckpt.safetensors")); }, {path("ckpt.safetensors"), "another save"});
  EXPECT_EQ(t.step(), 0);
  for (const auto& [name, w] : t.model->state_dict()) EXPECT_EQ(w.to_vector<double>(), before[name]) << name;
  EXPECT_TRUE(t.optimizer->state_dict().count("state.0.step") == 0);  // the optimizer never took a step
}

}  // namespace
}  // namespace frugal::testing

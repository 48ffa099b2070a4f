// data::TextDataset on a small corpus written by the test (file selection and order, vocabulary, split,
// windows, sampling, errors), and on Debian's fortunes when installed.
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include <unistd.h>

#include "data/dataloader.h"
#include "data/text.h"
#include "frugal.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

// A temporary folder removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("frugal_text_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
  }
};

// "b" and "a" are corpus files (read as a then b); "a.dat", "x.u8" and the folder "sub" are not.
void write_small_corpus(const TempDir& d) {
  d.write("b", "hello world\n%\n");
  d.write("a", "abc abc\n");
  d.write("a.dat", "\x01\x02 binary index");
  d.write("x.u8", "zzzz");
  fs::create_directories(d.path / "sub");
  std::ofstream(d.path / "sub" / "c") << "qqqq";
}

TEST(TextDataset, SmallCorpus) {
  TempDir d;
  write_small_corpus(d);
  const std::string text = "abc abc\nhello world\n%\n";
  data::TextDataset ds(data::TextDatasetOptions().root(d.path.string()).context(4).val_fraction(0.25));
  ASSERT_EQ(ds.files().size(), 2u);
  EXPECT_EQ(fs::path(ds.files()[0]).filename(), "a");
  EXPECT_EQ(ds.tokens().numel(), int64_t(text.size()));
  EXPECT_EQ(ds.tokens().dtype(), DType::U8);

  const std::set<uint8_t> distinct(text.begin(), text.end());
  EXPECT_EQ(ds.vocabulary(), std::vector<uint8_t>(distinct.begin(), distinct.end()));
  EXPECT_EQ(ds.vocabulary().front(), uint8_t('\n'));
  EXPECT_EQ(ds.decode(ds.tokens()), text);
  EXPECT_EQ(ds.decode(ds.encode("hello")), "hello");
  EXPECT_EQ(ds.encode("\n").item<int64_t>(), 0);

  // 22 tokens, the last floor(22 * 0.25) = 5 held out: 17 training tokens, 13 windows of 4 + 1.
  EXPECT_EQ(ds.train_tokens(), 17);
  EXPECT_EQ(ds.size(), 13);
  const std::vector<int64_t> starts{0, 12, 3};
  const data::Batch b = ds.get_batch(starts);
  EXPECT_EQ(b.input.shape(), (Shape{3, 4}));
  EXPECT_EQ(b.input.dtype(), DType::I64);
  EXPECT_EQ(b.target.dtype(), DType::I64);
  EXPECT_EQ(ds.decode(b.input.select(0, 0)), "abc ");
  EXPECT_EQ(ds.decode(b.target.select(0, 0)), "bc a");
  EXPECT_EQ(ds.decode(b.input.select(0, 1)), "o wo");
  EXPECT_EQ(ds.decode(b.target.select(0, 1)), " wor");  // the last window ends at the last training token

  data::TextDataset val(data::TextDatasetOptions()
                            .root(d.path.string())
                            .context(4)
                            .val_fraction(0.25)
                            .split(data::TextSplit::Validation));
  EXPECT_EQ(val.decode(val.split_tokens()), text.substr(17));
  EXPECT_EQ(val.size(), 1);
}

TEST(TextDataset, SampleBatchIsReproducible) {
  TempDir d;
  write_small_corpus(d);
  data::TextDataset ds(data::TextDatasetOptions().root(d.path.string()).context(3).val_fraction(0));
  Generator g1(42), g2(42), g3(43);
  const data::Batch a = ds.sample_batch(16, g1), b = ds.sample_batch(16, g2), c = ds.sample_batch(16, g3);
  EXPECT_EQ(a.input.to_vector<int64_t>(), b.input.to_vector<int64_t>());
  EXPECT_NE(a.input.to_vector<int64_t>(), c.input.to_vector<int64_t>());
  // Every target is its input shifted by one.
  const auto in = a.input.to_vector<int64_t>(), tg = a.target.to_vector<int64_t>();
  for (int64_t r = 0; r < 16; ++r)
    for (int64_t j = 0; j + 1 < 3; ++j) EXPECT_EQ(tg[size_t(r * 3 + j)], in[size_t(r * 3 + j + 1)]);
}

TEST(TextDataset, WorksWithDataLoader) {
  TempDir d;
  write_small_corpus(d);
  auto ds = std::make_shared<data::TextDataset>(data::TextDatasetOptions().root(d.path.string()).context(5));
  data::DataLoader loader(ds, data::DataLoaderOptions().batch_size(4).shuffle(true).seed(1).prefetch(0));
  int64_t windows = 0;
  for (data::Batch& b : loader.epoch(0)) {
    EXPECT_EQ(b.input.size(1), 5);
    windows += b.input.size(0);
  }
  EXPECT_EQ(windows, ds->size());
}

TEST(TextDataset, Errors) {
  expect_error<Error>([] { data::TextDataset(data::TextDatasetOptions().root("/nonexistent/fortunes")); },
                      {"/nonexistent/fortunes", "apt-get install fortunes"});
  TempDir d;
  d.write("only.dat", "x");
  expect_error<Error>([&] { data::TextDataset(data::TextDatasetOptions().root(d.path.string())); },
                      {"no text files", "apt-get install fortunes"});
  d.write("tiny", "abc");
  expect_error<Error>([&] { data::TextDataset(data::TextDatasetOptions().root(d.path.string()).context(8)); },
                      {"too few", "context 8"});
  data::TextDataset ds(data::TextDatasetOptions().root(d.path.string()).context(1).val_fraction(0));
  expect_error<Error>([&] { ds.encode("abz"); }, {"encode", "byte 122", "position 2"});
  expect_error<IndexError>([&] { ds.decode(tensor<int64_t>({0, 3})); }, {"decode", "token id 3"});
  const std::vector<int64_t> bad{2};
  expect_error<IndexError>([&] { ds.get_batch(bad); }, {"window start 2", "2 windows"});
  expect_error<Error>(
      [&] { data::TextDataset(data::TextDatasetOptions().root(d.path.string()).val_fraction(1)); },
      {"val_fraction"});
}

TEST(TextDataset, Fortunes) {
  if (!fs::is_directory(data::kFortunesRoot)) GTEST_SKIP() << "Debian's fortunes is not installed";
  data::TextDataset ds;
  EXPECT_GT(ds.tokens().numel(), 2'000'000);
  EXPECT_LT(ds.tokens().numel(), 3'000'000);
  EXPECT_GT(ds.vocab_size(), 100);
  EXPECT_LE(ds.vocab_size(), 130);
  EXPECT_EQ(ds.train_tokens(), ds.tokens().numel() - int64_t(double(ds.tokens().numel()) * 0.1));
  Generator gen(0);
  const data::Batch b = ds.sample_batch(32, gen);
  EXPECT_EQ(b.input.shape(), (Shape{32, 64}));
  EXPECT_LT(ops::max(b.input).item<int64_t>(), ds.vocab_size());
  for (const auto& f : ds.files()) EXPECT_EQ(fs::path(f).filename().string().find('.'), std::string::npos);
  std::cout << "fortunes: " << ds.files().size() << " files, " << ds.tokens().numel() << " bytes, vocabulary "
            << ds.vocab_size() << "\n";
}

}  // namespace
}  // namespace frugal

// IDX reading (raw and gzip'd files written here, corrupt and truncated ones) and Fashion-MNIST, on synthetic
// files and on the real dataset when the Debian package is installed.
#include "data/idx.h"

#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "tests/test_util.h"

namespace frugal {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

using IdxTest = testing::ScratchDirTest;  // a fresh scratch directory per test

// An IDX file's bytes: magic (0, 0, type, ndim), big-endian u32 dims, then the data.
std::string idx_bytes(uint8_t type, const std::vector<uint32_t>& dims, const std::string& data) {
  std::string b{'\0', '\0', char(type), char(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) b.push_back(char((d >> shift) & 0xff));
  return b + data;
}

std::string counting_bytes(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = char(i * 7 % 256);
  return s;
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

TEST_F(IdxTest, ReadsRawAndGzippedFiles) {
  const std::string data = counting_bytes(3 * 2 * 4);
  write_raw(path("a.idx"), idx_bytes(0x08, {3, 2, 4}, data));
  write_gz(path("a.idx.gz"), idx_bytes(0x08, {3, 2, 4}, data));
  for (const std::string& p : {path("a.idx"), path("a.idx.gz")}) {
    SCOPED_TRACE(p);
    const Tensor t = data::read_idx(p);
    EXPECT_EQ(t.dtype(), DType::U8);
    EXPECT_EQ(t.shape(), Shape({3, 2, 4}));
    EXPECT_EQ(std::string(static_cast<const char*>(t.raw_data()), size_t(t.nbytes())), data);
  }
  write_gz(path("labels.gz"), idx_bytes(0x08, {5}, std::string("\x09\x00\x01\x02\x09", 5)));
  EXPECT_EQ(data::read_idx(path("labels.gz")).to_vector<int>(), (std::vector<int>{9, 0, 1, 2, 9}));
  write_raw(path("empty.idx"), idx_bytes(0x08, {0, 28}, ""));
  EXPECT_EQ(data::read_idx(path("empty.idx")).shape(), Shape({0, 28}));
}

TEST_F(IdxTest, RejectsBadMagicTypesAndDims) {
  const std::string p = path("bad.idx");
  write_raw(p, std::string("\x01\x02\x08\x01\0\0\0\x01x", 9));
  expect_error<Error>([&] { data::read_idx(p); }, {p, "bad magic", "not an IDX file"});
  write_gz(p, idx_bytes(0x0D, {2}, std::string(8, '\0')));
  expect_error<Error>([&] { data::read_idx(p); }, {p, "0xd (f32) is not supported", "u8 (0x08)"});
  write_raw(p, idx_bytes(0x42, {1}, "x"));
  expect_error<Error>([&] { data::read_idx(p); }, {p, "0x42 (unknown)"});
  write_raw(p, idx_bytes(0x08, {}, "x"));
  expect_error<Error>([&] { data::read_idx(p); }, {p, "0 dimensions"});
  write_raw(p, idx_bytes(0x08, {1, 1, 1, 1, 1, 1, 1, 1, 1}, "x"));
  expect_error<Error>([&] { data::read_idx(p); }, {p, "9 dimensions"});
  expect_error<Error>([&] { data::read_idx(path("missing.idx")); }, {"cannot open", "missing.idx"});
}

TEST_F(IdxTest, RejectsTruncatedAndOverlongFiles) {
  const std::string full = idx_bytes(0x08, {4, 5}, counting_bytes(20));
  for (const bool gz : {false, true}) {
    SCOPED_TRACE(gz ? "gzip" : "raw");
    const std::string p = path(gz ? "t.gz" : "t.idx");
    for (size_t len = 0; len < full.size(); ++len) {
      SCOPED_TRACE("truncated to " + std::to_string(len));
      if (gz) {
        write_gz(p, full.substr(0, len));
      } else {
        write_raw(p, full.substr(0, len));
      }
      expect_error<Error>([&] { data::read_idx(p); }, {p});
    }
    if (gz) {
      write_gz(p, full.substr(0, full.size() - 3));
    } else {
      write_raw(p, full.substr(0, full.size() - 3));
    }
    expect_error<Error>([&] { data::read_idx(p); }, {p, "need 20 bytes", "holds 17", "truncated"});
    if (gz) {
      write_gz(p, full + "zz");
    } else {
      write_raw(p, full + "zz");
    }
    expect_error<Error>([&] { data::read_idx(p); }, {p, "data continues after"});
  }
}

TEST_F(IdxTest, RejectsHugeDimsWithoutAllocating) {
  const std::string p = path("huge.idx");
  write_raw(p, idx_bytes(0x08, {0xffffffff, 0xffffffff, 0xffffffff}, "abc"));
  expect_error<Error>([&] { data::read_idx(p); }, {p, "need more bytes than a file of"});
  write_gz(p, idx_bytes(0x08, {60000, 28, 28}, "abc"));
  expect_error<Error>([&] { data::read_idx(p); }, {p, "need more bytes than a file of"});
}

// Note [checked sizes]: a 0 dim makes the data empty, but the other dims' product still must fit.
TEST_F(IdxTest, RejectsDimsWhoseProductOverflowsEvenWhenEmpty) {
  const std::string p = path("absurd.idx");
  write_raw(p, idx_bytes(0x08, {0xffffffff, 0xffffffff, 0xffffffff, 0}, ""));
  expect_error<Error>([&] { data::read_idx(p); }, {p, "2^63 - 1 elements", "corrupt"});
  write_raw(p, idx_bytes(0x08, {0xffffffff, 0, 0xffffffff, 0xffffffff, 7}, ""));
  expect_error<Error>([&] { data::read_idx(p); }, {p, "2^63 - 1 elements"});
  write_raw(p, idx_bytes(0x08, {0xffffffff, 0xffffffff, 0}, ""));  // 2^64 - 2^33 + 1 elements: too many
  expect_error<Error>([&] { data::read_idx(p); }, {p, "2^63 - 1 elements"});
  write_raw(p,
            idx_bytes(0x08, {0xffffffff, 0x7fffffff, 0}, ""));  // below 2^63: an empty tensor of that shape
  const Tensor t = data::read_idx(p);
  EXPECT_EQ(t.shape(), (Shape{0xffffffff, 0x7fffffff, 0}));
  EXPECT_EQ(t.numel(), 0);
}

TEST_F(IdxTest, RejectsCorruptGzipData) {
  const std::string p = path("c.gz");
  write_gz(p, idx_bytes(0x08, {64, 64}, counting_bytes(64 * 64)));
  std::string bytes;
  {
    std::ifstream in(p, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (size_t i = 12; i < bytes.size(); ++i) bytes[i] = char(bytes[i] ^ 0x5a);  // damage the deflate stream
  write_raw(p, bytes);
  expect_error<Error>([&] { data::read_idx(p); }, {p});
}

// A Fashion-MNIST folder with n synthetic images (pixel i of image k = (k + i) % 256) and labels k % 10.
void write_fashion(const std::string& root, const std::string& prefix, uint32_t n, uint32_t n_labels,
                   int bad_label = -1) {
  std::string pixels(size_t(n) * 784, '\0'), labels(n_labels, '\0');
  for (uint32_t k = 0; k < n; ++k)
    for (uint32_t i = 0; i < 784; ++i) pixels[k * 784 + i] = char((k + i) % 256);
  for (uint32_t k = 0; k < n_labels; ++k) labels[k] = char(k % 10);
  if (bad_label >= 0) labels[0] = char(bad_label);
  write_gz(root + "/" + prefix + "-images-idx3-ubyte.gz", idx_bytes(0x08, {n, 28, 28}, pixels));
  write_gz(root + "/" + prefix + "-labels-idx1-ubyte.gz", idx_bytes(0x08, {n_labels}, labels));
}

TEST_F(IdxTest, FashionMNISTOnSyntheticFiles) {
  write_fashion(dir_.string(), "t10k", 12, 12);
  const data::FashionMNIST test(dir_.string(), data::Split::Test);
  EXPECT_EQ(test.size(), 12);
  EXPECT_EQ(test.images().dtype(), DType::U8);
  EXPECT_EQ(test.images().shape(), Shape({12, 28, 28}));
  EXPECT_EQ(test.labels().to_vector<int>()[11], 1);

  const std::vector<int64_t> idx{3, 0, 11};
  for (const DType t : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    SCOPED_TRACE(dtype_name(t));
    const data::Batch b = test.get_batch(idx, t);
    EXPECT_EQ(b.input.dtype(), t);
    EXPECT_EQ(b.input.shape(), Shape({3, 1, 28, 28}));
    EXPECT_EQ(b.target.dtype(), DType::I64);
    EXPECT_EQ(b.target.to_vector<int64_t>(), (std::vector<int64_t>{3, 0, 1}));
    std::vector<double> expected;
    for (int64_t k : idx)
      for (int i = 0; i < 784; ++i) expected.push_back(double((k + i) % 256) / 255.0);
    testing::expect_close(b.input, expected, testing::tol_for(t), "pixels / 255");
  }
  // Exactly PyTorch's ToTensor value (a division in f32) for f32.
  EXPECT_EQ(test.get_batch(std::vector<int64_t>{0}, DType::F32).input.to_vector<float>()[51], 51.0f / 255.0f);
  // Every byte value (image 0's pixel i is i % 256), normalised: exactly ToTensor then Normalize in f32, each
  // step rounded as PyTorch rounds it.
  {
    data::FashionMNIST normalised(dir_.string(), data::Split::Test);
    normalised.normalize(0.2860, 0.3530);
    const auto px = normalised.get_batch(std::vector<int64_t>{0}, DType::F32).input.to_vector<float>();
    size_t differ = 0;
    for (int i = 0; i < 784; ++i) {
      const float v = float(i % 256) / 255.0f, want = (v - 0.2860f) / 0.3530f;
      differ += px[size_t(i)] != want;
    }
    EXPECT_EQ(differ, 0u) << "of 784 normalised pixels";
  }

  const data::FashionMNIST flat(dir_.string(), data::Split::Test, /*flatten=*/true);
  EXPECT_EQ(flat.get_batch(idx, DType::F32).input.shape(), Shape({3, 784}));
  expect_error<IndexError>([&] { test.get_batch(std::vector<int64_t>{12}, DType::F32); }, {"index 12", "12"});
  expect_error<DTypeError>([&] { test.get_batch(idx, DType::I64); }, {"floating", "i64"});
}

TEST_F(IdxTest, FashionMNISTRejectsInconsistentOrMissingFiles) {
  const std::string root = dir_.string();
  expect_error<Error>([&] { data::FashionMNIST(root, data::Split::Train); },
                      {root + "/train-images-idx3-ubyte.gz", "apt-get install dataset-fashion-mnist"});
  write_fashion(root, "train", 4, 5);
  expect_error<Error>([&] { data::FashionMNIST(root, data::Split::Train); }, {"4 images", "5 labels"});
  write_fashion(root, "train", 4, 4, /*bad_label=*/10);
  expect_error<Error>([&] { data::FashionMNIST(root, data::Split::Train); }, {"label 10", "0..9"});
  write_gz(root + "/train-images-idx3-ubyte.gz", idx_bytes(0x08, {4, 28}, std::string(4 * 28, '\0')));
  expect_error<Error>([&] { data::FashionMNIST(root, data::Split::Train); }, {"[4, 28]", "[N, 28, 28]"});
}

TEST(FashionMNISTReal, MatchesTheKnownFacts) {
  if (!fs::exists(std::string(data::kFashionMNISTRoot) + "/train-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  const data::FashionMNIST train, test(data::kFashionMNISTRoot, data::Split::Test);
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.images().shape(), Shape({60000, 28, 28}));
  EXPECT_EQ(train.labels().to_vector<int>()[0], 9);  // the first training image is an ankle boot
  for (const auto* split : {&train, &test}) {
    std::vector<int64_t> per_class(10, 0);
    for (int label : split->labels().to_vector<int>()) {
      ASSERT_GE(label, 0);
      ASSERT_LE(label, 9);
      ++per_class[size_t(label)];
    }
    for (int64_t count : per_class) EXPECT_EQ(count, split->size() / 10);  // balanced classes
    const std::vector<int> px = split->images().to_vector<int>();
    EXPECT_EQ(*std::min_element(px.begin(), px.end()), 0);
    EXPECT_EQ(*std::max_element(px.begin(), px.end()), 255);
  }
  const data::Batch b = train.get_batch(std::vector<int64_t>{0}, DType::F32);
  EXPECT_EQ(b.target.item<int64_t>(), 9);
  EXPECT_GE(b.input.to_vector<float>().front(), 0.0f);
}

}  // namespace
}  // namespace frugal

// DataLoader: every index once per epoch, reproducible shuffles per (seed, epoch), drop_last, dtypes,
// prefetch equal to no prefetch, clean shutdown mid-epoch, and worker errors rethrown in the caller.
#include "data/dataloader.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "data/idx.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

// Example i has input [i] (f32, or the dtype asked) and target i; index `fail_at` throws.
class Counting : public data::Dataset {
 public:
  explicit Counting(int64_t n, int64_t fail_at = -1) : n_(n), fail_at_(fail_at) {}
  int64_t size() const override { return n_; }
  data::Batch get_batch(std::span<const int64_t> indices, DType dtype) const override {
    ++calls;
    std::vector<int64_t> idx(indices.begin(), indices.end());
    for (int64_t i : idx) FRUGAL_CHECK(i != fail_at_, "Counting: example ", i, " is broken");
    const Tensor target = tensor(idx);
    return {target.to(dtype).unsqueeze(1), target};
  }
  mutable std::atomic<int> calls{0};

 private:
  int64_t n_, fail_at_;
};

std::vector<std::vector<int64_t>> targets_of_epoch(data::DataLoader& loader, int64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  for (data::Batch& b : loader.epoch(epoch)) out.push_back(b.target.to_vector<int64_t>());
  return out;
}

std::vector<int64_t> flat(const std::vector<std::vector<int64_t>>& batches) {
  std::vector<int64_t> all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  return all;
}

TEST(DataLoader, InOrderWithoutShuffle) {
  data::DataLoader loader(std::make_shared<Counting>(23), data::DataLoaderOptions().batch_size(10));
  EXPECT_EQ(loader.num_batches(), 3);
  const auto batches = targets_of_epoch(loader, 0);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[2], (std::vector<int64_t>{20, 21, 22}));
  std::vector<int64_t> expected(23);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(flat(batches), expected);
}

TEST(DataLoader, ShuffleVisitsEveryIndexOncePerEpoch) {
  data::DataLoader loader(std::make_shared<Counting>(103),
                          data::DataLoaderOptions().batch_size(10).shuffle(true).seed(7));
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const auto batches = targets_of_epoch(loader, epoch);
    ASSERT_EQ(batches.size(), 11u);
    EXPECT_EQ(batches.back().size(), 3u);
    std::vector<int64_t> all = flat(batches);
    std::vector<int64_t> sorted = all;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> expected(103);
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(sorted, expected) << "epoch " << epoch;
    EXPECT_NE(all, expected) << "epoch " << epoch << " is not shuffled";
    EXPECT_EQ(all, loader.epoch_order(epoch));
  }
}

TEST(DataLoader, ShuffleIsReproduciblePerSeedAndEpoch) {
  const auto opts = data::DataLoaderOptions().batch_size(16).shuffle(true).seed(42);
  data::DataLoader a(std::make_shared<Counting>(1000), opts), b(std::make_shared<Counting>(1000), opts);
  // b jumps straight to epoch 3, as a resumed run would: it sees what a saw there.
  for (int64_t e = 0; e < 3; ++e) targets_of_epoch(a, e);
  EXPECT_EQ(targets_of_epoch(a, 3), targets_of_epoch(b, 3));
  EXPECT_NE(a.epoch_order(3), a.epoch_order(4));
  data::DataLoader c(std::make_shared<Counting>(1000), data::DataLoaderOptions(opts).seed(43));
  EXPECT_NE(a.epoch_order(3), c.epoch_order(3));
  EXPECT_EQ(a.epoch_order(3), b.epoch_order(3));
}

TEST(DataLoader, DropLastDropsTheShortBatch) {
  data::DataLoader loader(std::make_shared<Counting>(103),
                          data::DataLoaderOptions().batch_size(10).shuffle(true).drop_last(true));
  EXPECT_EQ(loader.num_batches(), 10);
  const auto batches = targets_of_epoch(loader, 0);
  ASSERT_EQ(batches.size(), 10u);
  for (const auto& b : batches) EXPECT_EQ(b.size(), 10u);
  std::set<int64_t> seen;
  for (int64_t i : flat(batches)) EXPECT_TRUE(seen.insert(i).second) << i << " twice";

  data::DataLoader exact(std::make_shared<Counting>(30),
                         data::DataLoaderOptions().batch_size(10).drop_last(true));
  EXPECT_EQ(exact.num_batches(), 3);
  data::DataLoader tiny(std::make_shared<Counting>(5),
                        data::DataLoaderOptions().batch_size(10).drop_last(true));
  EXPECT_EQ(tiny.num_batches(), 0);
  EXPECT_TRUE(targets_of_epoch(tiny, 0).empty());
}

TEST(DataLoader, PrefetchGivesTheSameBatchesAsNone) {
  const auto opts = data::DataLoaderOptions().batch_size(7).shuffle(true).seed(3);
  std::vector<std::vector<std::vector<int64_t>>> runs;
  for (int prefetch : {0, 1, 2, 5}) {
    data::DataLoader loader(std::make_shared<Counting>(50), data::DataLoaderOptions(opts).prefetch(prefetch));
    runs.push_back(targets_of_epoch(loader, 2));
  }
  for (size_t i = 1; i < runs.size(); ++i) EXPECT_EQ(runs[i], runs[0]) << "run " << i;
}

// in_caller_thread: the same batches, made at next(), with `prefetch` ahead of the one in use, so the bytes
// alive are those of a worker that keeps up (what a dry run needs, core/estimate.h); errors still reach the
// caller at the batch that failed.
TEST(DataLoader, PrefetchInTheCallersThread) {
  const auto opts = data::DataLoaderOptions().batch_size(7).shuffle(true).seed(3);
  data::DataLoader worker(std::make_shared<Counting>(50), opts);
  for (int prefetch : {0, 1, 2, 5}) {
    SCOPED_TRACE("prefetch " + std::to_string(prefetch));
    auto ds = std::make_shared<Counting>(50);
    data::DataLoader loader(ds, data::DataLoaderOptions(opts).prefetch(prefetch).in_caller_thread(true));
    EXPECT_EQ(targets_of_epoch(loader, 2), targets_of_epoch(worker, 2));
    loader.begin_epoch(0);
    ASSERT_TRUE(loader.next().has_value());
    EXPECT_EQ(ds->calls.load() - 8, 1 + prefetch);  // one epoch of 8 batches, then this one and those ahead
  }
  data::DataLoader failing(std::make_shared<Counting>(100, /*fail_at=*/57),
                           data::DataLoaderOptions().batch_size(10).in_caller_thread(true));
  failing.begin_epoch(0);
  int good = 0;
  EXPECT_THROW(
      {
        while (failing.next()) ++good;
      },
      Error);
  EXPECT_EQ(good, 5);
}

// A range-for lets go of a batch before it takes the next one: at most one batch in use at a time.
TEST(DataLoader, TheIteratorReleasesABatchBeforeTakingTheNext) {
  // Notes, each time a batch is made, whether the batch handed out before is still alive.
  struct Watching : Counting {
    using Counting::Counting;
    data::Batch get_batch(std::span<const int64_t> indices, DType dtype) const override {
      overlapped = overlapped || !last.expired();
      data::Batch b = Counting::get_batch(indices, dtype);
      last = b.target.storage();
      return b;
    }
    mutable std::weak_ptr<Storage> last;
    mutable bool overlapped = false;
  };
  auto ds = std::make_shared<Watching>(40);
  data::DataLoader loader(ds, data::DataLoaderOptions().batch_size(10).prefetch(0));
  int batches = 0;
  for (data::Batch& b : loader.epoch(0)) batches += b.target.numel() > 0;
  EXPECT_EQ(batches, 4);
  EXPECT_FALSE(ds->overlapped);
}

TEST(DataLoader, UsingTheNextApi) {
  data::DataLoader loader(std::make_shared<Counting>(5), data::DataLoaderOptions().batch_size(2));
  expect_error<Error>([&] { loader.next(); }, {"begin_epoch"});
  loader.begin_epoch(0);
  int n = 0;
  while (auto b = loader.next()) {
    EXPECT_EQ(b->input.dtype(), DType::F32);
    ++n;
  }
  EXPECT_EQ(n, 3);
  EXPECT_FALSE(loader.next().has_value());  // stays over until the next begin_epoch
  loader.begin_epoch(1);
  EXPECT_TRUE(loader.next().has_value());
}

TEST(DataLoader, StoppingEarlyNeverHangs) {
  for (int prefetch : {1, 2}) {
    auto ds = std::make_shared<Counting>(1000);
    {
      data::DataLoader loader(ds, data::DataLoaderOptions().batch_size(10).prefetch(prefetch));
      loader.begin_epoch(0);
      ASSERT_TRUE(loader.next().has_value());
      // The worker is now waiting for room in a full queue; the destructor must wake and join it.
    }
    EXPECT_LE(ds->calls.load(), 2 + prefetch);  // it never ran ahead of its bound
    {
      data::DataLoader loader(ds, data::DataLoaderOptions().batch_size(10).prefetch(prefetch));
      loader.begin_epoch(0);
      loader.next();
      loader.begin_epoch(1);  // abandons epoch 0 mid-way
      EXPECT_EQ(loader.next()->target.to_vector<int64_t>()[0], 0);
      loader.begin_epoch(2);
    }  // destroyed before taking anything
    { data::DataLoader never_started(ds, data::DataLoaderOptions()); }
  }
}

TEST(DataLoader, WorkerErrorsReachTheCaller) {
  for (int prefetch : {0, 2}) {
    SCOPED_TRACE("prefetch " + std::to_string(prefetch));
    data::DataLoader loader(std::make_shared<Counting>(100, /*fail_at=*/57),
                            data::DataLoaderOptions().batch_size(10).prefetch(prefetch));
    loader.begin_epoch(0);
    int good = 0;
    try {
      while (loader.next()) ++good;
      ADD_FAILURE() << "the broken example did not raise";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("example 57 is broken"), std::string::npos) << e.what();
    }
    EXPECT_EQ(good, 5);
    EXPECT_FALSE(loader.next().has_value());  // the epoch is over
    loader.begin_epoch(1);                    // and the loader still works
    EXPECT_EQ(loader.next()->target.to_vector<int64_t>()[0], 0);
  }
}

TEST(DataLoader, WorkerAllocationsAreTaggedData) {
  data::DataLoader loader(std::make_shared<Counting>(4096), data::DataLoaderOptions().batch_size(1024));
  loader.begin_epoch(0);
  const auto batch = loader.next();  // held, so its bytes are live
  int64_t data_bytes = 0;
  for (const auto& t : memory::tag_stats(kCPU))
    if (t.tag == "data") data_bytes += t.allocated.current;
  EXPECT_GE(data_bytes, batch->input.nbytes() + batch->target.nbytes());
}

TEST(DataLoader, RejectsBadOptions) {
  auto ds = std::make_shared<Counting>(10);
  expect_error<Error>([&] { data::DataLoader(ds, data::DataLoaderOptions().batch_size(0)); },
                      {"batch_size", "0"});
  expect_error<Error>([&] { data::DataLoader(ds, data::DataLoaderOptions().prefetch(-1)); }, {"prefetch"});
  expect_error<Error>([&] { data::DataLoader(nullptr); }, {"null"});
  data::DataLoader loader(ds);
  expect_error<Error>([&] { loader.begin_epoch(-1); }, {"epoch", "-1"});
}

// A Fashion-MNIST folder of n raw (not gzip'd) IDX files: image k is filled with k, label k % 10.
std::string write_fashion_raw(uint32_t n) {
  const fs::path root = fs::temp_directory_path() / ("frugal_loader_" + std::to_string(::getpid()));
  fs::create_directories(root);
  const auto header = [](std::vector<uint32_t> dims) {
    std::string b{'\0', '\0', '\x08', char(dims.size())};
    for (uint32_t d : dims)
      for (int s = 24; s >= 0; s -= 8) b.push_back(char((d >> s) & 0xff));
    return b;
  };
  std::string images = header({n, 28, 28}), labels = header({n});
  for (uint32_t k = 0; k < n; ++k) {
    images.append(784, char(k * 5));
    labels.push_back(char(k % 10));
  }
  std::ofstream(root / "train-images-idx3-ubyte", std::ios::binary) << images;
  std::ofstream(root / "train-labels-idx1-ubyte", std::ios::binary) << labels;
  return root.string();
}

TEST(DataLoader, FashionMNISTBatchesInEveryDtype) {
  const std::string root = write_fashion_raw(52);
  auto ds = std::make_shared<data::FashionMNIST>(root);
  for (const DType t : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    data::DataLoader loader(ds, data::DataLoaderOptions().batch_size(16).dtype(t).shuffle(true));
    int64_t seen = 0;
    for (data::Batch& b : loader.epoch(0)) {
      EXPECT_EQ(b.input.dtype(), t);
      EXPECT_EQ(b.input.dim(), 4);
      EXPECT_EQ(b.input.size(1), 1);
      const auto targets = b.target.to_vector<int64_t>();
      const auto pixels = b.input.to_vector<double>();
      for (size_t k = 0; k < targets.size(); ++k) {
        // The target tells which image this is only modulo 10; the first pixel tells exactly.
        const double v = pixels[k * 784];
        EXPECT_GE(v, 0.0);
        EXPECT_LE(v, 1.0);
        const int64_t image = std::lround(v * 255.0 / 5.0);
        EXPECT_EQ(targets[k], image % 10);
        EXPECT_NEAR(pixels[k * 784 + 783], v, 0.0);
      }
      seen += b.input.size(0);
    }
    EXPECT_EQ(seen, 52);
  }
  fs::remove_all(root);
}

TEST(DataLoader, FashionMNISTNormalizesWithItsPixelStatistics) {
  const std::string root = write_fashion_raw(4);  // images of constant 0, 5, 10, 15
  data::FashionMNIST ds(root);
  const auto [mean, std] = ds.pixel_stats();
  const double v[4] = {0 / 255.0, 5 / 255.0, 10 / 255.0, 15 / 255.0};
  const double m = (v[0] + v[1] + v[2] + v[3]) / 4;
  double var = 0;
  for (double x : v) var += (x - m) * (x - m) / 4;
  EXPECT_NEAR(mean, m, 1e-15);
  EXPECT_NEAR(std, std::sqrt(var), 1e-15);
  ds.normalize(mean, std);
  const std::vector<int64_t> idx = {3, 0};
  for (const DType t : {DType::F64, DType::F32}) {
    const auto px = ds.get_batch(idx, t).input.to_vector<double>();
    EXPECT_NEAR(px[0], (v[3] - mean) / std, t == DType::F64 ? 1e-15 : 1e-6);
    EXPECT_NEAR(px[784], (v[0] - mean) / std, t == DType::F64 ? 1e-15 : 1e-6);
  }
  expect_error<Error>([&] { ds.normalize(0.5, 0); }, {"std must be positive"});
  EXPECT_NEAR(ds.get_batch(idx, DType::F64).input.to_vector<double>()[0], (v[3] - mean) / std, 1e-15);
  fs::remove_all(root);
}

TEST(DataLoader, RealFashionMNISTTestSplit) {
  if (!fs::exists(std::string(data::kFashionMNISTRoot) + "/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  auto test = std::make_shared<data::FashionMNIST>(data::kFashionMNISTRoot, data::Split::Test);
  data::DataLoader loader(test, data::DataLoaderOptions().batch_size(1000).dtype(DType::BF16));
  EXPECT_EQ(loader.num_batches(), 10);
  int64_t n = 0;
  for (data::Batch& b : loader.epoch(0)) {
    EXPECT_EQ(b.input.shape(), Shape({1000, 1, 28, 28}));
    const auto px = b.input.to_vector<float>();
    EXPECT_EQ(*std::min_element(px.begin(), px.end()), 0.0f);
    EXPECT_LE(*std::max_element(px.begin(), px.end()), 1.0f);
    n += b.target.numel();
  }
  EXPECT_EQ(n, 10000);
}

}  // namespace
}  // namespace frugal

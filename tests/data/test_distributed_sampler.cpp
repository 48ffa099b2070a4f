// data::DistributedSampler: the ranks' shares are disjoint, equal in length, and together the epoch (padded
// by repeating its start, or cut with drop_last); the order depends on (seed, epoch) only; the DataLoader
// draws its batches from it; bad arguments are clear errors.
#include <algorithm>
#include <set>

#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;

// A dataset whose example i is the number i.
struct Numbers : data::Dataset {
  int64_t n;
  explicit Numbers(int64_t size) : n(size) {}
  int64_t size() const override { return n; }
  data::Batch get_batch(std::span<const int64_t> idx, DType) const override {
    std::vector<int64_t> v(idx.begin(), idx.end());
    return {tensor(v), tensor(v)};
  }
};

TEST(DistributedSampler, SharesAreDisjointAndMakeTheEpoch) {
  for (int64_t n : {12, 13, 1, 0})
    for (int ranks : {1, 2, 3, 5})
      for (bool shuffle : {false, true}) {
        std::multiset<int64_t> seen;
        int64_t per_rank = -1;
        for (int r = 0; r < ranks; ++r) {
          const data::DistributedSampler s(n, ranks, r, shuffle, 7);
          const std::vector<int64_t> mine = s.indices(3);
          EXPECT_EQ(int64_t(mine.size()), s.num_samples());
          if (per_rank >= 0) {
            EXPECT_EQ(int64_t(mine.size()), per_rank);
          }
          per_rank = int64_t(mine.size());
          seen.insert(mine.begin(), mine.end());
        }
        EXPECT_EQ(per_rank, (n + ranks - 1) / ranks) << n << " " << ranks;
        // Every example at least once; only the padding (at most ranks - 1 examples) twice.
        for (int64_t i = 0; i < n; ++i) EXPECT_GE(seen.count(i), 1u) << i;
        EXPECT_EQ(int64_t(seen.size()), per_rank * ranks);
        EXPECT_LE(int64_t(seen.size()) - n, ranks - 1);
      }
}

TEST(DistributedSampler, DropLastCutsToAMultipleAndRepeatsNothing) {
  std::set<int64_t> seen;
  for (int r = 0; r < 3; ++r) {
    const data::DistributedSampler s(13, 3, r, true, 1, /*drop_last=*/true);
    EXPECT_EQ(s.num_samples(), 4);
    for (int64_t i : s.indices(0)) EXPECT_TRUE(seen.insert(i).second) << "twice: " << i;
  }
  EXPECT_EQ(seen.size(), 12u);
}

TEST(DistributedSampler, OrderDependsOnSeedAndEpochOnly) {
  const data::DistributedSampler a(100, 2, 1, true, 5), b(100, 2, 1, true, 5), c(100, 2, 1, true, 6);
  EXPECT_EQ(a.indices(2), b.indices(2));
  EXPECT_NE(a.indices(2), a.indices(3));
  EXPECT_NE(a.indices(2), c.indices(2));
  // One rank of one is the DataLoader's own shuffled order.
  const data::DistributedSampler whole(100, 1, 0, true, 5);
  EXPECT_EQ(whole.indices(4), data::epoch_permutation(100, 5, 4));
}

TEST(DistributedSampler, TheDataLoaderDrawsFromIt) {
  auto numbers = std::make_shared<Numbers>(20);
  auto sampler = std::make_shared<data::DistributedSampler>(20, 2, 1, true, 9);
  data::DataLoader loader(numbers, data::DataLoaderOptions().batch_size(4).sampler(sampler));
  EXPECT_EQ(loader.num_batches(), 3);  // 10 examples: 4 + 4 + 2
  std::vector<int64_t> got;
  for (data::Batch& b : loader.epoch(2))
    for (int64_t v : b.input.to_vector<int64_t>()) got.push_back(v);
  EXPECT_EQ(got, sampler->indices(2));
}

TEST(DistributedSampler, BadArgumentsAreClearErrors) {
  expect_error<Error>([] { data::DistributedSampler(10, 0, 0); }, {"num_replicas must be at least 1"});
  expect_error<Error>([] { data::DistributedSampler(10, 2, 2); }, {"rank 2 is not in [0, 2)"});
  expect_error<Error>([] { data::DistributedSampler(-1, 2, 0); }, {"must be >= 0"});
  auto numbers = std::make_shared<Numbers>(20);
  auto wrong = std::make_shared<data::DistributedSampler>(21, 2, 0);
  expect_error<Error>([&] { data::DataLoader(numbers, data::DataLoaderOptions().sampler(wrong)); },
                      {"the sampler is for 21 examples, the dataset has 20"});
  auto right = std::make_shared<data::DistributedSampler>(20, 2, 0);
  expect_error<Error>(
      [&] { data::DataLoader(numbers, data::DataLoaderOptions().sampler(right).shuffle(true)); },
      {"leave the loader's shuffle off"});
}

}  // namespace
}  // namespace frugal

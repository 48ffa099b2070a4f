// The cache of cuBLASLt GEMM plans (kernels/cuda/plan_cache.h): every field of the key tells plans apart,
// least recently used entries leave first, a hit refreshes an entry, evicted values are destroyed. Host
// logic only: runs on every machine.
#include "kernels/cuda/plan_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace frugal {
namespace {

using gpu::GemmPlanKey;
using gpu::GemmPlanKeyHash;
using gpu::LruCache;

// A 64 x 32 x 16 f32 problem (CUDA_R_32F is 0, CUBLAS_OP_N 0, CUBLAS_OP_T 1).
GemmPlanKey base_key() {
  return GemmPlanKey{.device = 0,
                     .ab_type = 0,
                     .c_type = 0,
                     .op_a = 0,
                     .op_b = 1,
                     .m = 64,
                     .n = 32,
                     .k = 16,
                     .lda = 64,
                     .ldb = 16,
                     .ldc = 64,
                     .batch = 1,
                     .stride_a = 0,
                     .stride_b = 0,
                     .stride_c = 0,
                     .align_a = 256,
                     .align_b = 256,
                     .align_c = 256,
                     .beta_nonzero = false,
                     .epilogue = 0,
                     .workspace_bytes = 32 << 20};
}

// base_key() with one field changed, for each field.
std::vector<std::pair<std::string, GemmPlanKey>> one_field_changed() {
  std::vector<std::pair<std::string, GemmPlanKey>> out;
  auto add = [&](const std::string& name, auto change) {
    GemmPlanKey k = base_key();
    change(k);
    out.emplace_back(name, k);
  };
  add("device", [](GemmPlanKey& k) { k.device = 1; });
  add("ab_type", [](GemmPlanKey& k) { k.ab_type = 14; });  // CUDA_R_16BF
  add("c_type", [](GemmPlanKey& k) { k.c_type = 2; });     // CUDA_R_16F
  add("op_a", [](GemmPlanKey& k) { k.op_a = 1; });
  add("op_b", [](GemmPlanKey& k) { k.op_b = 0; });
  add("m", [](GemmPlanKey& k) { k.m = 65; });
  add("n", [](GemmPlanKey& k) { k.n = 33; });
  add("k", [](GemmPlanKey& k) { k.k = 17; });
  add("lda", [](GemmPlanKey& k) { k.lda = 128; });
  add("ldb", [](GemmPlanKey& k) { k.ldb = 32; });
  add("ldc", [](GemmPlanKey& k) { k.ldc = 72; });
  add("batch", [](GemmPlanKey& k) { k.batch = 4; });
  add("stride_a", [](GemmPlanKey& k) { k.stride_a = 1024; });
  add("stride_b", [](GemmPlanKey& k) { k.stride_b = 512; });
  add("stride_c", [](GemmPlanKey& k) { k.stride_c = 2048; });
  add("align_a", [](GemmPlanKey& k) { k.align_a = 4; });
  add("align_b", [](GemmPlanKey& k) { k.align_b = 8; });
  add("align_c", [](GemmPlanKey& k) { k.align_c = 16; });
  add("beta_nonzero", [](GemmPlanKey& k) { k.beta_nonzero = true; });
  add("epilogue", [](GemmPlanKey& k) { k.epilogue = 2; });
  add("workspace_bytes", [](GemmPlanKey& k) { k.workspace_bytes = 4 << 20; });
  return out;
}

TEST(GemmPlanKey, EveryFieldTellsPlansApart) {
  const auto variants = one_field_changed();
  EXPECT_EQ(variants.size(), 21u);  // a new field of the key needs its line above
  LruCache<GemmPlanKey, int, GemmPlanKeyHash> cache(64);
  cache.insert(base_key(), -1);
  for (size_t i = 0; i < variants.size(); ++i) {
    const auto& [name, key] = variants[i];
    EXPECT_FALSE(key == base_key()) << name;
    EXPECT_EQ(cache.find(key), nullptr) << name << " changed must miss";
    cache.insert(key, int(i));
  }
  EXPECT_EQ(cache.size(), variants.size() + 1);
  for (size_t i = 0; i < variants.size(); ++i) {
    int* v = cache.find(variants[i].second);
    ASSERT_NE(v, nullptr) << variants[i].first;
    EXPECT_EQ(*v, int(i)) << variants[i].first;
  }
  ASSERT_NE(cache.find(base_key()), nullptr);
  EXPECT_EQ(*cache.find(base_key()), -1);
  // An equal key built separately hits and hashes alike.
  EXPECT_EQ(GemmPlanKeyHash{}(base_key()), GemmPlanKeyHash{}(base_key()));
}

TEST(LruCache, EvictsTheLeastRecentlyUsed) {
  LruCache<int, std::string> cache(3);
  cache.insert(1, "one");
  cache.insert(2, "two");
  cache.insert(3, "three");
  ASSERT_NE(cache.find(1), nullptr);  // 1 is now the most recent; 2 the least
  cache.insert(4, "four");
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_FALSE(cache.contains(2));
  EXPECT_TRUE(cache.contains(1) && cache.contains(3) && cache.contains(4));
  EXPECT_EQ(cache.evictions(), 1u);
  cache.insert(5, "five");  // now 3 is the least recent
  EXPECT_FALSE(cache.contains(3));
  EXPECT_EQ(*cache.find(1), "one");
  EXPECT_EQ(*cache.find(4), "four");
  EXPECT_EQ(*cache.find(5), "five");
  EXPECT_EQ(cache.evictions(), 2u);
  EXPECT_EQ(cache.find(2), nullptr);
  EXPECT_EQ(cache.hits(), 4u);
  EXPECT_EQ(cache.misses(), 1u);
}

TEST(LruCache, InsertingAnExistingKeyReplacesAndRefreshes) {
  LruCache<int, int> cache(2);
  cache.insert(1, 10);
  cache.insert(2, 20);
  cache.insert(1, 11);  // replaces; 2 becomes the least recent
  EXPECT_EQ(cache.size(), 2u);
  cache.insert(3, 30);
  EXPECT_FALSE(cache.contains(2));
  EXPECT_EQ(*cache.find(1), 11);
  EXPECT_EQ(cache.evictions(), 1u);
}

// Values that own resources (cuBLASLt descriptors, in gemm.cu) are destroyed when evicted or cleared, and
// only then.
TEST(LruCache, DestroysEvictedValues) {
  auto alive = std::make_shared<int>(0);
  struct Counted {
    std::shared_ptr<int> alive;
    explicit Counted(std::shared_ptr<int> a) : alive(std::move(a)) { ++*alive; }
    ~Counted() { --*alive; }
  };
  {
    LruCache<int, std::unique_ptr<Counted>> cache(2);
    for (int i = 0; i < 5; ++i) {
      Counted& c = *cache.insert(i, std::make_unique<Counted>(alive));
      EXPECT_EQ(c.alive, alive);
      EXPECT_EQ(*alive, std::min(i + 1, 2)) << "after inserting " << i;
    }
    cache.clear();
    EXPECT_EQ(*alive, 0);
    cache.insert(7, std::make_unique<Counted>(alive));
    EXPECT_EQ(*alive, 1);
  }
  EXPECT_EQ(*alive, 0);
}

TEST(LruCache, RefusesAZeroCapacity) {
  testing::expect_error<Error>([] { LruCache<int, int> cache(0); }, {"capacity"});
}

}  // namespace
}  // namespace frugal

// The memory tag table under a flood of distinct names (core/memory.h): it stays bounded, names past the
// bound are counted in one overflow bucket, and memory_summary() stays short. A program of its own: the tag
// table is per process, and this test fills it.
#include <set>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace frugal {
namespace {

using memory::kMaxTagNames;
constexpr const char* kOverflow = memory::kOverflowTag;

TEST(MemoryTags, AFloodOfNamesIsBoundedAndCountedInTheOverflowBucket) {
  const int64_t base = memory::stats().allocated.current;
  std::vector<Tensor> kept;
  std::set<uint32_t> ids;
  constexpr int kNames = 10000;
  for (int i = 0; i < kNames; ++i) {
    memory::Tag tag("flood/" + std::to_string(i));
    ids.insert(memory::current_tag());
    kept.push_back(empty({256}));  // 1 KiB each
  }
  EXPECT_LE(ids.size(), kMaxTagNames);
  EXPECT_EQ(memory::tag_name(memory::intern_tag("flood/one more")), kOverflow);
  EXPECT_EQ(memory::tag_name(memory::intern_tag("flood/0")), "flood/0");  // names already held keep their id

  // Every byte is counted once: under its own name or under the overflow bucket.
  memory::allocator(kCPU).check_invariants();
  int64_t by_tag = 0, overflow = 0, named = 0;
  for (const memory::TagStats& t : memory::tag_stats()) {
    by_tag += t.allocated.current;
    if (t.tag == kOverflow) overflow = t.allocated.current;
    if (t.tag.rfind("flood/", 0) == 0) named += t.allocated.current;
  }
  EXPECT_EQ(by_tag, memory::stats().allocated.current);
  EXPECT_EQ(named + overflow, memory::stats().allocated.current - base);
  EXPECT_GT(overflow, 0);
  EXPECT_EQ(overflow % 1024, 0);

  const std::string summary = memory::memory_summary();
  EXPECT_LT(summary.size(), 16u << 10) << summary.size() << " bytes";
  EXPECT_NE(summary.find(kOverflow), std::string::npos) << summary;
  EXPECT_NE(summary.find("folded"), std::string::npos) << summary;  // how many names went into the bucket

  kept.clear();
  for (const memory::TagStats& t : memory::tag_stats())
    if (t.tag == kOverflow) {
      EXPECT_EQ(t.allocated.current, 0);
      EXPECT_EQ(t.allocated.peak, overflow);
    }
  memory::allocator(kCPU).check_invariants();
}

}  // namespace
}  // namespace frugal

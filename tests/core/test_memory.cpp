// Tests of the caching arena, the system allocator and the memory API (core/arena.cpp,
// core/system_allocator.cpp, core/memory_api.cpp). Most run on a fresh arena over a counting host backing, so
// that the global CPU allocator stays untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define FRUGAL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FRUGAL_TEST_ASAN 1
#endif
#endif
#if FRUGAL_TEST_ASAN
#include <sanitizer/asan_interface.h>
#endif

#include "core/error.h"
#include "core/memory.h"
#include "core/storage.h"

namespace frugal {
namespace {

using memory::Allocation;
using memory::Allocator;

constexpr int64_t kKiB = 1024, kMiB = 1024 * kKiB;

// Host memory that counts what is live and can refuse beyond a budget (plays a device that is full).
struct BackingLedger {
  int64_t live_bytes = 0;
  int64_t allocs = 0;
  int64_t frees = 0;
  int64_t budget = -1;  // < 0: unlimited
  std::map<void*, int64_t> live;
};

class TestBacking final : public memory::Backing {
 public:
  explicit TestBacking(std::shared_ptr<BackingLedger> ledger) : ledger_(std::move(ledger)) {}
  void* alloc(int64_t nbytes) override {
    if (ledger_->budget >= 0 && ledger_->live_bytes + nbytes > ledger_->budget) return nullptr;
    void* p = std::aligned_alloc(64, size_t(nbytes));
    ledger_->live_bytes += nbytes;
    ++ledger_->allocs;
    ledger_->live[p] = nbytes;
    return p;
  }
  void free(void* ptr, int64_t nbytes) override {
    auto it = ledger_->live.find(ptr);
    if (it == ledger_->live.end() || it->second != nbytes)
      ADD_FAILURE() << "backing freed a pointer it never gave";
    if (it != ledger_->live.end()) ledger_->live.erase(it);
    ledger_->live_bytes -= nbytes;
    ++ledger_->frees;
    std::free(ptr);
  }

 private:
  std::shared_ptr<BackingLedger> ledger_;
};

struct Fixture {
  std::shared_ptr<BackingLedger> ledger = std::make_shared<BackingLedger>();
  std::unique_ptr<Allocator> arena = memory::make_arena(kCPU, std::make_unique<TestBacking>(ledger));
};

// Fills n bytes with a pattern unique to `seed`, and checks it is still there: two overlapping blocks
// overwrite each other's patterns. Word-wise without early exit, so the check vectorises and the big blocks
// stay cheap.
uint64_t pattern_of(uint64_t seed) { return (seed + 1) * 0x9E3779B97F4A7C15ull; }
void fill(void* p, int64_t n, uint64_t seed) {
  const uint64_t pat = pattern_of(seed);
  auto* w = static_cast<uint64_t*>(p);
  for (int64_t i = 0; i < n / 8; ++i) w[i] = pat;
  std::memcpy(static_cast<char*>(p) + n / 8 * 8, &pat, size_t(n % 8));
}
bool holds(const void* p, int64_t n, uint64_t seed) {
  const uint64_t pat = pattern_of(seed);
  const auto* w = static_cast<const uint64_t*>(p);
  uint64_t diff = 0;
  for (int64_t i = 0; i < n / 8; ++i) diff |= w[i] ^ pat;
  return diff == 0 && std::memcmp(static_cast<const char*>(p) + n / 8 * 8, &pat, size_t(n % 8)) == 0;
}

const memory::BlockInfo* find_block(const std::vector<memory::BlockInfo>& snap, const void* ptr) {
  for (const auto& b : snap)
    if (b.address == reinterpret_cast<uintptr_t>(ptr)) return &b;
  return nullptr;
}

// Compares every statistic but the counters named in `except`.
void expect_same_stats(const memory::Stats& a, const memory::Stats& b) {
  for (auto [x, y] : {std::pair{a.requested, b.requested},
                      {a.allocated, b.allocated},
                      {a.reserved, b.reserved},
                      {a.active_blocks, b.active_blocks},
                      {a.segments, b.segments}}) {
    EXPECT_EQ(x.current, y.current);
    EXPECT_EQ(x.peak, y.peak);
  }
  EXPECT_EQ(a.num_allocs, b.num_allocs);
  EXPECT_EQ(a.num_frees, b.num_frees);
  EXPECT_EQ(a.num_segment_allocs, b.num_segment_allocs);
  EXPECT_EQ(a.num_segment_frees, b.num_segment_frees);
}

// (a) Long random sequences: blocks never overlap (their patterns survive), the invariants hold throughout,
// and everything comes back at the end.
TEST(Arena, RandomAllocFreeKeepsInvariantsAndData) {
  Fixture f;
  std::mt19937_64 rng(20240611);
  struct Live {
    Allocation a;
    int64_t nbytes;
    uint64_t seed;
  };
  std::vector<Live> live;
  uint64_t next_seed = 0;
  int64_t live_requested = 0;
  auto draw_size = [&]() -> int64_t {
    const int kind = int(rng() % 100);
    if (kind < 75) return int64_t(rng() % (64 * kKiB));
    if (kind < 97) return int64_t(64 * kKiB + rng() % (kMiB + kMiB / 2));
    return int64_t(kMiB + rng() % (12 * kMiB));
  };
  // Returns false when the block's bytes were overwritten (by an overlapping block).
  auto free_one = [&](size_t i) {
    const bool intact = holds(live[i].a.ptr, live[i].nbytes, live[i].seed);
    f.arena->deallocate(live[i].a.block);
    live_requested -= live[i].nbytes;
    live[i] = live.back();
    live.pop_back();
    return intact;
  };
  for (int op = 0; op < 20000; ++op) {
    const bool alloc = live.empty() || (live.size() < 300 && rng() % 100 < 55);
    if (alloc) {
      const int64_t n = draw_size();
      Allocation a = f.arena->allocate(n);
      ASSERT_NE(a.ptr, nullptr);
      ASSERT_EQ(reinterpret_cast<uintptr_t>(a.ptr) % 64, 0u);
      ASSERT_GE(a.size, std::max<int64_t>(n, 512));
      ASSERT_EQ(a.size % 512, 0);
      fill(a.ptr, n, next_seed);
      live.push_back({a, n, next_seed++});
      live_requested += n;
    } else {
      ASSERT_TRUE(free_one(size_t(rng() % live.size()))) << "a block was overwritten, at op " << op;
    }
    if (op % 250 == 0) {
      ASSERT_NO_THROW(f.arena->check_invariants()) << "after op " << op;
      const auto s = f.arena->stats();
      ASSERT_EQ(s.requested.current, live_requested);
      ASSERT_EQ(s.active_blocks.current, int64_t(live.size()));
      ASSERT_EQ(s.reserved.current, f.ledger->live_bytes);
    }
  }
  while (!live.empty()) ASSERT_TRUE(free_one(live.size() - 1)) << "a block was overwritten";
  f.arena->check_invariants();
  auto s = f.arena->stats();
  EXPECT_EQ(s.allocated.current, 0);
  EXPECT_EQ(s.requested.current, 0);
  EXPECT_EQ(s.num_allocs, s.num_frees);
  EXPECT_GT(s.reserved.current, 0);  // cached, not returned
  // Every segment is one free block again, so emptying the cache returns all of them.
  for (const auto& b : f.arena->snapshot()) EXPECT_FALSE(b.allocated);
  EXPECT_EQ(f.arena->snapshot().size(), size_t(s.segments.current));
  f.arena->empty_cache();
  s = f.arena->stats();
  EXPECT_EQ(s.reserved.current, 0);
  EXPECT_EQ(s.segments.current, 0);
  EXPECT_EQ(f.ledger->live_bytes, 0);
  EXPECT_EQ(f.ledger->allocs, f.ledger->frees);
}

// The arena is shared with a data-loader thread: concurrent use must leave it consistent. Each thread checks
// its blocks' first bytes (a block handed to two threads loses one pattern); most time goes to the allocator,
// so a missing lock shows up as corruption.
// Note [the arena under AddressSanitizer]: in a build with ASan a block's bytes past its request, a freed
// block and the rest of a fresh segment are poisoned, and the bytes asked for are not. Skipped in other
// builds, where the arena poisons nothing.
TEST(Arena, UnderAddressSanitizerWhatNoTensorOwnsIsPoisoned) {
#if FRUGAL_TEST_ASAN
  Fixture f;
  const Allocation a = f.arena->allocate(100);
  const char* p = static_cast<const char*>(a.ptr);
  EXPECT_FALSE(__asan_address_is_poisoned(p));
  EXPECT_FALSE(__asan_address_is_poisoned(p + 99));
  EXPECT_TRUE(__asan_address_is_poisoned(p + 100));
  EXPECT_TRUE(__asan_address_is_poisoned(p + a.size - 1));
  EXPECT_TRUE(__asan_address_is_poisoned(p + a.size));  // the rest of the segment, free
  f.arena->deallocate(a.block);
  EXPECT_TRUE(__asan_address_is_poisoned(p));
  const Allocation b = f.arena->allocate(3000);
  const char* q = static_cast<const char*>(b.ptr);
  EXPECT_FALSE(__asan_address_is_poisoned(q));
  EXPECT_FALSE(__asan_address_is_poisoned(q + 2999));
  EXPECT_TRUE(__asan_address_is_poisoned(q + 3000));
  f.arena->deallocate(b.block);
  f.arena->empty_cache();  // the segments go back to the backing unpoisoned (std::free would not mind)
#else
  GTEST_SKIP() << "a build without AddressSanitizer: the arena poisons nothing";
#endif
}

TEST(Arena, ConcurrentThreadsKeepInvariants) {
  Fixture f;
  constexpr int kThreads = 4, kOps = 20000;
  constexpr int64_t kChecked = 64;
  auto worker = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    struct Live {
      Allocation a;
      uint64_t pattern;
      int64_t checked;  // the first bytes, at most the request (past it the arena poisons under ASan)
    };
    std::vector<Live> live;
    int corrupted = 0;
    for (int op = 0; op < kOps; ++op) {
      if (live.empty() || (live.size() < 32 && rng() % 2)) {
        const int64_t n = int64_t(rng() % 100000);
        Allocation a = f.arena->allocate(n);
        live.push_back({a, seed * kOps + uint64_t(op), std::min(kChecked, n)});
        fill(a.ptr, live.back().checked, live.back().pattern);
      } else {
        const size_t i = size_t(rng() % live.size());
        corrupted += !holds(live[i].a.ptr, live[i].checked, live[i].pattern);
        f.arena->deallocate(live[i].a.block);
        live[i] = live.back();
        live.pop_back();
      }
    }
    for (const Live& l : live) f.arena->deallocate(l.a.block);
    EXPECT_EQ(corrupted, 0) << "thread " << seed;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, uint64_t(t + 1));
  for (auto& t : threads) t.join();
  EXPECT_NO_THROW(f.arena->check_invariants());
  EXPECT_EQ(f.arena->stats().allocated.current, 0);
  EXPECT_EQ(f.arena->stats().num_allocs, f.arena->stats().num_frees);
}

// (b) A freed block merges with its free neighbours; three adjacent blocks end as one free segment again.
TEST(Arena, SplitsAndMergesNeighbours) {
  Fixture f;
  Allocation a = f.arena->allocate(1000), b = f.arena->allocate(2048), c = f.arena->allocate(512);
  ASSERT_EQ(a.size, 1024);
  EXPECT_EQ(static_cast<char*>(b.ptr), static_cast<char*>(a.ptr) + 1024);
  EXPECT_EQ(static_cast<char*>(c.ptr), static_cast<char*>(b.ptr) + 2048);
  auto snap = f.arena->snapshot();
  ASSERT_EQ(snap.size(), 4u);  // a, b, c, the free tail of the 2 MiB segment
  EXPECT_FALSE(snap[3].allocated);
  EXPECT_EQ(snap[3].size, 2 * kMiB - 1024 - 2048 - 512);

  f.arena->deallocate(b.block);
  f.arena->check_invariants();
  snap = f.arena->snapshot();
  ASSERT_EQ(snap.size(), 4u);  // b's hole sits between two live blocks: nothing to merge with
  EXPECT_FALSE(snap[1].allocated);
  EXPECT_EQ(snap[1].size, 2048);

  // Best fit: a 2000-byte request takes b's hole, not the big tail.
  Allocation b2 = f.arena->allocate(2000);
  EXPECT_EQ(b2.ptr, b.ptr);
  f.arena->deallocate(b2.block);

  f.arena->deallocate(a.block);  // merges with b's hole
  f.arena->check_invariants();
  snap = f.arena->snapshot();
  ASSERT_EQ(snap.size(), 3u);
  EXPECT_EQ(snap[0].address, reinterpret_cast<uintptr_t>(a.ptr));
  EXPECT_EQ(snap[0].size, 1024 + 2048);
  EXPECT_FALSE(snap[0].allocated);

  f.arena->deallocate(c.block);  // merges with both sides
  f.arena->check_invariants();
  snap = f.arena->snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].address, reinterpret_cast<uintptr_t>(a.ptr));
  EXPECT_EQ(snap[0].size, 2 * kMiB);
  EXPECT_FALSE(snap[0].allocated);
  EXPECT_EQ(f.arena->stats().largest_free_block, 2 * kMiB);
  EXPECT_EQ(f.arena->stats().fragmentation, 0.0);
}

// A freed small block waits, unmerged, in the bin of its size (Note [exact-fit bins]): a request of that size
// takes the newest one back; a request its bin cannot serve first merges the bins back into the pool, so it
// gets the best fit that merging at once would have given, and no new segment. Throughout, the snapshot and
// largest_free_block show adjacent free blocks as the one block they merge into.
TEST(Arena, BinnedBlocksComeBackExactlyAndMergeOnAMiss) {
  Fixture f;
  Allocation a = f.arena->allocate(1024), b = f.arena->allocate(2048), c = f.arena->allocate(4096),
             d = f.arena->allocate(512);
  f.arena->deallocate(b.block);
  f.arena->deallocate(c.block);
  f.arena->check_invariants();
  EXPECT_EQ(f.arena->stats().allocated.current, 1024 + 512);
  auto snap = f.arena->snapshot();
  ASSERT_EQ(snap.size(), 4u);  // a, b and c as one free block, d, the tail
  EXPECT_EQ(snap[1].address, reinterpret_cast<uintptr_t>(b.ptr));
  EXPECT_EQ(snap[1].size, 2048 + 4096);
  EXPECT_FALSE(snap[1].allocated);
  EXPECT_EQ(f.arena->stats().largest_free_block, 2 * kMiB - 1024 - 2048 - 4096 - 512);

  // A binned block of the size comes back, not the best fit of the merged layout (b's address).
  const Allocation c2 = f.arena->allocate(4096), b2 = f.arena->allocate(2048);
  EXPECT_EQ(c2.ptr, c.ptr);
  EXPECT_EQ(b2.ptr, b.ptr);
  f.arena->check_invariants();
  f.arena->deallocate(b2.block);
  f.arena->deallocate(c2.block);

  // 5 KiB has no bin entry: the bins merge back, and b and c together are the best fit, not the tail.
  Allocation e = f.arena->allocate(5000);
  EXPECT_EQ(e.ptr, b.ptr);
  EXPECT_EQ(f.arena->stats().segments.current, 1);
  f.arena->check_invariants();
  snap = f.arena->snapshot();
  ASSERT_EQ(snap.size(), 5u);  // a, e, what is left of b and c, d, the tail
  EXPECT_EQ(snap[1].size, 5120);
  EXPECT_FALSE(snap[2].allocated);
  EXPECT_EQ(snap[2].size, 1024);

  // Two blocks of one size: the newest comes back first (merged at once, p's address would be the best fit).
  Allocation p = f.arena->allocate(512), q = f.arena->allocate(512);
  EXPECT_EQ(p.ptr, static_cast<char*>(e.ptr) + 5120);
  EXPECT_EQ(q.ptr, static_cast<char*>(p.ptr) + 512);
  f.arena->deallocate(p.block);
  f.arena->deallocate(q.block);
  const Allocation q2 = f.arena->allocate(512);
  EXPECT_EQ(q2.ptr, q.ptr);
  f.arena->check_invariants();
  for (memory::Block* blk : {a.block, d.block, e.block, q2.block}) f.arena->deallocate(blk);
  f.arena->empty_cache();  // every segment is one free block again: all go back
  EXPECT_EQ(f.arena->stats().reserved.current, 0);
  EXPECT_EQ(f.ledger->live_bytes, 0);
}

// Two binned neighbours in a full segment: largest_free_block and the fragmentation figure count them as the
// one block they merge into, and a request for that merged size is served from them, not by a new segment.
TEST(Arena, BinnedNeighboursCountAsOneFreeBlock) {
  Fixture f;
  const int64_t quarter = kMiB / 2;  // four fill the 2 MiB segment of small requests
  std::vector<Allocation> q;
  for (int i = 0; i < 4; ++i) q.push_back(f.arena->allocate(quarter));
  ASSERT_EQ(f.arena->stats().segments.current, 1);
  f.arena->deallocate(q[1].block);
  f.arena->deallocate(q[2].block);
  f.arena->check_invariants();
  auto s = f.arena->stats();
  EXPECT_EQ(s.largest_free_block, 2 * quarter);
  EXPECT_EQ(s.fragmentation, 0.0);  // all the free bytes are one block
  const Allocation merged = f.arena->allocate(2 * quarter);
  EXPECT_EQ(merged.ptr, q[1].ptr);
  EXPECT_EQ(f.arena->stats().segments.current, 1);
  f.arena->check_invariants();
  for (memory::Block* blk : {q[0].block, q[3].block, merged.block}) f.arena->deallocate(blk);
}

// (c) Rounding, the choice of pool, and segment sizes.
TEST(Arena, RoundsRequestsAndPicksPoolAndSegmentSize) {
  {
    Fixture f;
    EXPECT_EQ(f.arena->allocate(0).size, 512);
    EXPECT_EQ(f.arena->allocate(1).size, 512);
    EXPECT_EQ(f.arena->allocate(512).size, 512);
    EXPECT_EQ(f.arena->allocate(513).size, 1024);
    EXPECT_EQ(f.arena->allocate(kMiB).size, kMiB);  // the largest small request
    auto s = f.arena->stats();
    EXPECT_EQ(s.segments.current, 1);  // all of them share one 2 MiB small segment
    EXPECT_EQ(s.reserved.current, 2 * kMiB);
    EXPECT_EQ(s.requested.current, 0 + 1 + 512 + 513 + kMiB);
    EXPECT_EQ(s.allocated.current, 512 + 512 + 512 + 1024 + kMiB);
    f.arena->check_invariants();
  }
  {
    Fixture f;  // just over 1 MiB is large: a 20 MiB segment, split
    Allocation a = f.arena->allocate(kMiB + 1);
    EXPECT_EQ(a.size, kMiB + 512);
    EXPECT_EQ(f.arena->stats().reserved.current, 20 * kMiB);
    EXPECT_EQ(f.ledger->allocs, 1);
    // A small request never comes from the large pool's free space.
    f.arena->allocate(4 * kKiB);
    EXPECT_EQ(f.arena->stats().segments.current, 2);
    EXPECT_EQ(f.arena->stats().reserved.current, 22 * kMiB);
    // Another large request does: best fit in the tail of the 20 MiB segment.
    Allocation b = f.arena->allocate(3 * kMiB);
    EXPECT_EQ(static_cast<char*>(b.ptr), static_cast<char*>(a.ptr) + a.size);
    EXPECT_EQ(f.arena->stats().segments.current, 2);
    f.arena->check_invariants();
  }
  {
    Fixture f;  // under 10 MiB: the shared 20 MiB segment
    f.arena->allocate(10 * kMiB - 512);
    EXPECT_EQ(f.arena->stats().reserved.current, 20 * kMiB);
  }
  {
    Fixture f;  // 10 MiB and up: a segment of its own, rounded to 2 MiB
    EXPECT_EQ(f.arena->allocate(10 * kMiB).size, 10 * kMiB);
    EXPECT_EQ(f.arena->stats().reserved.current, 10 * kMiB);
  }
  {
    Fixture f;  // a large block is not split for a tail of 1 MiB or less: the caller gets the whole segment
    Allocation a = f.arena->allocate(11 * kMiB + 1);
    EXPECT_EQ(f.arena->stats().reserved.current, 12 * kMiB);
    EXPECT_EQ(a.size, 12 * kMiB);
    EXPECT_EQ(f.arena->stats().allocated.current, 12 * kMiB);
    EXPECT_EQ(f.arena->snapshot().size(), 1u);
    f.arena->check_invariants();
  }
  {
    Fixture f;
    EXPECT_THROW(f.arena->allocate(-1), Error);
  }
}

// (d) empty_cache returns the fully free segments and only those; live blocks keep their bytes.
TEST(Arena, EmptyCacheReturnsFreeSegmentsAndKeepsLiveBlocks) {
  Fixture f;
  Allocation big1 = f.arena->allocate(12 * kMiB);     // own 12 MiB segment
  Allocation big2 = f.arena->allocate(16 * kMiB);     // own 16 MiB segment
  Allocation small1 = f.arena->allocate(100 * kKiB);  // small segment
  Allocation small2 = f.arena->allocate(200 * kKiB);  // same small segment
  fill(big2.ptr, 16 * kMiB, 7);
  fill(small1.ptr, 100 * kKiB, 8);
  EXPECT_EQ(f.arena->stats().reserved.current, 30 * kMiB);
  f.arena->deallocate(big1.block);
  f.arena->deallocate(small2.block);                        // its segment still holds small1
  EXPECT_EQ(f.arena->stats().reserved.current, 30 * kMiB);  // cached
  const auto before = f.arena->stats();
  f.arena->empty_cache();
  const auto s = f.arena->stats();
  EXPECT_EQ(s.reserved.current, 16 * kMiB + 2 * kMiB);
  EXPECT_EQ(s.segments.current, 2);
  EXPECT_EQ(s.num_segment_frees, before.num_segment_frees + 1);
  EXPECT_EQ(s.num_cache_flushes, before.num_cache_flushes + 1);
  EXPECT_EQ(s.allocated.current, before.allocated.current);
  EXPECT_EQ(f.ledger->live_bytes, s.reserved.current);
  EXPECT_TRUE(holds(big2.ptr, 16 * kMiB, 7));
  EXPECT_TRUE(holds(small1.ptr, 100 * kKiB, 8));
  f.arena->check_invariants();
  f.arena->deallocate(big2.block);
  f.arena->deallocate(small1.block);
  f.arena->empty_cache();
  EXPECT_EQ(f.arena->stats().reserved.current, 0);
  EXPECT_EQ(f.ledger->live_bytes, 0);
}

// Destroying an arena returns every segment, live or cached.
TEST(Arena, DestructorReturnsEverySegment) {
  auto ledger = std::make_shared<BackingLedger>();
  {
    auto arena = memory::make_arena(kCPU, std::make_unique<TestBacking>(ledger));
    arena->allocate(100);
    arena->deallocate(arena->allocate(30 * kMiB).block);
    EXPECT_EQ(ledger->live_bytes, 2 * kMiB + 30 * kMiB);
  }
  EXPECT_EQ(ledger->live_bytes, 0);
  EXPECT_EQ(ledger->allocs, ledger->frees);
}

// (e) A request beyond the limit throws a helpful OutOfMemoryError and changes nothing.
TEST(Arena, LimitThrowsOutOfMemoryAndLeavesStateIntact) {
  Fixture f;
  f.arena->set_limit(8 * kMiB);
  EXPECT_EQ(f.arena->limit(), 8 * kMiB);
  // Under a limit a large request takes the smallest segment that holds it (not the usual 20 MiB).
  Allocation a = f.arena->allocate(kMiB + kKiB);
  EXPECT_EQ(f.arena->stats().reserved.current, 2 * kMiB);
  Allocation b = f.arena->allocate(4 * kKiB);
  fill(a.ptr, kMiB + kKiB, 1);
  fill(b.ptr, 4 * kKiB, 2);
  const auto before = f.arena->stats();
  try {
    f.arena->allocate(8 * kMiB);  // needs an 8 MiB segment; 4 MiB are already reserved
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("8388608 bytes (8.00 MiB)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("limit 8.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("reserved 4.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("allocated"), std::string::npos) << msg;
    EXPECT_NE(msg.find("free in cache"), std::string::npos) << msg;
    EXPECT_NE(msg.find("accumulate gradients over smaller micro-batches"), std::string::npos) << msg;
    EXPECT_NE(msg.find("amp::Autocast"), std::string::npos) << msg;
    EXPECT_NE(msg.find("memory::set_memory_limit"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("--"), std::string::npos) << "a program's flag in the library's advice: " << msg;
  }
  const auto after = f.arena->stats();
  expect_same_stats(before, after);
  EXPECT_EQ(after.num_ooms, before.num_ooms + 1);
  EXPECT_EQ(after.num_cache_flushes, before.num_cache_flushes + 1);  // it tried emptying the cache first
  EXPECT_EQ(f.ledger->live_bytes, after.reserved.current);           // nothing leaked
  EXPECT_TRUE(holds(a.ptr, kMiB + kKiB, 1));
  EXPECT_TRUE(holds(b.ptr, 4 * kKiB, 2));
  f.arena->check_invariants();
  Allocation c = f.arena->allocate(3 * kMiB);  // smaller: fits
  EXPECT_EQ(f.arena->stats().reserved.current, 8 * kMiB);
  f.arena->deallocate(c.block);
  f.arena->check_invariants();
}

TEST(Arena, LimitFlushesTheCacheBeforeGivingUp) {
  Fixture f;
  f.arena->set_limit(4 * kMiB);
  Allocation a = f.arena->allocate(kMiB);         // a 2 MiB small segment
  Allocation b = f.arena->allocate(kMiB + kKiB);  // a 2 MiB large segment
  f.arena->deallocate(a.block);
  f.arena->deallocate(b.block);
  EXPECT_EQ(f.arena->stats().reserved.current, 4 * kMiB);  // both cached
  const auto before = f.arena->stats();
  Allocation c = f.arena->allocate(3 * kMiB);  // a 4 MiB segment: fits only once the cache is gone
  const auto s = f.arena->stats();
  EXPECT_EQ(s.num_cache_flushes, before.num_cache_flushes + 1);
  EXPECT_EQ(s.num_segment_frees, before.num_segment_frees + 2);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.reserved.current, 4 * kMiB);
  EXPECT_EQ(f.ledger->live_bytes, 4 * kMiB);
  fill(c.ptr, 3 * kMiB, 3);
  EXPECT_TRUE(holds(c.ptr, 3 * kMiB, 3));
  f.arena->check_invariants();
  f.arena->set_limit(0);  // removed
  EXPECT_EQ(f.arena->limit(), 0);
  f.arena->allocate(40 * kMiB);
}

// Note [a small request borrows from the large pool]: under a limit that leaves no room for a small
// segment, a small request is carved out of a large segment's free piece instead of failing.
TEST(Arena, UnderTheLimitASmallRequestBorrowsFromALargeSegment) {
  Fixture f;
  f.arena->set_limit(4 * kMiB);
  Allocation large = f.arena->allocate(2 * kMiB + 512 * kKiB);  // a 4 MiB segment, 1.5 MiB of it free
  Allocation small = f.arena->allocate(512 * kKiB);  // no room for a 2 MiB small segment under the limit
  auto s = f.arena->stats();
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.segments.current, 1);
  EXPECT_EQ(s.reserved.current, 4 * kMiB);
  EXPECT_EQ(static_cast<char*>(small.ptr), static_cast<char*>(large.ptr) + large.size);  // the free piece
  fill(large.ptr, large.size, 1);
  fill(small.ptr, small.size, 2);
  EXPECT_TRUE(holds(large.ptr, large.size, 1));
  EXPECT_TRUE(holds(small.ptr, small.size, 2));
  f.arena->check_invariants();
  // Freed, it merges back into the large segment's free piece, which serves a large request again.
  f.arena->deallocate(small.block);
  f.arena->check_invariants();
  Allocation again = f.arena->allocate(kMiB + 256 * kKiB);
  EXPECT_EQ(again.ptr, small.ptr);
  s = f.arena->stats();
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.segments.current, 1);
  f.arena->deallocate(again.block);
  f.arena->deallocate(large.block);
  f.arena->check_invariants();
}

TEST(Arena, BackingRefusalIsOutOfMemory) {
  Fixture f;
  f.ledger->budget = 5 * kMiB;                 // no limit set: the "device" itself is full
  Allocation a = f.arena->allocate(3 * kMiB);  // 20 MiB refused; 4 MiB fits
  EXPECT_EQ(f.arena->stats().reserved.current, 4 * kMiB);
  try {
    f.arena->allocate(3 * kMiB);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("3145728 bytes (3.00 MiB)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("no memory left"), std::string::npos) << msg;
    EXPECT_NE(msg.find("limit none"), std::string::npos) << msg;
  }
  EXPECT_EQ(f.arena->stats().num_ooms, 1);
  f.arena->check_invariants();
  f.arena->deallocate(a.block);
  f.arena->allocate(3 * kMiB);  // the cached block is reused
  EXPECT_EQ(f.ledger->allocs, 1);
}

// (f) Tags: nested scopes join with '/', blocks carry them, per-tag bytes are exact.
TEST(Memory, TagsNameAllocations) {
  Fixture f;
  EXPECT_EQ(memory::current_tag(), 0u);
  EXPECT_EQ(memory::tag_name(0), "");
  Allocation x, y, z;
  uint32_t fwd_id = 0;
  {
    memory::Tag fwd("fwd");
    fwd_id = memory::current_tag();
    EXPECT_EQ(memory::tag_name(fwd_id), "fwd");
    {
      memory::Tag block("block3");
      EXPECT_EQ(memory::tag_name(memory::current_tag()), "fwd/block3");
      x = f.arena->allocate(1000);
      // Another thread has its own tag scope.
      std::thread([&] {
        EXPECT_EQ(memory::current_tag(), 0u);
        memory::Tag loader("loader");
        EXPECT_EQ(memory::tag_name(memory::current_tag()), "loader");
      }).join();
      EXPECT_EQ(memory::tag_name(memory::current_tag()), "fwd/block3");
    }
    EXPECT_EQ(memory::current_tag(), fwd_id);
    y = f.arena->allocate(2000);
  }
  EXPECT_EQ(memory::current_tag(), 0u);
  {
    memory::Tag again("fwd");
    EXPECT_EQ(memory::current_tag(), fwd_id);  // interned
  }
  z = f.arena->allocate(100);

  const auto snap = f.arena->snapshot();
  ASSERT_NE(find_block(snap, x.ptr), nullptr);
  EXPECT_EQ(find_block(snap, x.ptr)->tag, "fwd/block3");
  EXPECT_EQ(find_block(snap, x.ptr)->requested, 1000);
  EXPECT_EQ(find_block(snap, y.ptr)->tag, "fwd");
  EXPECT_EQ(find_block(snap, z.ptr)->tag, "");

  auto tag_bytes = [&](const std::string& name) {
    for (const auto& t : f.arena->tag_stats())
      if (t.tag == name) return t.allocated;
    ADD_FAILURE() << "no tag " << name;
    return memory::Stat{};
  };
  EXPECT_EQ(tag_bytes("fwd/block3").current, 1024);
  EXPECT_EQ(tag_bytes("fwd").current, 2048);
  EXPECT_EQ(tag_bytes("").current, 512);
  EXPECT_EQ(f.arena->tag_stats().size(), 3u);  // "loader" allocated nothing here
  f.arena->deallocate(x.block);
  EXPECT_EQ(tag_bytes("fwd/block3").current, 0);
  EXPECT_EQ(tag_bytes("fwd/block3").peak, 1024);
  f.arena->reset_tag_peaks();
  EXPECT_EQ(tag_bytes("fwd/block3").peak, 0);
  EXPECT_EQ(tag_bytes("fwd").peak, 2048);
  f.arena->check_invariants();
  EXPECT_THROW(memory::tag_name(1u << 30), IndexError);
}

// (g) Statistics are exact after a known sequence; reset_peak brings peaks down to the current values.
TEST(Arena, StatsAreExact) {
  Fixture f;
  Allocation a = f.arena->allocate(100), b = f.arena->allocate(1000), c = f.arena->allocate(3 * kMiB);
  auto s = f.arena->stats();
  EXPECT_EQ(s.requested.current, 100 + 1000 + 3 * kMiB);
  EXPECT_EQ(s.allocated.current, 512 + 1024 + 3 * kMiB);
  EXPECT_EQ(s.reserved.current, 2 * kMiB + 20 * kMiB);
  EXPECT_EQ(s.active_blocks.current, 3);
  EXPECT_EQ(s.segments.current, 2);
  EXPECT_EQ(s.num_allocs, 3);
  EXPECT_EQ(s.num_segment_allocs, 2);
  EXPECT_EQ(s.free_bytes, s.reserved.current - s.allocated.current);
  EXPECT_EQ(s.largest_free_block, 17 * kMiB);

  f.arena->deallocate(c.block);
  s = f.arena->stats();
  EXPECT_EQ(s.requested.current, 1100);
  EXPECT_EQ(s.requested.peak, 1100 + 3 * kMiB);
  EXPECT_EQ(s.allocated.current, 1536);
  EXPECT_EQ(s.allocated.peak, 1536 + 3 * kMiB);
  EXPECT_EQ(s.active_blocks.peak, 3);
  EXPECT_EQ(s.num_frees, 1);
  EXPECT_EQ(s.largest_free_block, 20 * kMiB);  // merged back whole
  EXPECT_EQ(s.free_bytes, 22 * kMiB - 1536);
  EXPECT_DOUBLE_EQ(s.fragmentation, 1.0 - double(20 * kMiB) / double(22 * kMiB - 1536));

  f.arena->reset_peak();
  s = f.arena->stats();
  EXPECT_EQ(s.requested.peak, 1100);
  EXPECT_EQ(s.allocated.peak, 1536);
  EXPECT_EQ(s.active_blocks.peak, 2);
  EXPECT_EQ(s.reserved.peak, 22 * kMiB);
  f.arena->deallocate(a.block);
  f.arena->deallocate(b.block);
  s = f.arena->stats();
  EXPECT_EQ(s.allocated.current, 0);
  EXPECT_EQ(s.allocated.peak, 1536);
  f.arena->check_invariants();
}

// (h) The system allocator: one backing call per block, the same statistics, the same limit.
TEST(SystemAllocator, CountsExactlyAndHonoursTheLimit) {
  auto ledger = std::make_shared<BackingLedger>();
  auto sys = memory::make_system_allocator(kCPU, std::make_unique<TestBacking>(ledger));
  EXPECT_STREQ(sys->kind(), "system");
  Allocation a = sys->allocate(100), b = sys->allocate(0);
  EXPECT_EQ(a.size, 128);
  EXPECT_EQ(b.size, 64);
  EXPECT_NE(a.ptr, b.ptr);
  auto s = sys->stats();
  EXPECT_EQ(s.requested.current, 100);
  EXPECT_EQ(s.allocated.current, 192);
  EXPECT_EQ(s.reserved.current, 192);
  EXPECT_EQ(s.segments.current, 2);
  EXPECT_EQ(s.active_blocks.current, 2);
  EXPECT_EQ(s.num_segment_allocs, 2);
  EXPECT_EQ(ledger->allocs, 2);
  EXPECT_EQ(sys->snapshot().size(), 2u);
  sys->check_invariants();
  sys->deallocate(a.block);
  EXPECT_EQ(ledger->live_bytes, 64);  // returned at once, not cached
  s = sys->stats();
  EXPECT_EQ(s.reserved.current, 64);
  EXPECT_EQ(s.reserved.peak, 192);
  EXPECT_EQ(s.num_frees, 1);
  sys->empty_cache();
  EXPECT_EQ(sys->stats().num_segment_frees, 1);

  sys->set_limit(4096);
  Allocation c = sys->allocate(3990);  // 4032 + 64 = 4096
  fill(c.ptr, 3990, 9);
  const auto before = sys->stats();
  try {
    sys->allocate(1);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("1 bytes (1 B)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("limit 4.00 KiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("recompute activations in backward (autograd::recompute"), std::string::npos) << msg;
  }
  expect_same_stats(before, sys->stats());
  EXPECT_EQ(sys->stats().num_ooms, 1);
  EXPECT_TRUE(holds(c.ptr, 3990, 9));
  sys->deallocate(b.block);
  sys->deallocate(sys->allocate(1).block);  // fits now
  sys->check_invariants();
  sys.reset();
  EXPECT_EQ(ledger->live_bytes, 0);  // c returned by the destructor
}

// A double free is caught as a bug, not silently corrupting the pools.
TEST(Arena, DoubleFreeIsAnInternalError) {
  Fixture f;
  Allocation a = f.arena->allocate(100);
  Allocation keep = f.arena->allocate(100);  // so a's block is not merged away and stays a distinct record
  f.arena->deallocate(a.block);
  EXPECT_THROW(f.arena->deallocate(a.block), InternalError);
  f.arena->check_invariants();
  f.arena->deallocate(keep.block);
}

}  // namespace
}  // namespace frugal

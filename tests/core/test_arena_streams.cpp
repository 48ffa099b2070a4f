// The arena's stream rule (Note [streams and the arena] in core/arena.cpp), on the CPU: a simulated device
// backing with several streams whose events complete when the test says the stream has caught up. The CUDA
// backing (kernels/cuda/cuda_backing.cu) supplies the same five calls with real streams and events.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/memory.h"

namespace frugal {
namespace {

using memory::Allocation;
using memory::Stream;

constexpr int64_t kKiB = 1024, kMiB = 1024 * kKiB;

// What the simulated device knows: its memory, the current stream, and every event ever recorded.
struct SimDevice {
  Stream current = 0;
  int64_t live_bytes = 0;
  int64_t budget = -1;  // < 0: unlimited
  struct EventState {
    Stream stream;
    bool done = false;
    bool released = false;
  };
  std::map<int64_t, EventState> events;  // by id (ids start at 1, so no event is nullptr)
  int64_t waits = 0;

  // The stream has run everything queued on it so far: its events complete.
  void finish(Stream s) {
    for (auto& [id, e] : events)
      if (e.stream == s) e.done = true;
  }
  int64_t recorded() const { return int64_t(events.size()); }
  int64_t unreleased() const {
    int64_t n = 0;
    for (const auto& [id, e] : events) n += !e.released;
    return n;
  }
};

class SimBacking final : public memory::Backing {
 public:
  explicit SimBacking(std::shared_ptr<SimDevice> dev) : dev_(std::move(dev)) {}
  void* alloc(int64_t nbytes) override {
    if (dev_->budget >= 0 && dev_->live_bytes + nbytes > dev_->budget) return nullptr;
    dev_->live_bytes += nbytes;
    return std::aligned_alloc(512, size_t(nbytes));
  }
  void free(void* ptr, int64_t nbytes) override {
    dev_->live_bytes -= nbytes;
    std::free(ptr);
  }
  Stream current_stream() override { return dev_->current; }
  memory::Event record_event(Stream s) override {
    const int64_t id = dev_->recorded() + 1;
    dev_->events[id] = {s};
    return reinterpret_cast<memory::Event>(id);
  }
  bool event_done(memory::Event e) override { return state(e).done; }
  void wait_event(memory::Event e) override {
    ++dev_->waits;
    state(e).done = true;
  }
  void release_event(memory::Event e) override {
    EXPECT_FALSE(state(e).released) << "event released twice";
    state(e).released = true;
  }

 private:
  SimDevice::EventState& state(memory::Event e) {
    auto it = dev_->events.find(int64_t(reinterpret_cast<intptr_t>(e)));
    if (it == dev_->events.end()) {
      ADD_FAILURE() << "an event the backing never recorded";
      static SimDevice::EventState dummy{0, true, false};
      return dummy;
    }
    return it->second;
  }
  std::shared_ptr<SimDevice> dev_;
};

struct Fixture {
  std::shared_ptr<SimDevice> dev = std::make_shared<SimDevice>();
  std::unique_ptr<memory::Allocator> arena = memory::make_arena(cuda(0), std::make_unique<SimBacking>(dev));
  Allocation on(Stream s, int64_t nbytes) {
    dev->current = s;
    return arena->allocate(nbytes);
  }
  void free_on(Stream s, const Allocation& a) {
    dev->current = s;
    arena->deallocate(a.block);
  }
  Stream stream_of(const void* ptr) const {
    for (const auto& b : arena->snapshot())
      if (b.address == reinterpret_cast<uintptr_t>(ptr)) return b.stream;
    ADD_FAILURE() << "no block at " << ptr;
    return ~Stream(0);
  }
};

TEST(ArenaStreams, ReusesAFreedBlockOnlyOnItsOwnStream) {
  Fixture f;
  Allocation a = f.on(1, 4 * kKiB);
  f.free_on(1, a);
  EXPECT_EQ(f.dev->recorded(), 0);  // freed on its own stream: nothing to wait for
  Allocation b = f.on(1, 4 * kKiB);
  EXPECT_EQ(b.ptr, a.ptr);
  f.free_on(1, b);
  Allocation c = f.on(2, 4 * kKiB);  // stream 2 may not take stream 1's cached block
  EXPECT_NE(c.ptr, a.ptr);
  EXPECT_EQ(f.arena->stats().segments.current, 2);
  EXPECT_EQ(f.stream_of(c.ptr), 2u);
  EXPECT_EQ(f.stream_of(a.ptr), 1u);
  f.arena->check_invariants();
  f.free_on(2, c);
}

TEST(ArenaStreams, ABlockFreedWhileAnotherStreamIsCurrentWaitsForThatStream) {
  Fixture f;
  Allocation a = f.on(1, 3 * kMiB);  // the head of a 20 MiB large segment
  f.free_on(2, a);                   // stream 2 may still have work on it
  EXPECT_EQ(f.dev->recorded(), 1);
  EXPECT_EQ(f.dev->events[1].stream, 2u);
  auto s = f.arena->stats();
  EXPECT_EQ(s.allocated.current, 0);  // the caller's bytes are gone at the free...
  EXPECT_EQ(s.num_frees, 1);
  EXPECT_EQ(s.largest_free_block, 17 * kMiB);  // ...but the block is not free to reuse yet
  f.arena->check_invariants();

  Allocation b = f.on(1, 3 * kMiB);
  EXPECT_EQ(static_cast<char*>(b.ptr), static_cast<char*>(a.ptr) + 3 * kMiB);  // the tail, not a's bytes
  f.free_on(1, b);
  f.dev->finish(2);
  Allocation c = f.on(1, 3 * kMiB);  // the event is done: a's block is back and merged with the tail
  EXPECT_EQ(c.ptr, a.ptr);
  EXPECT_EQ(f.dev->unreleased(), 0);
  EXPECT_EQ(f.dev->waits, 0);  // nothing was waited for: the event was polled
  f.arena->check_invariants();
  f.free_on(1, c);
  EXPECT_EQ(f.arena->snapshot().size(), 1u);
}

TEST(ArenaStreams, RecordStreamFencesTheFree) {
  Fixture f;
  Allocation keep = f.on(1, 1000);
  Allocation a = f.on(1, 1000);
  Allocation keep2 = f.on(1, 1000);  // a sits between two live blocks, so its hole keeps its address
  f.arena->record_stream(a.block, 3);
  f.arena->record_stream(a.block, 1);  // its own stream: no fence needed
  f.arena->record_stream(a.block, 3);  // recorded once
  f.free_on(1, a);
  EXPECT_EQ(f.dev->recorded(), 1);
  EXPECT_EQ(f.dev->events[1].stream, 3u);
  Allocation b = f.on(1, 1000);
  EXPECT_NE(b.ptr, a.ptr);
  f.dev->finish(3);
  Allocation c = f.on(1, 1000);
  EXPECT_EQ(c.ptr, a.ptr);
  f.arena->check_invariants();
  for (const Allocation& x : {keep, b, c, keep2}) f.free_on(1, x);
  f.arena->check_invariants();
  EXPECT_THROW(f.arena->record_stream(a.block, 2), InternalError);  // no longer live
}

TEST(ArenaStreams, ShortOfMemoryWaitsForOtherStreamsBeforeGivingUp) {
  Fixture f;
  f.arena->set_limit(20 * kMiB);
  Allocation a = f.on(1, 12 * kMiB);  // a segment of its own
  f.free_on(2, a);
  const auto before = f.arena->stats();
  Allocation b = f.on(1, 12 * kMiB);  // a second 12 MiB segment would pass the limit
  EXPECT_EQ(b.ptr, a.ptr);
  EXPECT_EQ(f.dev->waits, 1);
  const auto s = f.arena->stats();
  EXPECT_EQ(s.num_cache_flushes, before.num_cache_flushes);  // waiting sufficed
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.segments.current, 1);
  f.arena->check_invariants();
  f.free_on(1, b);
}

TEST(ArenaStreams, MemoryMovesBetweenStreamsThroughTheSystemUnderALimit) {
  Fixture f;
  f.arena->set_limit(4 * kMiB);
  f.free_on(1, f.on(1, kMiB));       // stream 1 caches a 2 MiB small segment
  Allocation b = f.on(2, 3 * kMiB);  // stream 2 needs a 4 MiB segment: stream 1's cache must go first
  const auto s = f.arena->stats();
  EXPECT_EQ(s.num_cache_flushes, 1);
  EXPECT_EQ(s.reserved.current, 4 * kMiB);
  EXPECT_EQ(f.dev->live_bytes, 4 * kMiB);
  EXPECT_EQ(f.stream_of(b.ptr), 2u);
  f.free_on(2, b);
}

TEST(ArenaStreams, EmptyCacheWaitsForPendingBlocksAndReturnsEverySegment) {
  Fixture f;
  Allocation a = f.on(1, 1000), b = f.on(2, 5 * kMiB);
  f.free_on(3, a);
  f.free_on(3, b);
  EXPECT_EQ(f.dev->recorded(), 2);
  EXPECT_EQ(f.arena->stats().reserved.current, 22 * kMiB);
  f.arena->empty_cache();
  EXPECT_EQ(f.dev->waits, 2);
  EXPECT_EQ(f.dev->unreleased(), 0);
  EXPECT_EQ(f.arena->stats().reserved.current, 0);
  EXPECT_EQ(f.dev->live_bytes, 0);
  f.arena->check_invariants();
}

TEST(ArenaStreams, OutOfMemoryOnADeviceNamesItAndGivesAdvice) {
  Fixture f;
  f.arena->set_limit(8 * kMiB);
  Allocation a = f.on(1, 3 * kMiB);
  f.free_on(2, a);  // pending: waited for, then the cache is flushed, and still the request does not fit
  try {
    f.on(1, 10 * kMiB);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    for (const char* part : {"out of memory on cuda:0", "10485760 bytes (10.00 MiB)", "limit 8.00 MiB",
                             "lower the batch size", "accumulate gradients"})
      EXPECT_NE(msg.find(part), std::string::npos) << msg << "\nlacks: " << part;
  }
  EXPECT_EQ(f.dev->waits, 0);  // 10 MiB cannot fit under 8 MiB at all: nothing was waited for or freed
  EXPECT_EQ(f.arena->stats().num_ooms, 1);
  f.dev->budget = 5 * kMiB;  // the device itself full: waited for, flushed, then refused
  try {
    f.on(1, 5 * kMiB);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("no memory left"), std::string::npos) << e.what();
  }
  EXPECT_EQ(f.dev->waits, 1);
  EXPECT_EQ(f.arena->stats().reserved.current, 0);
  f.arena->check_invariants();
}

// Note [exact-fit bins]: one bin holds the freed blocks of its size from every stream; only its newest block
// is taken back, and only by its own stream. Any other request of that size merges the bins back and takes
// the best fit of its own stream's pool.
TEST(ArenaStreams, ABinServesOnlyItsNewestBlocksStreamAndAMissMergesEveryBin) {
  Fixture f;
  Allocation a1 = f.on(1, 4 * kKiB);
  Allocation a2 = f.on(2, 4 * kKiB);
  Allocation b1 = f.on(1, 4 * kKiB);  // after a1 in stream 1's segment
  f.free_on(1, a1);
  f.free_on(2, a2);  // the bin's newest
  EXPECT_EQ(f.dev->recorded(), 0);
  f.arena->check_invariants();

  Allocation c2 = f.on(2, 4 * kKiB);  // a hit: the newest block, on its own stream
  EXPECT_EQ(c2.ptr, a2.ptr);
  f.free_on(2, c2);
  Allocation c1 = f.on(1, 4 * kKiB);  // a miss (the newest is stream 2's): merge back, best fit on stream 1
  EXPECT_EQ(f.stream_of(c1.ptr), 1u);
  EXPECT_EQ(c1.ptr, a1.ptr);  // the segment's first hole: the best fit of its size, oldest segment first
  EXPECT_EQ(f.arena->stats().segments.current, 2);
  f.arena->check_invariants();
  // Stream 2's segment is one free block (its block and the rest of the segment, merged).
  int64_t stream2_free = 0;
  for (const auto& b : f.arena->snapshot())
    if (b.stream == 2 && !b.allocated) ++stream2_free;
  EXPECT_EQ(stream2_free, 1);
  for (const Allocation& x : {c1, b1}) f.free_on(1, x);
  f.arena->empty_cache();
  EXPECT_EQ(f.arena->stats().reserved.current, 0);
  f.arena->check_invariants();
}

// A small block freed while another stream may still use it waits for its events, out of the bins: no
// request of its size, on any stream, gets it before they complete.
TEST(ArenaStreams, ABlockThatWaitsForAnEventIsNotBinned) {
  Fixture f;
  Allocation keep = f.on(1, 4 * kKiB);
  Allocation a = f.on(1, 4 * kKiB);
  Allocation keep2 = f.on(1, 4 * kKiB);
  f.free_on(2, a);  // stream 2 may still have work on it
  ASSERT_EQ(f.dev->recorded(), 1);
  Allocation b = f.on(1, 4 * kKiB);
  EXPECT_NE(b.ptr, a.ptr);
  f.free_on(1, b);  // binned: the next request of its size on stream 1 takes it back
  Allocation c = f.on(1, 4 * kKiB);
  EXPECT_EQ(c.ptr, b.ptr);
  f.dev->finish(2);
  Allocation d = f.on(1, 4 * kKiB);  // the event is done: a's block is free again (its own hole)
  EXPECT_EQ(d.ptr, a.ptr);
  EXPECT_EQ(f.dev->unreleased(), 0);
  f.arena->check_invariants();
  for (const Allocation& x : {keep, c, d, keep2}) f.free_on(1, x);
  f.arena->check_invariants();
}

// Random use of three streams: blocks freed from other streams, record_stream, streams catching up at random
// times. A block handed to stream s never overlaps bytes that work queued on another stream before an
// unfinished event may still touch, never overlaps a live block (the data patterns survive), and always
// comes from a segment of stream s; the invariants hold. `repeated` draws most small sizes from a few, as a
// training step does, so that the bins are hit across streams; otherwise sizes are arbitrary.
void random_multi_stream_use(uint64_t seed, bool repeated) {
  Fixture f;
  std::mt19937_64 rng(seed);
  const int64_t kRepeated[] = {512, 4 * kKiB, 4 * kKiB + 512, 64 * kKiB, 200 * kKiB};
  struct Live {
    Allocation a;
    int64_t nbytes;
    Stream stream;
    unsigned char byte;
  };
  struct Busy {
    const char* begin;
    const char* end;
    int64_t event;
  };
  std::vector<Live> live;
  std::vector<Busy> busy;
  unsigned char next_byte = 1;
  for (int op = 0; op < 6000; ++op) {
    const int kind = int(rng() % 100);
    if (kind < 5) {
      f.dev->finish(Stream(1 + rng() % 3));
    } else if (live.empty() || (kind < 55 && live.size() < 200)) {
      const Stream s = Stream(1 + rng() % 3);
      const int64_t n = repeated && rng() % 4 ? kRepeated[rng() % 5]
                        : rng() % 4           ? int64_t(rng() % (256 * kKiB))
                                              : int64_t(rng() % (12 * kMiB));
      Allocation a = f.on(s, n);
      ASSERT_EQ(f.stream_of(a.ptr), s) << "op " << op;
      const char* p = static_cast<const char*>(a.ptr);
      for (const Busy& b : busy) {
        if (f.dev->events[b.event].done) continue;
        ASSERT_FALSE(p < b.end && b.begin < p + a.size) << "op " << op << ": handed out busy bytes";
      }
      std::memset(a.ptr, next_byte, size_t(n));
      live.push_back({a, n, s, next_byte});
      next_byte = next_byte == 255 ? 1 : next_byte + 1;
    } else {
      const size_t i = size_t(rng() % live.size());
      const Live l = live[i];
      const auto* p = static_cast<const unsigned char*>(l.a.ptr);
      for (int64_t j = 0; j < l.nbytes; j += 997) ASSERT_EQ(p[j], l.byte) << "op " << op << ": overwritten";
      if (rng() % 4 == 0) f.arena->record_stream(l.a.block, Stream(1 + rng() % 3));
      const Stream freeing = rng() % 3 ? l.stream : Stream(1 + rng() % 3);
      const int64_t first_event = f.dev->recorded() + 1;
      f.free_on(freeing, l.a);
      for (int64_t e = first_event; e <= f.dev->recorded(); ++e)
        busy.push_back({static_cast<const char*>(l.a.ptr), static_cast<const char*>(l.a.ptr) + l.a.size, e});
      live[i] = live.back();
      live.pop_back();
    }
    if (op % 200 == 0) {
      ASSERT_NO_THROW(f.arena->check_invariants()) << "op " << op;
    }
  }
  EXPECT_GT(f.dev->recorded(), 100);  // the fence paths did run
  for (const Live& l : live) f.free_on(l.stream, l.a);
  f.arena->empty_cache();
  EXPECT_EQ(f.dev->unreleased(), 0);
  EXPECT_EQ(f.arena->stats().reserved.current, 0);
  EXPECT_EQ(f.dev->live_bytes, 0);
  f.arena->check_invariants();
}

TEST(ArenaStreams, RandomMultiStreamUseNeverHandsOutBusyBytes) { random_multi_stream_use(20260107, false); }

TEST(ArenaStreams, RandomMultiStreamUseOfRepeatedSizesNeverHandsOutBusyBytes) {
  random_multi_stream_use(20261204, true);
}

}  // namespace
}  // namespace frugal

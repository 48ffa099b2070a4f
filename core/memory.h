// Memory: the per-device caching arena every tensor byte comes from, its statistics, limits, tags and
// snapshots. The algorithm (core/arena.cpp) is device-agnostic; a device only supplies a Backing (host
// memory, cudaMalloc).
//
//   memory::set_memory_limit(kCPU, 64 << 20);         // let the CPU play a 64 MiB GPU
//   { memory::Tag t("forward/block3"); auto x = randn({1024, 1024}); }
//   std::cout << memory::memory_summary(kCPU);
//   auto s = memory::stats(kCPU); s.allocated.peak;  // exact bytes
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "device.h"

namespace frugal::memory {

struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
};

struct Stats {
  Stat requested;      // bytes the callers asked for
  Stat allocated;      // bytes in live blocks (requests rounded up)
  Stat reserved;       // bytes held from the system (segments), live or cached
  Stat active_blocks;  // live allocations
  Stat segments;       // segments held from the system
  // Note [mapped bytes]: bytes of files mapped read-only that live tensors view (io::map_safetensors). No
  // block of this allocator holds them and the page cache, not the allocator, backs them, but they are the
  // device's tensors' bytes all the same, so they are counted here, beside the blocks, under the tag that
  // was current when the file was mapped (TagStats::mapped).
  Stat mapped;
  Stat footprint;  // allocated + mapped: every byte the device's tensors hold (what serve::ModelPool budgets)
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
  int64_t num_segment_allocs = 0;  // calls to the backing allocation
  int64_t num_segment_frees = 0;
  int64_t num_cache_flushes = 0;  // empty_cache() runs, explicit or forced by the limit
  int64_t num_ooms = 0;           // OutOfMemoryError thrown
  int64_t largest_free_block = 0;
  int64_t free_bytes = 0;  // reserved - allocated
  // 1 - largest_free_block / free_bytes: 0 when the cached free space is one block (or none), near 1 when it
  // is shattered into many small pieces.
  double fragmentation = 0;
};

// A device's stream, opaque to the arena (the bits of a cudaStream_t on CUDA; 0 is the default stream), and
// an event recorded on one (a handle owned by the backing). Note [streams and the arena] in core/arena.cpp.
using Stream = uint64_t;
using Event = void*;

// One block of a snapshot.
struct BlockInfo {
  uint64_t address = 0;    // of the block's first byte
  int64_t size = 0;        // bytes (rounded)
  int64_t requested = 0;   // bytes asked for (0 when free)
  int64_t segment = 0;     // id of the segment holding the block
  bool allocated = false;  // live, or cached free
  std::string tag;         // the memory::Tag scope active at allocation ("" when none)
  Stream stream = 0;       // the stream the block belongs to (0 on the host)
};

struct TagStats {
  std::string tag;
  Stat allocated;  // bytes of live blocks carrying this tag
  Stat mapped;     // bytes of mapped files viewed under this tag (Note [mapped bytes])
};

// Where a device's memory really comes from. Implementations: host (aligned), CUDA (kernels/cuda/).
class Backing {
 public:
  virtual ~Backing() = default;
  virtual void* alloc(int64_t nbytes) = 0;  // nullptr when the system has no memory left
  virtual void free(void* ptr, int64_t nbytes) = 0;

  // Streams and events, for a device that runs work asynchronously in streams: which stream the calling
  // thread issues work to, and events that say when work queued so far on a stream has finished. The arena
  // needs nothing else to keep a block away from a stream that could race with work still queued on another
  // (Note [streams and the arena]). The host runs everything in order on one stream, as the defaults say,
  // and says so with uses_streams() false: the arena then never calls current_stream() (a virtual call on
  // every allocate and free).
  virtual bool uses_streams() const { return true; }
  virtual Stream current_stream() { return 0; }
  virtual Event record_event(Stream) { return nullptr; }  // nullptr: nothing to wait for
  virtual bool event_done(Event) { return true; }
  virtual void wait_event(Event) {}  // blocks the calling thread until the event has completed
  virtual void release_event(Event) {}
};

struct Block;  // opaque to callers; owned by the allocator

struct Allocation {
  void* ptr = nullptr;
  int64_t size = 0;  // rounded size of the block (>= the request)
  Block* block = nullptr;
};

// A device allocator: the caching arena, or (FRUGAL_ALLOCATOR=system) one backing call per allocation.
class Allocator {
 public:
  virtual ~Allocator() = default;
  // On the calling thread's current stream (Backing::current_stream); throws OutOfMemoryError.
  virtual Allocation allocate(int64_t nbytes) = 0;
  virtual void deallocate(Block* block) = 0;
  // Declares that work on `stream` (not the block's own) uses the live block: its free then waits for that
  // work before the block is reused, as PyTorch's record_stream.
  virtual void record_stream(Block* block, Stream stream) = 0;
  virtual Stats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual void empty_cache() = 0;
  virtual void set_limit(int64_t bytes) = 0;  // <= 0: no limit
  virtual int64_t limit() const = 0;
  virtual std::vector<BlockInfo> snapshot() const = 0;
  virtual std::vector<TagStats> tag_stats() const = 0;
  virtual void reset_tag_peaks() = 0;
  // Moves a live block's bytes to another tag (a gradient buffer becoming a parameter's .grad, say).
  virtual void retag(Block* block, uint32_t tag) = 0;
  // Note [mapped bytes]: a mapping of `bytes` that tensors view came (bytes > 0) or went (bytes < 0) under
  // `tag`; retag_mapped moves such bytes from one tag to another.
  virtual void count_mapped(uint32_t tag, int64_t bytes) = 0;
  virtual void retag_mapped(uint32_t from, uint32_t to, int64_t bytes) = 0;
  // Throws InternalError if any invariant is broken (blocks overlap, a byte unaccounted, stats off). For
  // tests.
  virtual void check_invariants() const = 0;
  virtual const char* kind() const = 0;  // "arena" or "system"
};

// The allocator of a device (created on first use; which kind follows FRUGAL_ALLOCATOR, read once).
Allocator& allocator(Device device);
// Installs the backing for a device type; the CUDA backend calls this at load time. Throws if already in use.
void register_backing(DeviceType type, std::unique_ptr<Backing> (*make)(int index));
// A fresh allocator over a given backing, for tests and for the device registry.
std::unique_ptr<Allocator> make_arena(Device device, std::unique_ptr<Backing> backing);
std::unique_ptr<Allocator> make_system_allocator(Device device, std::unique_ptr<Backing> backing);
std::unique_ptr<Backing> make_host_backing();

// Conveniences over allocator(device).
Stats stats(Device device = kCPU);
void reset_peak(Device device = kCPU);
void empty_cache(Device device = kCPU);
void set_memory_limit(Device device, int64_t bytes);  // <= 0 removes the limit
int64_t memory_limit(Device device = kCPU);
std::vector<BlockInfo> snapshot(Device device = kCPU);
std::vector<TagStats> tag_stats(Device device = kCPU);
// A readable table of the statistics (current, peak) and the live bytes per tag: the kSummaryTags tags with
// the highest peaks, one line for the rest, and how many names were folded into kOverflowTag.
std::string memory_summary(Device device = kCPU);
inline constexpr int kSummaryTags = 24;
// "1.50 MiB", "512 B".
std::string format_bytes(int64_t bytes);
// A byte count as people write one, the one parser every program's size flag uses (core/byte_count.cpp):
// digits, an optional fraction, and an optional binary unit (B; K, k or KiB; M, m or MiB; G, g or GiB; T, t
// or TiB): "1000", "64M", "1.5G", "512KiB". Fractions of a byte round down. Throws Error for anything else
// ("", "-5", "1e9", "inf", "0x10", "10MB", " 5"), for 0 bytes ("0", "0.5") and beyond int64 ("9999999999G").
int64_t parse_bytes(std::string_view text);

// Names the allocations made in its scope (this thread only). Nested tags join with '/':
// Tag a("forward"); Tag b("block3");  => "forward/block3".
class Tag {
 public:
  explicit Tag(std::string_view name);
  // Names them with the interned tag `id` (memory::intern_tag) as it is, not joined with the current scope:
  // for a library that keeps its own names whatever scope its caller is in (serve::ModelPool's
  // "model/<name>/activations").
  explicit Tag(uint32_t id);
  ~Tag();
  Tag(const Tag&) = delete;
  Tag& operator=(const Tag&) = delete;

 private:
  uint32_t previous_;
};
// The id of this thread's current tag (0 = none) and the name behind an id; ids are interned and never
// reused.
uint32_t current_tag();
// The id of a full tag name (not joined with the current scope), interning it on first use.
uint32_t intern_tag(std::string_view name);
std::string tag_name(uint32_t id);

// Counts the blocks the calling thread allocates while it lives, and those it frees (a block made before it
// and freed now counts too, so current() can go below 0): their bytes as `allocated` counts them (rounded),
// and the most they came to at once. For measuring one piece of work on a thread while other threads
// allocate too (serve::ModelPool sizes a request so where no dry run can). Blocks that the work makes on
// other threads, or that other threads free, are not seen. Probes nest; each counts everything made in it.
//   memory::AllocationProbe probe;  model->forward(x);  probe.peak();  // bytes the forward held at most
class AllocationProbe {
 public:
  AllocationProbe();
  ~AllocationProbe();
  AllocationProbe(const AllocationProbe&) = delete;
  AllocationProbe& operator=(const AllocationProbe&) = delete;
  int64_t current() const { return current_; }
  int64_t peak() const { return peak_; }
  void count(int64_t bytes);  // a block of this many bytes made (> 0) or freed (< 0); Storage calls it

 private:
  AllocationProbe* outer_;
  int64_t current_ = 0, peak_ = 0;
};

// The tag table holds at most kMaxTagNames names (every joined name of a Tag scope counts), so a program
// that names a tag per step or per sample stays bounded: once it is full, a new name gets the id of
// kOverflowTag, whose statistics then count the bytes of every name folded into it. Names already held keep
// their ids.
inline constexpr size_t kMaxTagNames = 4096;
inline constexpr const char* kOverflowTag = "(other tags)";
// How many distinct names have been folded into kOverflowTag, counted exactly up to kMaxFoldedCount (a
// larger number reads as kMaxFoldedCount).
inline constexpr int64_t kMaxFoldedCount = 4 * int64_t(kMaxTagNames);
int64_t folded_tag_names();

}  // namespace frugal::memory

namespace frugal::memory::detail {
// Note [failing an allocation]
// To test what a program does when memory runs out at any point, the n-th allocation from now (1: the next
// one; on any device and allocator) throws OutOfMemoryError as if the memory limit were reached, before the
// allocator changes anything; the ones after it succeed again. 0 disarms. A user sets FRUGAL_FAIL_ALLOC_AT=n
// instead, counted from when the first allocator is made (which is when it is read). What a failed
// training step guarantees: Note [a failed step changes nothing] in optim/optimizer.h.
//   memory::detail::fail_allocation_at(3);   // the third allocation from here fails
void fail_allocation_at(int64_t n);
// Allocations made since the last fail_allocation_at(n) with n >= 1 (or since FRUGAL_FAIL_ALLOC_AT was read),
// the one that failed included; fail_allocation_at(0) stops counting and sets it back to 0.
int64_t allocations_counted();
// The n a value of FRUGAL_FAIL_ALLOC_AT asks for, 0 for unset or empty; throws Error naming the variable, the
// value and what is valid otherwise. Exposed for tests.
int64_t fail_alloc_at_from_env(const char* value);
// Called by each allocator before it allocates: throws the OutOfMemoryError of Note [failing an allocation]
// when this allocation is the one to fail.
void count_allocation(Device device, const char* allocator_kind, int64_t nbytes);
}  // namespace frugal::memory::detail

namespace frugal::detail {
// The allocator kind a value of FRUGAL_ALLOCATOR selects: "arena" (unset, empty or "arena") or "system";
// throws Error naming the valid values otherwise. Exposed for tests.
const char* allocator_kind_from_env(const char* value);
}  // namespace frugal::detail

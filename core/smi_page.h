// The page in which each frugal process publishes its allocators' figures (/dev/shm/frugal-<uid>-<pid>), the
// writer the allocators update it with, and the reader frugal-smi (tools/frugal_smi.cpp) lists the pages
// with. Private to the library and its tools. It uses nothing else of frugal, so frugal-smi compiles it
// without loading the library.
//
//   smi::SlotWriter w = smi::claim_slot("cpu", "arena");       // once per device allocator
//   w.write(figures, listed, tag_bytes);                       // after every change, under its lock
//   for (const smi::Process& p : smi::scan().processes) ...    // frugal-smi
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace frugal::smi {

// Note [frugal-smi page]
// What `watch -n 1 nvidia-smi` shows for a GPU, frugal-smi shows for every frugal process of the user, on any
// device. Each process publishes its figures in one page of shared memory, read by frugal-smi without any
// help from the process:
// - The page is /dev/shm/frugal-<uid>-<pid> (shm_open, O_EXCL, mode 0600: only the same user reads it). It
//   is made when the device registry makes its first allocator (core/memory_api.cpp), and removed by an
//   atexit handler at normal exit. It must never make a program fail: without /dev/shm (a chroot), with
//   /dev/shm full (its blocks are reserved with posix_fallocate, so that a full tmpfs is an error here and
//   not a SIGBUS at the first write), or on EACCES, the process publishes nothing, silently
//   (FRUGAL_SMI=debug says why on stderr). FRUGAL_SMI=0 (or off) turns publishing off.
// - Layout (PageWords, version kLayoutVersion): a header (magic, written last; the layout version and
//   size; pid; the process start time in clock ticks since boot from /proc/self/stat, so that a reused pid is
//   not taken for the old process; the pid namespace, whose pids those are; the program name from argv[0])
//   and kMaxSlots device slots, claimed in order, never released. A slot holds the device name, the
//   allocator kind, allocated (current, peak), reserved (current, peak), the limit (0: none) and the
//   kTopTags memory tags with the most live bytes (the tags of memory::Tag; a category of memory_history.h
//   exists only while a history records). Every field is a std::atomic<uint64_t>: lock-free 64-bit atomics
//   are address-free, so they work across processes, and a reader that races with a writer reads no torn
//   word.
// - Lock-free updates: a seqlock per slot. The one writer (the allocator, under its mutex) makes the
//   sequence odd, stores the fields (relaxed), makes it even again (release); a reader retries while the
//   sequence is odd or changed across its reads, so it never sees half an update. On the allocator's hot
//   path (a block's allocate or free: write_allocated, which leaves reserved and the limit to their own
//   changes) that is about 28 instructions, inlined, 4 of them stores (the sequence twice, the allocated
//   bytes, the tag's bytes; the peak only when it moved; the sequence is read back from the page, and the
//   changes since the tags' ranking are its difference): callgrind counts 249 instructions per 4 KiB
//   allocate/free pair of memory::allocator(kCPU) without the page and 304 with it (324 while the peak, a
//   copy of the sequence and a count of changes were stored at every change, 336 while every change wrote
//   all five figures; a loop of 10^5 pairs, a build for x86-64-v3, which valgrind 3.19 runs).
//   bench/bench_alloc.cpp BM_DeviceArenaPair/4096 times it: 17.4 ns, the plain arena 14.0 (best of 45
//   alternated runs on a Zen 4; 20.4 and 15.7 before those stores went). A call to a writer that searched
//   the list for the tag and computed the least bytes listed at every change added 142.
// - Top tags: ranking the tags walks every tag, so it runs only now and then: when a tag not listed has
//   outgrown the least one listed (or a slot of the list is empty), but at most every kTopTagsSoonest-th
//   change (except for the first tag listed); at least every kTopTagsEvery-th change; and when the limit or
//   the peaks are set. In between, the bytes of the tags listed are kept exact at each change; a tag that has
//   grown past them shows at the next ranking. Each tag knows its place in the list (the allocator's
//   TagStat::listed), so a change finds it without a search, and the writer keeps a bar for the others
//   (SlotWriter::least_listed_) instead of computing the least bytes listed.
// - fork(): the child of a fork without exec must not write into its parent's page, and nothing in it can
//   tell its allocators their slot is gone. So a pthread_atfork child handler maps private anonymous memory
//   over the page: the child's writes then go nowhere, and the child publishes nothing (after an exec it is
//   a new process and publishes its own page). Its exit does not remove the parent's page.
// - Stale pages: a process killed, or crashed, leaves its page behind. frugal-smi (scan) removes a page of
//   the same user whose pid is dead (or a zombie), whose pid now belongs to a process started at another
//   time, or whose process no longer maps it (it has exec'd another program), and does not list it. A page
//   with a wrong magic, version or size is skipped with a note (and removed only if its pid is dead); one
//   whose magic is still 0 is being made and is skipped silently; one from another pid namespace (a container
//   sharing /dev/shm) is skipped with a note, since its pids cannot be checked from here.

inline constexpr uint64_t kMagic = 0x31494d5347555246;  // "FRUGSMI1", little-endian
inline constexpr uint32_t kLayoutVersion = 1;
inline constexpr int kMaxSlots = 8;
inline constexpr int kTopTags = 4;
inline constexpr int kTagNameWords = 6;          // a tag name of up to 47 bytes (a longer one keeps its tail)
inline constexpr int kDeviceNameWords = 2;       // "cpu", "cuda:1023"
inline constexpr int kKindWords = 1;             // "arena", "system"
inline constexpr int kProgramWords = 8;          // 63 bytes of argv[0]'s last component
inline constexpr uint32_t kTopTagsEvery = 256;   // changes between two rankings of the tags, at most...
inline constexpr uint32_t kTopTagsSoonest = 32;  // ...and at least, when an unlisted tag outgrew a listed one

using Word = std::atomic<uint64_t>;
static_assert(Word::is_always_lock_free, "the page needs lock-free 64-bit atomics");

struct TopTagWords {
  Word name[kTagNameWords];  // NUL-padded
  Word bytes;
};

struct SlotWords {
  Word seq;  // odd while being written
  Word device[kDeviceNameWords];
  Word kind[kKindWords];
  Word allocated, peak, reserved, reserved_peak, limit;
  Word num_tags;  // entries of tags in use
  TopTagWords tags[kTopTags];
};

struct PageWords {
  Word magic;    // kMagic, stored last (release) once the rest is written
  Word version;  // kLayoutVersion | sizeof(PageWords) << 32
  Word pid;
  Word start_ticks;    // field 22 of /proc/<pid>/stat
  Word pid_namespace;  // the inode of /proc/self/ns/pid
  Word program[kProgramWords];
  Word num_slots;        // claimed, in order; stored (release) once the slot's names are written
  Word dropped_devices;  // allocators that found no free slot
  SlotWords slots[kMaxSlots];
};

// The figures of one allocator, as memory::Stats has them.
struct Figures {
  int64_t allocated = 0, peak = 0, reserved = 0, reserved_peak = 0, limit = 0;
};

struct TagBytes {
  std::string tag;
  int64_t bytes = 0;
};

// What an allocator publishes through; off (on() false) when the process has no page or no slot was left.
// One writer per slot: calls come under the allocator's mutex.
class SlotWriter {
 public:
  SlotWriter() = default;
  explicit SlotWriter(SlotWords* slot) : slot_(slot) {}
  bool on() const { return slot_ != nullptr; }

  // The figures after a change, and the live bytes of the tag that changed, in one update. `listed` is that
  // tag's place in the top tags (its index in the last write_top_tags; kNotListed when it is not there, or
  // when no tag changed). Returns true when the tags are due to be ranked again (write_top_tags). Inlined
  // into the allocators' allocate and free: Note [frugal-smi page] counts its instructions.
  [[gnu::always_inline]] bool write(const Figures& f, int listed, int64_t tag_bytes) {
    return update(f.allocated, f.peak, &f, listed, tag_bytes);
  }
  // write's, after a block's allocate or free, where only the allocated bytes, their peak and one tag's bytes
  // move: reserved, its peak and the limit were written at their own changes (a segment's, set_limit's,
  // reset_peaks'), so their three loads and stores are left out.
  [[gnu::always_inline]] bool write_allocated(int64_t allocated, int64_t peak, int listed,
                                              int64_t tag_bytes) {
    return update(allocated, peak, nullptr, listed, tag_bytes);
  }
  // The tags with the most live bytes (at most kTopTags, most first). Their places in `top` are the
  // `listed` of write.
  void write_top_tags(const std::vector<TagBytes>& top);

  static constexpr int kNotListed = -1;

 private:
  static void store(Word& w, int64_t v) { w.store(uint64_t(v), std::memory_order_relaxed); }

  // One update under the seqlock: the allocated bytes and their peak; reserved, its peak and the limit when
  // `rest` is given; the tag's bytes when it is listed.
  [[gnu::always_inline]] bool update(int64_t allocated, int64_t peak, const Figures* rest, int listed,
                                     int64_t tag_bytes) {
    SlotWords& s = *slot_;  // held in a register: an atomic store could otherwise change slot_, for all the
                            // compiler knows, and it would load it again after each
    const uint64_t seq = s.seq.load(std::memory_order_relaxed);  // this is its only writer
    s.seq.store(seq + 1, std::memory_order_relaxed);             // odd
    std::atomic_thread_fence(std::memory_order_release);         // before any field
    store(s.allocated, allocated);
    // A peak moves at few changes: a load here is cheaper than a store at every one.
    if (s.peak.load(std::memory_order_relaxed) != uint64_t(peak)) store(s.peak, peak);
    if (rest) {
      store(s.reserved, rest->reserved);
      store(s.reserved_peak, rest->reserved_peak);
      store(s.limit, rest->limit);
    }
    if (listed >= 0) {
      store(s.tags[listed].bytes, tag_bytes);
      if (tag_bytes < least_listed_) least_listed_ = tag_bytes;
    }
    s.seq.store(seq + 2, std::memory_order_release);  // even
    // Wraps to a large count in a forked child, whose page starts again from 0: one ranking sets it right.
    const uint64_t changes = (seq + 2 - ranked_seq_) / 2;
    if (changes >= kTopTagsEvery) [[unlikely]]
      return true;
    return listed < 0 && tag_bytes > least_listed_ && changes >= soonest_;
  }

  SlotWords* slot_ = nullptr;
  // A tag not listed that holds more than this is ranked (once soonest_ changes have passed): 0 while the
  // list has room, else at most the least bytes listed. It follows a listed tag's bytes down, not up, so
  // it may call for a ranking that changes nothing, but never misses one.
  int64_t least_listed_ = 0;
  uint32_t soonest_ = 0;     // kTopTagsSoonest, or 0 while the list is empty
  uint64_t ranked_seq_ = 0;  // the slot's sequence (2 a change) after the last ranking
};

// A slot of this process's page for an allocator of `device` ("cpu", "cuda:0") of kind "arena" or "system",
// making the page on first use; off when publishing is off or failed, or no slot is left.
SlotWriter claim_slot(const std::string& device, const std::string& kind);

// ---- the reader ----

struct DeviceFigures {
  std::string device, allocator;
  Figures figures;
  std::vector<TagBytes> top_tags;  // most first
};

struct Process {
  int64_t pid = 0;
  std::string program;
  double uptime_s = 0;
  std::vector<DeviceFigures> devices;
  int64_t dropped_devices = 0;  // allocators that had no slot
};

struct Scan {
  std::vector<Process> processes;  // by pid
  std::vector<std::string> notes;  // pages skipped, and why
  int removed = 0;                 // stale pages removed
};

// Reads every page of this user in dir (/dev/shm), removing the stale ones (Note [frugal-smi page]).
Scan scan(const std::string& dir = "/dev/shm");

// One consistent read of a slot (the seqlock's reader); false when a writer kept it busy for `tries`
// attempts (a process that died in the middle of an update).
bool read_slot(const SlotWords& slot, DeviceFigures& out, int tries = 100000);

// The name of this process's page under /dev/shm ("frugal-1000-4242").
std::string page_name(int64_t pid);

}  // namespace frugal::smi

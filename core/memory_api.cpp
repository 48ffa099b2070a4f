// The free functions of core/memory.h: the per-device allocator registry, memory tags, the readable summary.
// The allocators themselves are in core/arena.cpp and core/system_allocator.cpp (core/allocator_base.h: what
// they share).
#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "core/allocator_base.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/smi_page.h"

namespace frugal {

const char* detail::allocator_kind_from_env(const char* value) {
  if (value == nullptr || *value == '\0' || std::strcmp(value, "arena") == 0) return "arena";
  if (std::strcmp(value, "system") == 0) return "system";
  throw Error(str_cat("FRUGAL_ALLOCATOR='", value,
                      "' is not an allocator; valid values are 'arena' (the default, the caching arena) and "
                      "'system' (one system allocation per tensor)"));
}

namespace memory {

// Note [thread-locals on the allocation path] (core/history_log.h).
constinit FRUGAL_STATIC_TLS thread_local uint32_t detail::t_current_tag = 0;

std::atomic<bool> detail::g_counting_allocations{false};

namespace {
std::atomic<int64_t> g_fail_at{0};      // the allocation to fail (1-based), 0 for none
std::atomic<int64_t> g_allocations{0};  // counted since the last fail_allocation_at
}  // namespace

void detail::fail_allocation_at(int64_t n) {
  FRUGAL_CHECK(n >= 0, "memory::detail::fail_allocation_at: expected n >= 0 (0 disarms), got ", n);
  g_allocations.store(0);
  g_fail_at.store(n);
  g_counting_allocations.store(n > 0);
}

int64_t detail::allocations_counted() { return g_allocations.load(); }

int64_t detail::fail_alloc_at_from_env(const char* value) {
  if (value == nullptr || *value == '\0') return 0;
  int64_t n = 0;
  const char* end = value + std::strlen(value);
  const auto [ptr, ec] = std::from_chars(value, end, n);
  FRUGAL_CHECK(ec == std::errc() && ptr == end && n >= 0, "FRUGAL_FAIL_ALLOC_AT='", value,
               "' is not an allocation number; expected an integer n >= 1 (the n-th allocation fails), 0 or "
               "unset for none");
  return n;
}

void detail::count_allocation(Device device, const char* allocator_kind, int64_t nbytes) {
  const int64_t n = g_allocations.fetch_add(1, std::memory_order_relaxed) + 1;
  int64_t armed = n;
  if (g_fail_at.load(std::memory_order_relaxed) != n ||
      !g_fail_at.compare_exchange_strong(armed, 0, std::memory_order_relaxed)) [[likely]]
    return;
  throw OutOfMemoryError(frugal::detail::str_cat(
      "out of memory on ", device, " (", allocator_kind, " allocator): tried to allocate ", nbytes,
      " bytes (", format_bytes(nbytes), "); allocation ", n,
      " was made to fail, as if the memory limit were reached (FRUGAL_FAIL_ALLOC_AT or "
      "memory::detail::fail_allocation_at; Note [failing an allocation] in core/memory.h)"));
}

namespace {

constexpr int kMaxDeviceIndex = 1024;  // Device::parse accepts cuda:0 .. cuda:1023

using BackingFactory = std::unique_ptr<Backing> (*)(int index);

const char* type_name(DeviceType type) {
  return type == DeviceType::CPU ? "cpu" : type == DeviceType::CUDA ? "cuda" : "meta";
}

struct Registry {
  std::mutex mu;
  std::array<BackingFactory, kNumDeviceTypes> factories{};
  std::array<bool, kNumDeviceTypes> in_use{};
  // Every Storage asks for its allocator, so the lookup reads these without the lock; each is written once,
  // under it.
  std::array<std::array<std::atomic<Allocator*>, kMaxDeviceIndex>, kNumDeviceTypes> allocators{};
};

Registry& registry() {
  // Never destroyed, nor are the allocators in it: a tensor held by a static object may be freed after static
  // destructors have run, and must still find its allocator then. Leaked on purpose.
  static Registry* r = new Registry;
  return *r;
}

// Read once: switching allocators halfway would hand blocks of one to the other.
const char* allocator_kind() {
  static const char* kind = frugal::detail::allocator_kind_from_env(std::getenv("FRUGAL_ALLOCATOR"));
  return kind;
}

// Read once, when the first allocator is made: Note [failing an allocation].
void apply_fail_alloc_env() {
  static const bool applied = [] {
    if (const int64_t n = detail::fail_alloc_at_from_env(std::getenv("FRUGAL_FAIL_ALLOC_AT")); n > 0)
      detail::fail_allocation_at(n);
    return true;
  }();
  (void)applied;
}

struct TagTable {
  std::mutex mu;
  std::vector<std::string> names{""};
  std::unordered_map<std::string, uint32_t> ids{{"", 0}};
  uint32_t overflow = 0;                       // kOverflowTag's id once the table is full, 0 before
  std::unordered_set<uint64_t> folded_hashes;  // of the names folded into it, up to kMaxFoldedCount

  // The id of a full name, interning it while there is room (the last slot is kept for kOverflowTag).
  uint32_t intern_locked(std::string&& name) {
    if (auto it = ids.find(name); it != ids.end()) return it->second;
    if (names.size() + 1 < kMaxTagNames) {
      const auto id = uint32_t(names.size());
      names.push_back(name);
      ids.emplace(std::move(name), id);
      return id;
    }
    if (overflow == 0) {  // kOverflowTag itself may have been asked for before (then it holds an id already)
      auto [it, inserted] = ids.try_emplace(kOverflowTag, uint32_t(names.size()));
      if (inserted) names.emplace_back(kOverflowTag);
      overflow = it->second;
    }
    if (name != kOverflowTag && int64_t(folded_hashes.size()) < kMaxFoldedCount)
      folded_hashes.insert(std::hash<std::string>()(name));
    return overflow;
  }
};

TagTable& tag_table() {
  static TagTable* t =
      new TagTable;  // leaked on purpose, like the registry: tags may outlive static destructors
  return *t;
}

// printf into a std::string; the summary is a fixed-width table and printf widths say that most plainly.
__attribute__((format(printf, 2, 3))) void appendf(std::string& out, const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  out += buf;
}

}  // namespace

Allocator& allocator(Device device) {
  FRUGAL_CHECK_T(DeviceError, device.index >= 0 && device.index < kMaxDeviceIndex,
                 "memory::allocator: device index ", device.index, " of ", device, " is out of range [0, ",
                 kMaxDeviceIndex, ")");
  Registry& r = registry();
  const auto type = static_cast<size_t>(device.type);
  std::atomic<Allocator*>& slot = r.allocators[type][size_t(device.index)];
  if (Allocator* a = slot.load(std::memory_order_acquire)) return *a;

  // The CUDA backend registers its backing while it loads, from its static initialisers, which take r.mu:
  // load it before taking the lock, unless a backing is there already (a test's stand-in GPU).
  FRUGAL_CHECK_T(DeviceError, !device.is_meta() || device.index == 0,
                 "memory::allocator: there is one meta "
                 "device, 'meta' (index 0), not index ",
                 device.index);
  if (device.is_cuda()) {
    bool registered = false;
    {
      std::lock_guard lock(r.mu);
      registered = r.factories[type] != nullptr;
    }
    if (!registered) load_backend(device.type);
  }
  std::lock_guard lock(r.mu);
  if (Allocator* a = slot.load(std::memory_order_relaxed)) return *a;
  if (device.is_meta()) {  // Note [a simulated arena]; not published in frugal-smi: it holds no real bytes
    Allocator* a =
        detail::make_simulated_arena(device, detail::make_meta_backing(), nullptr, nullptr).release();
    r.in_use[type] = true;
    slot.store(a, std::memory_order_release);
    return *a;
  }
  std::unique_ptr<Backing> backing;
  if (r.factories[type]) {
    backing = r.factories[type](device.index);
  } else if (device.is_cpu()) {
    backing = make_host_backing();
  } else {
    const std::string why = backend_error(device.type);
    throw DeviceError(frugal::detail::str_cat(
        "no allocator for ", device, ": ",
        why.empty() ? "the CUDA backend is loaded but no GPU answers (no driver, or no device)" : why));
  }
  const bool system = std::strcmp(allocator_kind(), "system") == 0;
  apply_fail_alloc_env();
  // Leaked on purpose: see registry().
  Allocator* a =
      (system ? make_system_allocator(device, std::move(backing)) : make_arena(device, std::move(backing)))
          .release();
  // Note [frugal-smi page]: the device's allocator shows in frugal-smi (the first one makes the page).
  if (auto* base = dynamic_cast<detail::AllocatorBase*>(a))
    base->publish_to(smi::claim_slot(device.str(), a->kind()));
  r.in_use[type] = true;
  slot.store(a, std::memory_order_release);
  return *a;
}

std::unique_ptr<Allocator> detail::swap_meta_allocator(std::unique_ptr<Allocator> next) {
  Registry& r = registry();
  allocator(kMeta);  // the slot holds one from now on
  std::lock_guard lock(r.mu);
  std::atomic<Allocator*>& slot = r.allocators[size_t(DeviceType::Meta)][0];
  return std::unique_ptr<Allocator>(slot.exchange(next.release(), std::memory_order_acq_rel));
}

void register_backing(DeviceType type, std::unique_ptr<Backing> (*make)(int index)) {
  FRUGAL_CHECK(make != nullptr, "memory::register_backing: the backing factory for ", type_name(type),
               " is null");
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  const auto t = static_cast<size_t>(type);
  FRUGAL_CHECK(!r.in_use[t], "memory::register_backing: an allocator for ", type_name(type),
               " is already in use; register the backing before the first allocation on that device type");
  r.factories[t] = make;
}

Stats stats(Device device) { return allocator(device).stats(); }
// The per-tag peaks too: after reset_peak() every peak in memory_summary() is the peak since then.
void reset_peak(Device device) {
  Allocator& a = allocator(device);
  a.reset_peak();
  a.reset_tag_peaks();
}
void empty_cache(Device device) { allocator(device).empty_cache(); }
void set_memory_limit(Device device, int64_t bytes) { allocator(device).set_limit(bytes); }
int64_t memory_limit(Device device) { return allocator(device).limit(); }
std::vector<BlockInfo> snapshot(Device device) { return allocator(device).snapshot(); }
std::vector<TagStats> tag_stats(Device device) { return allocator(device).tag_stats(); }

std::string format_bytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes > -1024 && bytes < 1024) return std::to_string(bytes) + " B";
  double value = double(bytes);
  int unit = -1;
  while ((value >= 1024 || value <= -1024) && unit < 3) {
    value /= 1024;
    ++unit;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f %s", value, kUnits[unit]);
  return buf;
}

std::string memory_summary(Device device) {
  Allocator& a = allocator(device);
  const Stats s = a.stats();
  std::vector<TagStats> tags = a.tag_stats();
  std::stable_sort(tags.begin(), tags.end(), [](const TagStats& x, const TagStats& y) {
    return x.allocated.peak + x.mapped.peak > y.allocated.peak + y.mapped.peak;
  });
  const int64_t limit = a.limit();
  const std::string rule(78, '=');
  const std::string thin(78, '-');
  auto bytes_row = [](std::string& out, const char* name, const Stat& st) {
    appendf(out, " %-30s %22s %22s\n", name, format_bytes(st.current).c_str(), format_bytes(st.peak).c_str());
  };
  auto count_row = [](std::string& out, const char* name, const Stat& st) {
    appendf(out, " %-30s %22lld %22lld\n", name, static_cast<long long>(st.current),
            static_cast<long long>(st.peak));
  };
  auto pair_row = [](std::string& out, const char* a_name, int64_t a, const char* b_name, int64_t b) {
    appendf(out, " %-22s %15lld   %-22s %14lld\n", a_name, static_cast<long long>(a), b_name,
            static_cast<long long>(b));
  };

  std::string out = rule + "\n";
  appendf(out, " frugal memory summary: %s, %s allocator, limit %s\n", device.str().c_str(), a.kind(),
          limit > 0 ? format_bytes(limit).c_str() : "none");
  out += thin + "\n";
  appendf(out, " %-30s %22s %22s\n", "", "current", "peak");
  bytes_row(out, "requested", s.requested);
  bytes_row(out, "allocated", s.allocated);
  bytes_row(out, "reserved", s.reserved);
  if (s.mapped.peak > 0) {  // Note [mapped bytes]: files that tensors view, beside the blocks
    bytes_row(out, "mapped (files)", s.mapped);
    bytes_row(out, "allocated + mapped", s.footprint);
  }
  count_row(out, "active blocks", s.active_blocks);
  count_row(out, "segments", s.segments);
  out += thin + "\n";
  pair_row(out, "allocs", s.num_allocs, "frees", s.num_frees);
  pair_row(out, "segment allocs", s.num_segment_allocs, "segment frees", s.num_segment_frees);
  pair_row(out, "cache flushes", s.num_cache_flushes, "OOMs", s.num_ooms);
  appendf(out, " %-22s %15s   %-22s %14s\n", "free (cached)", format_bytes(s.free_bytes).c_str(),
          "largest free block", format_bytes(s.largest_free_block).c_str());
  appendf(out, " %-22s %15.3f\n", "fragmentation", s.fragmentation);
  out += thin + "\n";
  appendf(out, " %-30s %22s %22s\n", "live bytes by tag", "current", "peak");
  if (tags.empty()) out += " (no allocations)\n";
  for (size_t i = 0; i < tags.size() && i < size_t(kSummaryTags); ++i) {
    const TagStats& t = tags[i];
    // Long tag paths widen their row rather than being cut: the name is what the reader is looking for.
    appendf(out, " %-30s %22s %22s%s\n", t.tag.empty() ? "(untagged)" : t.tag.c_str(),
            format_bytes(t.allocated.current).c_str(), format_bytes(t.allocated.peak).c_str(),
            t.mapped.peak > 0 ? (" (mapped " + format_bytes(t.mapped.current) + ")").c_str() : "");
  }
  if (tags.size() > size_t(kSummaryTags)) {  // the rest in one line: their live bytes, the largest peak
    int64_t current = 0, peak = 0;
    for (size_t i = size_t(kSummaryTags); i < tags.size(); ++i) {
      current += tags[i].allocated.current;
      peak = std::max(peak, tags[i].allocated.peak);
    }
    const std::string rest = frugal::detail::str_cat("(", tags.size() - size_t(kSummaryTags), " more tags)");
    appendf(out, " %-30s %22s %22s\n", rest.c_str(), format_bytes(current).c_str(),
            ("each <= " + format_bytes(peak)).c_str());
  }
  if (const int64_t folded = folded_tag_names(); folded > 0)
    appendf(out, " %s%lld names folded into '%s' (the table holds %zu names)\n",
            folded >= kMaxFoldedCount ? "at least " : "", static_cast<long long>(folded), kOverflowTag,
            kMaxTagNames);
  out += rule + "\n";
  return out;
}

uint32_t intern_tag(std::string_view name) {
  TagTable& table = tag_table();
  std::lock_guard lock(table.mu);
  return table.intern_locked(std::string(name));
}

int64_t folded_tag_names() {
  TagTable& table = tag_table();
  std::lock_guard lock(table.mu);
  return int64_t(table.folded_hashes.size());
}

Tag::Tag(std::string_view name) : previous_(detail::t_current_tag) {
  TagTable& table = tag_table();
  std::lock_guard lock(table.mu);
  std::string joined = previous_ == 0 ? std::string(name)
                       : name.empty() ? table.names[previous_]
                                      : table.names[previous_] + "/" + std::string(name);
  detail::t_current_tag = table.intern_locked(std::move(joined));
}

Tag::Tag(uint32_t id) : previous_(detail::t_current_tag) {
  TagTable& table = tag_table();
  std::lock_guard lock(table.mu);
  FRUGAL_CHECK_INDEX(id < table.names.size(), "memory::Tag: no tag has id ", id, " (", table.names.size(),
                     " tags interned; memory::intern_tag makes one)");
  detail::t_current_tag = id;
}

Tag::~Tag() { detail::t_current_tag = previous_; }

uint32_t current_tag() { return detail::t_current_tag; }

std::string tag_name(uint32_t id) {
  TagTable& table = tag_table();
  std::lock_guard lock(table.mu);
  FRUGAL_CHECK_INDEX(id < table.names.size(), "memory::tag_name: no tag has id ", id, " (",
                     table.names.size(), " tags interned)");
  return table.names[id];
}

}  // namespace memory
}  // namespace frugal

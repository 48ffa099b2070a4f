// The frugal-smi page: made, filled and removed by a frugal process, read (and cleaned) by frugal-smi. Note
// [frugal-smi page] in core/smi_page.h. Uses only the C++ and POSIX libraries, so that tools/frugal_smi.cpp
// compiles it on its own.
#include "core/smi_page.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <new>
#include <sstream>

namespace frugal::smi {
namespace {

// Text in NUL-padded words: what fits of `text`, keeping its tail when it is longer (a tag's last part says
// the most).
template <int N>
void store_text(Word (&words)[N], const std::string& text) {
  char buf[N * 8] = {};
  const size_t room = sizeof buf - 1;
  const size_t from = text.size() > room ? text.size() - room : 0;
  std::memcpy(buf, text.data() + from, text.size() - from);
  for (int i = 0; i < N; ++i) {
    uint64_t w;
    std::memcpy(&w, buf + 8 * i, 8);
    words[i].store(w, std::memory_order_relaxed);
  }
}

template <int N>
std::string load_text(const Word (&words)[N]) {
  char buf[N * 8 + 1] = {};
  for (int i = 0; i < N; ++i) {
    const uint64_t w = words[i].load(std::memory_order_relaxed);
    std::memcpy(buf + 8 * i, &w, 8);
  }
  return std::string(buf);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The state letter and the start time (field 22, clock ticks since boot) of /proc/<pid>/stat; false when
// there is no such process. The fields are counted after the last ')', since the name may hold spaces.
bool read_proc_stat(const std::string& pid, char& state, uint64_t& start_ticks) {
  const std::string stat = read_file("/proc/" + pid + "/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return false;
  std::istringstream fields(stat.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 3) state = field.empty() ? '?' : field[0];
    if (i == 22) {
      start_ticks = std::strtoull(field.c_str(), nullptr, 10);
      return true;
    }
  }
  return false;
}

uint64_t pid_namespace(const std::string& pid) {
  struct stat st;
  return ::stat(("/proc/" + pid + "/ns/pid").c_str(), &st) == 0 ? uint64_t(st.st_ino) : 0;
}

// Whether process `pid` still maps its page `name`: one that has exec'd another program (the same pid, the
// same start time) does not. True when its maps cannot be read (another user's, or a hardened /proc).
bool still_maps(const std::string& pid, const std::string& name) {
  std::ifstream maps("/proc/" + pid + "/maps");
  if (!maps) return true;
  const std::string tail = "/" + name;
  for (std::string line; std::getline(maps, line);)
    if (line.size() >= tail.size() && line.compare(line.size() - tail.size(), tail.size(), tail) == 0)
      return true;
  return false;
}

// argv[0]'s last component (from /proc/self/cmdline), else /proc/self/comm.
std::string program_name() {
  std::string name = read_file("/proc/self/cmdline");
  name = name.substr(0, name.find('\0'));
  if (const size_t slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
  if (name.empty()) {
    name = read_file("/proc/self/comm");
    if (!name.empty() && name.back() == '\n') name.pop_back();
  }
  return name;
}

constexpr uint64_t kVersionWord = kLayoutVersion | uint64_t(sizeof(PageWords)) << 32;

// The process's page, made once. Leaked on purpose, like the device registry: allocators may write into it
// while static destructors run, after the atexit handler has removed its name.
struct Publisher {
  std::mutex mu;
  bool tried = false;
  PageWords* page = nullptr;
  pid_t owner = 0;  // the pid that made the page: only it removes the name
  std::string name;
};
Publisher& publisher() {
  static Publisher* p = new Publisher;
  return *p;
}

void remove_page_at_exit() {
  Publisher& p = publisher();
  if (p.page && p.owner == getpid()) shm_unlink(p.name.c_str());
}

// Note [frugal-smi page]: a forked child keeps the mapping, but writes into private memory from now on.
void forget_page_in_child() {
  Publisher& p = publisher();
  if (!p.page) return;
  p.owner = 0;
  mmap(p.page, sizeof(PageWords), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
}

// Never throws and never fails the program: nullptr with the reason in `why` ("" when publishing is off).
PageWords* make_page(Publisher& p, std::string& why) {
  const char* env = std::getenv("FRUGAL_SMI");
  if (env && (std::strcmp(env, "0") == 0 || std::strcmp(env, "off") == 0)) return nullptr;
  const pid_t pid = getpid();
  p.name = page_name(pid);
  p.name.insert(p.name.begin(), '/');  // not "/" + page_name(pid): GCC 12's false -Wrestrict (its bug 105329)
  int fd = shm_open(p.name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {
    // Left by an earlier process with this pid, long dead since we have it now.
    shm_unlink(p.name.c_str());
    fd = shm_open(p.name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  }
  if (fd < 0) {
    why = std::string("shm_open: ") + std::strerror(errno);
    return nullptr;
  }
  void* mem = MAP_FAILED;
  if (const int err = posix_fallocate(fd, 0, sizeof(PageWords)); err != 0) {
    why = std::string("posix_fallocate: ") + std::strerror(err);
  } else {
    mem = mmap(nullptr, sizeof(PageWords), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) why = std::string("mmap: ") + std::strerror(errno);
  }
  close(fd);
  if (mem == MAP_FAILED) {
    shm_unlink(p.name.c_str());
    return nullptr;
  }
  auto* page = new (mem) PageWords;  // the atomics, value-initialised: zero, as the file was
  const std::string self = std::to_string(pid);
  char state = '?';
  uint64_t start_ticks = 0;
  read_proc_stat(self, state, start_ticks);
  page->version.store(kVersionWord, std::memory_order_relaxed);
  page->pid.store(uint64_t(pid), std::memory_order_relaxed);
  page->start_ticks.store(start_ticks, std::memory_order_relaxed);
  page->pid_namespace.store(pid_namespace(self), std::memory_order_relaxed);
  store_text(page->program, program_name());
  page->magic.store(kMagic, std::memory_order_release);
  p.owner = pid;
  std::atexit(remove_page_at_exit);
  pthread_atfork(nullptr, nullptr, forget_page_in_child);
  return page;
}

}  // namespace

std::string page_name(int64_t pid) {
  return "frugal-" + std::to_string(getuid()) + "-" + std::to_string(pid);
}

void SlotWriter::write_top_tags(const std::vector<TagBytes>& top) {
  const uint64_t seq = slot_->seq.load(std::memory_order_relaxed);  // this is its only writer
  slot_->seq.store(seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  const int n = int(std::min<size_t>(top.size(), kTopTags));
  least_listed_ = n < kTopTags ? 0 : INT64_MAX;
  soonest_ = n == 0 ? 0 : kTopTagsSoonest;
  for (int i = 0; i < n; ++i) {
    const TagBytes& t = top[size_t(i)];
    if (n == kTopTags) least_listed_ = std::min(least_listed_, t.bytes);
    store_text(slot_->tags[i].name, t.tag);
    store(slot_->tags[i].bytes, t.bytes);
  }
  store(slot_->num_tags, n);
  slot_->seq.store(seq + 2, std::memory_order_release);
  ranked_seq_ = seq + 2;
}

SlotWriter claim_slot(const std::string& device, const std::string& kind) {
  Publisher& p = publisher();
  std::lock_guard lock(p.mu);
  if (!p.tried) {
    p.tried = true;
    std::string why;
    p.page = make_page(p, why);
    const char* env = std::getenv("FRUGAL_SMI");
    if (!p.page && !why.empty() && env && std::strcmp(env, "debug") == 0)
      std::fprintf(stderr, "frugal: no frugal-smi page (/dev/shm%s): %s\n", p.name.c_str(), why.c_str());
  }
  if (!p.page) return {};
  const uint64_t n = p.page->num_slots.load(std::memory_order_relaxed);
  if (n >= uint64_t(kMaxSlots)) {
    p.page->dropped_devices.fetch_add(1, std::memory_order_relaxed);
    return {};
  }
  SlotWords& slot = p.page->slots[n];
  store_text(slot.device, device);
  store_text(slot.kind, kind);
  p.page->num_slots.store(n + 1, std::memory_order_release);
  return SlotWriter(&slot);
}

// ---- the reader ----

bool read_slot(const SlotWords& slot, DeviceFigures& out, int tries) {
  auto load = [](const Word& w) { return int64_t(w.load(std::memory_order_relaxed)); };
  for (int attempt = 0; attempt < tries; ++attempt) {
    const uint64_t before = slot.seq.load(std::memory_order_acquire);
    if (before & 1) {
      if (attempt % 64 == 63) sched_yield();
      continue;
    }
    DeviceFigures f;
    f.figures = {load(slot.allocated), load(slot.peak), load(slot.reserved), load(slot.reserved_peak),
                 load(slot.limit)};
    const int64_t n = std::clamp<int64_t>(load(slot.num_tags), 0, kTopTags);
    for (int64_t i = 0; i < n; ++i)
      f.top_tags.push_back({load_text(slot.tags[i].name), load(slot.tags[i].bytes)});
    std::atomic_thread_fence(std::memory_order_acquire);  // every field read before the sequence again
    if (slot.seq.load(std::memory_order_relaxed) != before) continue;
    f.device = load_text(slot.device);
    f.allocator = load_text(slot.kind);
    std::stable_sort(f.top_tags.begin(), f.top_tags.end(),
                     [](const TagBytes& a, const TagBytes& b) { return a.bytes > b.bytes; });
    out = std::move(f);
    return true;
  }
  return false;
}

namespace {

double seconds_since_boot() { return std::strtod(read_file("/proc/uptime").c_str(), nullptr); }

// A mapped page, unmapped at the end of the scope.
struct Mapping {
  void* mem = MAP_FAILED;
  ~Mapping() {
    if (mem != MAP_FAILED) munmap(mem, sizeof(PageWords));
  }
};

}  // namespace

Scan scan(const std::string& dir) {
  Scan result;
  DIR* d = opendir(dir.c_str());
  if (!d) return result;
  const std::string prefix = "frugal-" + std::to_string(getuid()) + "-";
  const uint64_t my_namespace = pid_namespace("self");
  const double now = seconds_since_boot();
  // Without /proc (a chroot) no pid can be checked: then nothing is removed, and what is read is listed.
  char my_state = '?';
  uint64_t my_start = 0;
  const bool can_check = read_proc_stat("self", my_state, my_start);
  if (!can_check)
    result.notes.push_back("no /proc here: stale pages cannot be told from live ones, none removed");
  const long ticks_per_s = sysconf(_SC_CLK_TCK);
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
        name.find_first_not_of("0123456789", prefix.size()) == std::string::npos)
      names.push_back(name);
  }
  closedir(d);

  for (const std::string& name : names) {
    const std::string pid = name.substr(prefix.size());
    const std::string path = dir + "/" + name;
    char state = '?';
    uint64_t start_ticks = 0;
    const bool alive = read_proc_stat(pid, state, start_ticks) && state != 'Z' && state != 'X';
    auto remove_stale = [&] {
      if (can_check && unlink(path.c_str()) == 0) ++result.removed;
    };

    const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;  // removed meanwhile (its process exited), or not ours
    struct stat st;
    Mapping map;
    const bool ours = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == getuid();
    if (ours && st.st_size >= off_t(sizeof(PageWords)))
      map.mem = mmap(nullptr, sizeof(PageWords), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (!ours) continue;
    const auto* page = map.mem == MAP_FAILED ? nullptr : static_cast<const PageWords*>(map.mem);
    const uint64_t magic = page ? page->magic.load(std::memory_order_acquire) : 0;
    if (!page || magic != kMagic || page->version.load(std::memory_order_relaxed) != kVersionWord) {
      if (!alive) {
        remove_stale();
      } else if (page && magic == 0) {
        // Being made by its process: the next scan lists it.
      } else {
        result.notes.push_back(name + ": skipped, not a frugal-smi page of layout version " +
                               std::to_string(kLayoutVersion) +
                               (!page ? " (too short)" : " (wrong magic, version or size)"));
      }
      continue;
    }
    if (page->pid_namespace.load(std::memory_order_relaxed) != my_namespace) {
      result.notes.push_back(name + ": skipped, from another pid namespace (its pid cannot be checked here)");
      continue;
    }
    if (can_check &&
        (!alive || page->pid.load(std::memory_order_relaxed) != std::strtoull(pid.c_str(), nullptr, 10) ||
         page->start_ticks.load(std::memory_order_relaxed) != start_ticks || !still_maps(pid, name))) {
      remove_stale();
      continue;
    }
    Process p;
    p.pid = std::strtoll(pid.c_str(), nullptr, 10);
    p.program = load_text(page->program);
    p.uptime_s = std::max(0.0, now - double(start_ticks) / double(ticks_per_s));
    p.dropped_devices = int64_t(page->dropped_devices.load(std::memory_order_relaxed));
    const uint64_t slots = std::min<uint64_t>(page->num_slots.load(std::memory_order_acquire), kMaxSlots);
    for (uint64_t i = 0; i < slots; ++i) {
      DeviceFigures f;
      if (read_slot(page->slots[i], f))
        p.devices.push_back(std::move(f));
      else
        result.notes.push_back(name + ": slot " + std::to_string(i) +
                               " skipped, busy (a writer never finished)");
    }
    result.processes.push_back(std::move(p));
  }
  std::sort(result.processes.begin(), result.processes.end(),
            [](const Process& a, const Process& b) { return a.pid < b.pid; });
  return result;
}

}  // namespace frugal::smi

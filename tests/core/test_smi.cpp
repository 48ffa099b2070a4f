// frugal-smi and the page each process publishes (Note [frugal-smi page] in core/smi_page.h): the figures of
// a child process, read by the real frugal-smi, exactly; stale pages (a killed process, a reused pid, an
// exec) removed; bad pages skipped; FRUGAL_SMI=0; a forked child that leaves its parent's page alone; and the
// seqlock, which never hands out a torn slot.
//
// The processes measured are this test program run again (fork, then exec of /proc/self/exe with
// FRUGAL_SMI_TEST_CHILD set), so each is a fresh process whose first allocator makes its page.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/memory.h"
#include "core/smi_page.h"

#ifndef FRUGAL_SMI_PATH
#error "tests/CMakeLists.txt passes the path of frugal-smi as FRUGAL_SMI_PATH"
#endif

namespace frugal {
namespace {

using nlohmann::json;

std::string page_path(int64_t pid) { return "/dev/shm/" + smi::page_name(pid); }

struct SmiRun {
  int status = -1;
  std::vector<json> objects;  // stdout, one per line
  std::string err;
};

// Runs frugal-smi with args; its stdout parsed as JSON Lines when --json is among them.
SmiRun run_smi(const std::string& args) {
  const std::string err_path = ::testing::TempDir() + "frugal_smi_stderr.txt";
  const std::string cmd = std::string(FRUGAL_SMI_PATH) + " " + args + " 2>" + err_path;
  SmiRun run;
  FILE* out = popen(cmd.c_str(), "r");
  if (!out) return run;
  std::string text;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, out)) text.append(buf, n);
  run.status = pclose(out);
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (args.find("--json") != std::string::npos && !line.empty()) run.objects.push_back(json::parse(line));
  std::ifstream err(err_path);
  run.err.assign(std::istreambuf_iterator<char>(err), {});
  return run;
}

const json* find_pid(const SmiRun& run, int64_t pid) {
  for (const json& o : run.objects)
    if (o.at("pid") == pid) return &o;
  return nullptr;
}

// A child: this program again, in the mode SmiChild.Run plays. It writes one JSON line (its figures) to
// `from_child`, then waits until the parent closes `to_child`.
struct Child {
  pid_t pid = -1;
  int from_child = -1, to_child = -1;
  json said;

  Child(const std::string& mode, const char* frugal_smi_env = nullptr) {
    // Close-on-exec, so that no other process started meanwhile holds an end open: the child gets its
    // ends as fresh descriptors (dup).
    int up[2], down[2];
    if (pipe2(up, O_CLOEXEC) != 0 || pipe2(down, O_CLOEXEC) != 0) return;
    pid = fork();
    if (pid == 0) {
      const std::string arg = mode + "," + std::to_string(dup(up[1])) + "," + std::to_string(dup(down[0]));
      setenv("FRUGAL_SMI_TEST_CHILD", arg.c_str(), 1);
      if (frugal_smi_env)
        setenv("FRUGAL_SMI", frugal_smi_env, 1);
      else
        unsetenv("FRUGAL_SMI");
      if (int null = open("/dev/null", O_WRONLY); null >= 0) dup2(null, STDOUT_FILENO);
      execl("/proc/self/exe", "test_core_smi", "--gtest_filter=SmiChild.Run", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(up[1]);
    close(down[0]);
    from_child = up[0];
    to_child = down[1];
    std::string line;
    char c;
    while (read(from_child, &c, 1) == 1 && c != '\n') line += c;
    if (!line.empty()) said = json::parse(line);
  }
  // For the "exec" mode: returns once the child runs its new program (its end of the pipe closed then).
  void wait_for_exec() const {
    char c;
    while (read(from_child, &c, 1) > 0) {
    }
  }
  // Lets the child finish; its exit status (0: its own checks passed).
  int finish() {
    close(to_child);
    int status = -1;
    waitpid(pid, &status, 0);
    close(from_child);
    pid = -1;
    return status;
  }
  int kill_hard() {
    kill(pid, SIGKILL);
    return finish();
  }
  ~Child() {
    if (pid > 0) kill_hard();
  }
};

// A process that only sleeps: a live pid to name pages after. It execs, so it holds none of the pipes.
struct Sleeper {
  pid_t pid = fork();
  Sleeper() {
    if (pid == 0) {
      execl("/bin/sleep", "sleep", "600", static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~Sleeper() { stop(); }
  void stop() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

// ---- the child's side ----

// Allocates known amounts under a limit and tells its parent what memory::stats() says.
void child_allocate(int to_parent, int from_parent, const std::string& mode) {
  memory::set_memory_limit(kCPU, 256 << 20);
  memory::Allocator& a = memory::allocator(kCPU);
  std::vector<memory::Allocation> blocks;
  {
    memory::Tag t("smi/small");
    for (int i = 0; i < 40; ++i) blocks.push_back(a.allocate(3000));
  }
  {
    memory::Tag t("smi/large");
    blocks.push_back(a.allocate(12 << 20));
    blocks.push_back(a.allocate(3 << 20));
  }
  a.deallocate(blocks.back().block);  // the peak is above what stays allocated
  blocks.pop_back();

  if (mode == "fork") {
    // A forked child that allocates, and exits normally: neither may touch this process's page.
    const memory::Stats before = memory::stats();
    const pid_t grandchild = fork();
    if (grandchild == 0) {
      memory::allocator(kCPU).allocate(5 << 20);
      memory::set_memory_limit(kCPU, 1 << 30);
      std::exit(0);
    }
    int status = -1;
    waitpid(grandchild, &status, 0);
    EXPECT_EQ(status, 0);
    EXPECT_TRUE(std::filesystem::exists(page_path(getpid())));
    const smi::Scan scan = smi::scan();
    const smi::Process* me = nullptr;
    for (const smi::Process& p : scan.processes)
      if (p.pid == getpid()) me = &p;
    ASSERT_NE(me, nullptr);
    ASSERT_EQ(me->devices.size(), 1u);
    EXPECT_EQ(me->devices[0].figures.allocated, before.allocated.current);
    EXPECT_EQ(me->devices[0].figures.peak, before.allocated.peak);
    EXPECT_EQ(me->devices[0].figures.limit, 256 << 20);
  }

  const memory::Stats s = memory::stats();
  json tags = json::object();
  for (const memory::TagStats& t : memory::tag_stats())
    tags[t.tag.empty() ? "(untagged)" : t.tag] = t.allocated.current;
  const std::string line = json{{"pid", getpid()},
                                {"allocated", s.allocated.current},
                                {"peak", s.allocated.peak},
                                {"reserved", s.reserved.current},
                                {"reserved_peak", s.reserved.peak},
                                {"limit", memory::memory_limit()},
                                {"tags", tags}}
                               .dump() +
                           "\n";
  ASSERT_EQ(write(to_parent, line.data(), line.size()), ssize_t(line.size()));
  if (mode == "exec") {  // the same process, another program: its page is left behind
    // The exec closes the pipe to the parent, which waits for that end-of-file (Child::wait_for_exec):
    // a frugal-smi run before it would still see this program, not /bin/sleep.
    fcntl(to_parent, F_SETFD, FD_CLOEXEC);
    execl("/bin/sleep", "sleep", "600", static_cast<char*>(nullptr));
    FAIL() << "exec of /bin/sleep: " << std::strerror(errno);
  }
  char c;
  while (read(from_parent, &c, 1) > 0) {
  }
  for (const memory::Allocation& b : blocks) a.deallocate(b.block);
}

TEST(SmiChild, Run) {
  const char* arg = std::getenv("FRUGAL_SMI_TEST_CHILD");
  if (!arg) GTEST_SKIP() << "the child of the Smi tests, run by them";
  std::string mode = arg;
  int to_parent = -1, from_parent = -1;
  const size_t comma = mode.find(',');
  ASSERT_EQ(std::sscanf(mode.c_str() + comma + 1, "%d,%d", &to_parent, &from_parent), 2);
  mode.resize(comma);
  child_allocate(to_parent, from_parent, mode);
}

// ---- the tests ----

TEST(Smi, ReportsAChildsFiguresExactly) {
  Child child("plain");
  ASSERT_FALSE(child.said.is_null()) << "the child said nothing";
  EXPECT_TRUE(std::filesystem::exists(page_path(child.pid)));
  const SmiRun run = run_smi("--json");
  ASSERT_EQ(run.status, 0) << run.err;
  const json* p = find_pid(run, child.pid);
  ASSERT_NE(p, nullptr) << "frugal-smi --json does not list pid " << child.pid;
  EXPECT_EQ(p->at("program"), "test_core_smi");
  ASSERT_EQ(p->at("devices").size(), 1u) << p->dump();
  const json& d = p->at("devices")[0];
  EXPECT_EQ(d.at("device"), "cpu");
  EXPECT_EQ(d.at("allocator"), memory::allocator(kCPU).kind());
  for (const char* key : {"allocated", "peak", "reserved", "reserved_peak", "limit"})
    EXPECT_EQ(d.at(key), child.said.at(key)) << key << " in " << d.dump();
  EXPECT_EQ(d.at("limit"), 256 << 20);
  EXPECT_GT(d.at("peak").get<int64_t>(), d.at("allocated").get<int64_t>());
  // The tags listed hold exactly their live bytes; the largest one is listed (it outgrew the others).
  ASSERT_FALSE(d.at("top_tags").empty()) << d.dump();
  for (const json& t : d.at("top_tags"))
    EXPECT_EQ(t.at("bytes"), child.said.at("tags").value(t.at("tag").get<std::string>(), int64_t(-1)))
        << t.dump();
  EXPECT_EQ(d.at("top_tags")[0].at("tag"), "smi/large");

  // The table says the same, readably.
  const SmiRun table = run_smi("");
  EXPECT_EQ(table.status, 0);

  EXPECT_EQ(child.finish(), 0);
  EXPECT_FALSE(std::filesystem::exists(page_path(child.said.at("pid").get<int64_t>())))
      << "the page outlived its process's normal exit";
}

TEST(Smi, TheTableListsTheChild) {
  Child child("plain");
  ASSERT_FALSE(child.said.is_null());
  const std::string cmd = std::string(FRUGAL_SMI_PATH) + " 2>&1";
  FILE* out = popen(cmd.c_str(), "r");
  ASSERT_NE(out, nullptr);
  std::string text;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, out)) text.append(buf, n);
  EXPECT_EQ(pclose(out), 0);
  EXPECT_NE(text.find("ALLOCATED"), std::string::npos) << text;
  EXPECT_NE(text.find(" " + std::to_string(child.pid) + "  test_core_smi"), std::string::npos) << text;
  EXPECT_NE(text.find("256.00 MiB"), std::string::npos) << text;  // the limit
  EXPECT_NE(text.find("smi/large 12.00 MiB"), std::string::npos) << text;
  EXPECT_EQ(child.finish(), 0);
}

TEST(Smi, AKilledProcessesPageIsRemovedAndNotListed) {
  Child child("plain");
  ASSERT_FALSE(child.said.is_null());
  const int64_t pid = child.pid;
  // Another frugal-smi (a test running beside this one) may clean the page before ours does: then it is
  // put back as the kill left it, from a copy taken while the child lived.
  const std::string copy = ::testing::TempDir() + "frugal_smi_killed_page";
  std::filesystem::copy_file(page_path(pid), copy, std::filesystem::copy_options::overwrite_existing);
  child.kill_hard();
  if (!std::filesystem::exists(page_path(pid))) std::filesystem::copy_file(copy, page_path(pid));
  std::filesystem::remove(copy);
  const SmiRun run = run_smi("--json");
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(find_pid(run, pid), nullptr) << "a dead process is listed";
  EXPECT_FALSE(std::filesystem::exists(page_path(pid))) << "the stale page was not removed";
}

TEST(Smi, APageLeftByAnExecIsRemoved) {
  Child child("exec");
  ASSERT_FALSE(child.said.is_null());
  child.wait_for_exec();
  const SmiRun run = run_smi("--json");
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(find_pid(run, child.pid), nullptr) << "a process that now runs /bin/sleep is listed";
  EXPECT_FALSE(std::filesystem::exists(page_path(child.pid)));
}

TEST(Smi, APageWhosePidWasReusedIsRemoved) {
  // A real page, copied under the name of a live process that started at another time than the page says.
  Child child("plain");
  ASSERT_FALSE(child.said.is_null());
  Sleeper sleeper;
  const std::string copy = page_path(sleeper.pid);
  std::filesystem::copy_file(page_path(child.pid), copy);
  {
    const int fd = open(copy.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    void* mem = mmap(nullptr, sizeof(smi::PageWords), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    ASSERT_NE(mem, MAP_FAILED);
    auto* page = static_cast<smi::PageWords*>(mem);
    page->pid.store(uint64_t(sleeper.pid));
    page->start_ticks.store(page->start_ticks.load() - 1);
    munmap(mem, sizeof(smi::PageWords));
  }
  const SmiRun run = run_smi("--json");
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(find_pid(run, sleeper.pid), nullptr);
  EXPECT_NE(find_pid(run, child.pid), nullptr);
  EXPECT_FALSE(std::filesystem::exists(copy)) << "a page of another process with the same pid was kept";
  EXPECT_EQ(child.finish(), 0);
}

TEST(Smi, BadPagesAreSkippedWithANote) {
  Sleeper sleeper;  // alive: its pages are not stale, only unreadable
  const std::string path = page_path(sleeper.pid);
  for (const size_t size : {size_t(100), sizeof(smi::PageWords)}) {
    SCOPED_TRACE(size);
    {
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      f << std::string(size, 'x');
    }
    const SmiRun run = run_smi("--json");
    EXPECT_EQ(run.status, 0) << run.err;
    EXPECT_EQ(find_pid(run, sleeper.pid), nullptr);
    EXPECT_NE(run.err.find(smi::page_name(sleeper.pid) + ": skipped, not a frugal-smi page"),
              std::string::npos)
        << run.err;
    EXPECT_TRUE(std::filesystem::exists(path)) << "a page of a live process was removed";
  }
  // Once its pid is dead, it goes.
  sleeper.stop();
  const SmiRun run = run_smi("--json");
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Smi, Frugal_SmiZeroPublishesNothing) {
  Child child("plain", "0");
  ASSERT_FALSE(child.said.is_null());
  EXPECT_FALSE(std::filesystem::exists(page_path(child.pid)));
  const SmiRun run = run_smi("--json");
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(find_pid(run, child.pid), nullptr);
  EXPECT_EQ(child.finish(), 0);
}

TEST(Smi, AForkedChildLeavesItsParentsPageAlone) {
  Child child("fork");  // the checks run in the child: see child_allocate
  ASSERT_FALSE(child.said.is_null()) << "the child failed before it said anything";
  const SmiRun run = run_smi("--json");
  const json* p = find_pid(run, child.pid);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->at("devices")[0].at("allocated"), child.said.at("allocated"));
  EXPECT_EQ(child.finish(), 0);
}

TEST(Smi, BadArgumentsAreRefused) {
  EXPECT_NE(run_smi("-l 0").status, 0);
  EXPECT_NE(run_smi("--no-such-flag").status, 0);
}

// The seqlock: a reader racing with a writer only ever sees whole updates. Every update writes figures that
// hang together (peak = 2 allocated, ...), and tags named after the same number.
TEST(Smi, TheReaderNeverSeesATornSlot) {
  static smi::SlotWords slot;
  smi::SlotWriter writer(&slot);
  constexpr int64_t kUpdates = 2000000;
  std::atomic<bool> done{false};
  std::thread write_thread([&] {
    for (int64_t k = 1; k <= kUpdates; ++k) {
      writer.write({k, 2 * k, 3 * k, 4 * k, 5 * k}, smi::SlotWriter::kNotListed, 0);
      if (k % 7 == 0)
        writer.write_top_tags({{"tag-" + std::to_string(k), k}, {"other-" + std::to_string(k), k / 2}});
    }
    done = true;
  });
  int64_t reads = 0, torn = 0, last = 0, backwards = 0;
  while (!done || reads == 0) {
    smi::DeviceFigures f;
    if (!smi::read_slot(slot, f)) continue;
    ++reads;
    const int64_t k = f.figures.allocated;
    torn += f.figures.peak != 2 * k || f.figures.reserved != 3 * k || f.figures.reserved_peak != 4 * k ||
            f.figures.limit != 5 * k;
    for (const smi::TagBytes& t : f.top_tags) {
      const bool first = t.tag.rfind("tag-", 0) == 0;
      const int64_t n = std::stoll(t.tag.substr(first ? 4 : 6));
      torn += (first ? n : n / 2) != t.bytes || n > k;
    }
    backwards += k < last;
    last = k;
  }
  write_thread.join();
  EXPECT_GT(reads, 0);
  EXPECT_EQ(torn, 0) << "of " << reads << " reads";
  EXPECT_EQ(backwards, 0) << "of " << reads << " reads";
  smi::DeviceFigures f;
  ASSERT_TRUE(smi::read_slot(slot, f));
  EXPECT_EQ(f.figures.allocated, kUpdates);
}

// When the tags are ranked again (Note [frugal-smi page]): at once while none is listed; when a tag not
// listed outgrows the least one listed (or the list has room), but not before kTopTagsSoonest changes; and
// every kTopTagsEvery changes in any case. A listed tag that shrinks lowers the bar at once.
TEST(Smi, TheTagsAreRankedWhenTheRuleSays) {
  static smi::SlotWords slot;
  smi::SlotWriter w(&slot);
  const smi::Figures f{};
  constexpr int kNot = smi::SlotWriter::kNotListed;
  // Changes until write says the ranking is due (0: not within `most`).
  auto changes_until_due = [&](int listed, int64_t bytes, uint32_t most) -> uint32_t {
    for (uint32_t i = 1; i <= most; ++i)
      if (w.write(f, listed, bytes)) return i;
    return 0;
  };
  EXPECT_EQ(changes_until_due(kNot, 100, 1), 1u) << "the first tag with bytes is listed at once";
  EXPECT_FALSE(w.write(f, kNot, 0)) << "a tag without bytes outgrows nothing";

  w.write_top_tags({{"a", 100}});  // room for three more: any tag with bytes belongs
  EXPECT_EQ(changes_until_due(kNot, 1, smi::kTopTagsEvery), smi::kTopTagsSoonest);

  w.write_top_tags({{"a", 100}, {"b", 50}, {"c", 20}, {"d", 10}});
  EXPECT_EQ(changes_until_due(kNot, 10, smi::kTopTagsEvery), smi::kTopTagsEvery)
      << "a tag with no more than the least listed waits for the periodic ranking";
  w.write_top_tags({{"a", 100}, {"b", 50}, {"c", 20}, {"d", 10}});
  EXPECT_EQ(changes_until_due(kNot, 11, smi::kTopTagsEvery), smi::kTopTagsSoonest);

  w.write_top_tags({{"a", 100}, {"b", 50}, {"c", 20}, {"d", 10}});
  EXPECT_FALSE(w.write(f, 0, 3)) << "a listed tag's change is no reason to rank";
  EXPECT_EQ(changes_until_due(kNot, 5, smi::kTopTagsEvery), smi::kTopTagsSoonest - 1)
      << "'a' fell to 3 bytes: 5 outgrows it";
  smi::DeviceFigures read;
  ASSERT_TRUE(smi::read_slot(slot, read));
  ASSERT_EQ(read.top_tags.size(), 4u);
  EXPECT_EQ(read.top_tags.back().tag, "a") << "the reader lists the most bytes first";
  EXPECT_EQ(read.top_tags.back().bytes, 3) << "a listed tag's bytes are kept exact between rankings";
}

}  // namespace
}  // namespace frugal

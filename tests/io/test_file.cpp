// Atomic saves (io/file.h): symlinks at temporary names are never followed, permissions survive a save, saves
// racing on one path leave one whole version, and a failed save leaves the old file and no temporary behind.
#include "io/file.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/test_util.h"

namespace frugal {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

class AtomicFileTest : public testing::ScratchDirTest {
 protected:
  void TearDown() override {
    io::detail::set_temp_names({});
    io::detail::inject_fault(0);
    testing::ScratchDirTest::TearDown();
  }
  // The names in the scratch directory, sorted.
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

mode_t mode_of(const std::string& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

TEST_F(AtomicFileTest, NeverFollowsASymlinkPlantedAtATemporaryName) {
  // A symlink where a save puts its temporary (the old fixed name `path`.tmp, or names a guesser might try)
  // would make the save write through it: into a file the saver may write and the planter may not.
  const std::string p = path("w.bin"), victim = path("victim"), missing = path("created_through_link");
  io::atomic_write(victim, "victim's bytes");
  for (const std::string& name : {p + ".tmp", p + "~", p + ".new", p + ".tmp.0"})
    fs::create_symlink(victim, name);
  io::atomic_write(p, "first");
  io::atomic_write(p, "second");
  EXPECT_EQ(io::read_bytes(p), "second");
  EXPECT_EQ(io::read_bytes(victim), "victim's bytes");
  for (const std::string& name : {p + ".tmp", p + "~", p + ".new", p + ".tmp.0"}) {
    EXPECT_TRUE(fs::is_symlink(name)) << name;
    EXPECT_EQ(fs::read_symlink(name), victim) << name;
  }
  EXPECT_FALSE(fs::exists(missing));
}

TEST_F(AtomicFileTest, SkipsEveryTemporaryNameThatIsTaken) {
  // The names a save tries are fixed here, and something is planted at the first four: a symlink to a file,
  // a dangling symlink, a hard link to the file, a directory. The save must go around all of them.
  const std::string p = path("w.bin"), victim = path("victim"), missing = path("created_through_link");
  io::detail::set_temp_names(
      [](const std::string& target, int attempt) { return target + ".try" + std::to_string(attempt); });
  io::atomic_write(victim, "victim's bytes");
  fs::create_symlink(victim, p + ".try0");
  fs::create_symlink(missing, p + ".try1");
  fs::create_hard_link(victim, p + ".try2");
  fs::create_directory(p + ".try3");
  io::atomic_write(p, "saved");
  EXPECT_EQ(io::read_bytes(p), "saved");
  EXPECT_EQ(io::read_bytes(victim), "victim's bytes");
  EXPECT_FALSE(fs::exists(missing));
  EXPECT_TRUE(fs::is_symlink(p + ".try0"));
  EXPECT_TRUE(fs::is_symlink(p + ".try1"));
  EXPECT_EQ(fs::hard_link_count(victim), 2u);
  EXPECT_TRUE(fs::is_directory(p + ".try3"));
  EXPECT_FALSE(fs::exists(p + ".try4"));  // the one used, renamed away

  // When every name is taken the save gives up with a clear message and changes nothing.
  io::detail::set_temp_names([&](const std::string&, int) { return p + ".try0"; });
  expect_error<Error>([&] { io::atomic_write(p, "never"); }, {"names tried", "all exist", p, "unchanged"});
  EXPECT_EQ(io::read_bytes(p), "saved");
  EXPECT_EQ(io::read_bytes(victim), "victim's bytes");
}

TEST_F(AtomicFileTest, KeepsThePermissionsOfTheFileItReplaces) {
  const std::string p = path("secret.bin");
  io::atomic_write(p, "one");
  for (mode_t mode : {mode_t(0600), mode_t(0640), mode_t(0444), mode_t(0755)}) {
    ASSERT_EQ(::chmod(p.c_str(), mode), 0);
    io::atomic_write(p, "again");
    EXPECT_EQ(mode_of(p), mode) << std::oct << mode;
  }
  // A new file: 0644 less the umask.
  const mode_t saved = ::umask(027);
  io::atomic_write(path("new.bin"), "new");
  ::umask(saved);
  EXPECT_EQ(mode_of(path("new.bin")), mode_t(0640));
}

TEST_F(AtomicFileTest, ConcurrentSavesToOnePathLeaveOneWholeVersion) {
  // Two writers save their own contents to one path over and over while a reader reloads it: every load is
  // one writer's contents, whole, and every save succeeds.
  const std::string p = path("shared.bin");
  const std::string a(64 << 10, 'a'), b((96 << 10) + 3, 'b');
  io::atomic_write(p, a);
  std::atomic<bool> done{false};
  std::atomic<int> torn{0}, failed{0}, reads{0};
  std::string first_error;
  std::mutex error_mutex;
  auto writer = [&](const std::string& contents) {
    for (int i = 0; i < 40; ++i) {
      try {
        io::atomic_write(p, contents);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (failed++ == 0) first_error = e.what();
      }
    }
  };
  std::thread reader([&] {
    while (!done) {
      const std::string got = io::read_bytes(p);
      if (got != a && got != b) ++torn;
      ++reads;
    }
  });
  std::thread wa(writer, a), wb(writer, b);
  wa.join();
  wb.join();
  done = true;
  reader.join();
  EXPECT_EQ(failed, 0) << first_error;
  EXPECT_EQ(torn, 0) << "of " << reads << " reads";
  const std::string last = io::read_bytes(p);
  EXPECT_TRUE(last == a || last == b);
  EXPECT_EQ(listing(), std::vector<std::string>{"shared.bin"});  // no temporary left behind
}

TEST_F(AtomicFileTest, AFailedCreateSaysSoAndLeavesNothing) {
  // A directory the saver cannot write to. Root writes anywhere, so then a child process drops to nobody.
  const std::string sub = path("locked");
  fs::create_directory(sub);
  const std::string p = sub + "/w.bin";
  io::atomic_write(p, "old");
  ASSERT_EQ(::chmod(sub.c_str(), 0555), 0);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    if (::geteuid() == 0 && ::setuid(65534) != 0) ::_exit(2);
    std::string message = "no error";
    try {
      io::atomic_write(p, "new");
    } catch (const Error& e) {
      message = e.what();
    }
    (void)!::write(pipe_fds[1], message.data(), message.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string message;
  char buf[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) message.append(buf, size_t(n));
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ::chmod(sub.c_str(), 0755);
  for (const char* part : {"cannot create a temporary file", "w.bin.tmp", "Permission denied", "unchanged"})
    EXPECT_NE(message.find(part), std::string::npos) << message;
  EXPECT_EQ(io::read_bytes(p), "old");
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(sub)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"w.bin"});
}

TEST_F(AtomicFileTest, AbandonedOrRefusedWritesLeaveNoTemporary) {
  const std::string p = path("w.bin");
  io::atomic_write(p, "old");
  {
    io::AtomicFile f(p);
    f.write("never", 5);
    EXPECT_TRUE(fs::exists(f.temp_path()));
    EXPECT_EQ(f.temp_path().rfind(p + ".tmp.", 0), 0u) << f.temp_path();
  }  // destroyed without commit
  EXPECT_EQ(io::read_bytes(p), "old");
  EXPECT_EQ(listing(), std::vector<std::string>{"w.bin"});

  io::AtomicFile f(p);
  f.write("new", 3);
  f.commit();
  EXPECT_TRUE(f.renamed());
  expect_error<Error>([&] { f.write("x", 1); }, {"already committed"});
  expect_error<Error>([&] { f.commit(); }, {"already committed"});
  EXPECT_EQ(io::read_bytes(p), "new");
  EXPECT_EQ(listing(), std::vector<std::string>{"w.bin"});
}

// --- failures at every step (Note [save fault injection])
// ------------------------------------------------------------------------------------

// What the message of a failure at each step of a save over an existing file names, in order.
const std::vector<std::string> kSteps = {"cannot create a temporary file", "giving the temporary file",
                                         "writing the temporary file",     "fsync of the temporary file",
                                         "closing the temporary file",     "renaming the temporary file",
                                         "but the fsync of its directory"};

TEST_F(AtomicFileTest, AFailureAtEveryStepSaysWhichAndLeavesTheOldFile) {
  const std::string p = path("w.bin");
  io::atomic_write(p, "old");
  io::detail::inject_fault(0);
  io::atomic_write(p, "a dry run");
  ASSERT_EQ(io::detail::fault_steps(), int64_t(kSteps.size()));
  for (size_t n = 1; n <= kSteps.size(); ++n) {
    SCOPED_TRACE("step " + std::to_string(n) + ": " + kSteps[n - 1]);
    io::atomic_write(p, "old");
    io::detail::inject_fault(int64_t(n));
    std::string message;
    try {
      io::atomic_write(p, "new");
    } catch (const Error& e) {
      message = e.what();
    }
    io::detail::inject_fault(0);
    // Only the directory's fsync comes after the rename: then the file is new and only its durability is in
    // doubt, which the message says.
    const bool renamed = n == kSteps.size();
    for (const std::string& part : {kSteps[n - 1], std::string("Input/output error"), p,
                                    std::string(renamed ? "holds the new contents" : "is unchanged")})
      EXPECT_NE(message.find(part), std::string::npos) << "'" << message << "' lacks '" << part << "'";
    EXPECT_EQ(io::read_bytes(p), renamed ? "new" : "old");
    EXPECT_EQ(listing(), std::vector<std::string>{"w.bin"});  // no temporary left
  }
}

TEST_F(AtomicFileTest, AKillAtEveryStepLeavesTheOldFileOrTheNew) {
  const std::string p = path("w.bin"), old_bytes(1000, 'o'), new_bytes(3000, 'n');
  for (size_t n = 1; n <= kSteps.size(); ++n) {
    SCOPED_TRACE("step " + std::to_string(n) + ": " + kSteps[n - 1]);
    io::atomic_write(p, old_bytes);
    io::detail::inject_fault(int64_t(n), io::detail::Fault::Crash);
    EXPECT_THROW(io::atomic_write(p, new_bytes), io::detail::SimulatedCrash);
    EXPECT_THROW(io::atomic_write(p, "after death"),
                 io::detail::SimulatedCrash);  // a killed process stays so
    io::detail::inject_fault(0);
    EXPECT_EQ(io::read_bytes(p),
              n >= 7 ? new_bytes : old_bytes);  // step 6 is the rename, killed before it ran
    // A kill leaves its temporary behind, as a real one does (none after the rename or before the create).
    const size_t temporaries = listing().size() - 1;
    EXPECT_EQ(temporaries, n == 1 || n == 7 ? 0u : 1u);
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path() != fs::path(p)) fs::remove(e.path());
  }
}

TEST_F(AtomicFileTest, RenameDurablyReplacesASymlinkWithoutFollowingIt) {
  const std::string victim = path("victim"), link = path("link"), from = path("from");
  io::atomic_write(victim, "victim's bytes");
  io::atomic_write(from, "moved");
  fs::create_symlink(victim, link);
  io::rename_durably(from, link);
  EXPECT_FALSE(fs::is_symlink(link));
  EXPECT_EQ(io::read_bytes(link), "moved");
  EXPECT_EQ(io::read_bytes(victim), "victim's bytes");
  expect_error<Error>([&] { io::rename_durably(from, link); }, {"renaming", from, "No such file", "neither"});
}

}  // namespace
}  // namespace frugal

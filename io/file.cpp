// File reads and atomic writes over POSIX calls (fsync, O_EXCL and pread have no portable C++ spelling).
#include "io/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <ios>
#include <mutex>
#include <random>

#include "core/error.h"

namespace frugal::io {

namespace {
std::string errno_text() { return std::strerror(errno); }

// The directory holding `path`, for the fsync that makes a rename durable.
std::string parent_dir(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// What a file that is not a regular one is, for the message that refuses it.
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}
}  // namespace

InputFile::InputFile(std::string path, std::string who) : path_(std::move(path)), who_(std::move(who)) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer; fstat then refuses it (and regular files
  // ignore the flag).
  fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  FRUGAL_CHECK(fd_ >= 0, who_, ": cannot open '", path_, "': ", errno_text());
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd_);
    FRUGAL_CHECK(false, who_, ": cannot get the size of '", path_, "': ", why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    FRUGAL_CHECK(false, who_, ": '", path_, "' is not a file but ", file_kind(st.st_mode));
  }
  size_ = int64_t(st.st_size);
}

InputFile::~InputFile() { ::close(fd_); }

std::shared_ptr<const void> InputFile::map() const {
  FRUGAL_CHECK(size_ > 0, who_, ": cannot map '", path_, "': the file is empty");
  void* base = ::mmap(nullptr, size_t(size_), PROT_READ, MAP_SHARED, fd_, 0);
  FRUGAL_CHECK(base != MAP_FAILED, who_, ": cannot map '", path_, "' (", size_, " bytes): ", errno_text());
  const size_t length = size_t(size_);
  // The mapping outlives the descriptor (closed with this InputFile): munmap is what ends it.
  return std::shared_ptr<const void>(base,
                                     [length](const void* p) { ::munmap(const_cast<void*>(p), length); });
}

void InputFile::read_at(int64_t offset, void* dst, int64_t nbytes, const std::string& what) const {
  char* p = static_cast<char*>(dst);
  int64_t done = 0;
  while (done < nbytes) {
    const ssize_t n = ::pread(fd_, p + done, size_t(std::min<int64_t>(nbytes - done, int64_t(1) << 30)),
                              off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    FRUGAL_CHECK(n >= 0, who_, ": reading ", what, " of '", path_, "' failed: ", errno_text());
    FRUGAL_CHECK(n > 0, who_, ": reading ", what, " of '", path_, "' failed after ", done, " of ", nbytes,
                 " bytes: the file ended (was it truncated while being read?)");
    done += n;
  }
}

std::string read_bytes(const std::string& path) {
  const InputFile in(path, "read_bytes");
  std::string bytes(size_t(in.size()), '\0');
  in.read_at(0, bytes.data(), in.size(), "the whole file");
  return bytes;
}

namespace {

constexpr int kTempNameAttempts = 100;

// Note [save fault injection], in io/file.h.
std::atomic<int64_t> g_fault_step{0}, g_steps_taken{0};
std::atomic<bool> g_fault_crashes{false}, g_crashed{false};

enum class Step { Run, Fail, Crash };
// Counts one step of a save and says whether it runs, fails (EIO) or crashes. After a crash nothing runs.
Step next_step() {
  if (g_crashed) throw detail::SimulatedCrash();
  if (++g_steps_taken != g_fault_step.load()) return Step::Run;
  if (!g_fault_crashes) return Step::Fail;
  g_crashed = true;
  return Step::Crash;
}
// The common case: true when the step is to fail (errno is then EIO); a crash throws.
bool injected_failure() {
  switch (next_step()) {
    case Step::Run:
      return false;
    case Step::Fail:
      errno = EIO;
      return true;
    case Step::Crash:
      break;
  }
  throw detail::SimulatedCrash();
}

std::mutex g_temp_names_mutex;
std::function<std::string(const std::string&, int)> g_temp_names;  // detail::set_temp_names

// The name of attempt `attempt` at a temporary file for `path`: 64 random bits, so that concurrent saves
// (threads or processes) never pick the same one and nobody can guess it in advance.
std::string temp_name(const std::string& path, int attempt) {
  {
    std::lock_guard<std::mutex> lock(g_temp_names_mutex);
    if (g_temp_names) return g_temp_names(path, attempt);
  }
  std::random_device random;  // the kernel's randomness: never repeats across forked processes
  const uint64_t bits = (uint64_t(random()) << 32) ^ uint64_t(random());
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(bits));
  return path + ".tmp." + suffix;
}

// The directory's fsync makes a rename durable. Some file systems cannot fsync a directory (EINVAL): there
// is nothing more to do on those, so that is no failure.
bool fsync_directory(const std::string& dir) {
  if (injected_failure()) return false;
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0 || errno == EINVAL;
  const int saved = errno;
  ::close(fd);
  errno = saved;
  return ok;
}

}  // namespace

namespace detail {
void inject_fault(int64_t step, Fault kind) {
  g_fault_step = step;
  g_fault_crashes = kind == Fault::Crash;
  g_crashed = false;
  g_steps_taken = 0;
}
int64_t fault_steps() { return g_steps_taken; }

void set_temp_names(std::function<std::string(const std::string& path, int attempt)> names) {
  std::lock_guard<std::mutex> lock(g_temp_names_mutex);
  g_temp_names = std::move(names);
}
}  // namespace detail

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  // The permission bits of the file being replaced (stat follows a symlink at `path`: the bits of the file a
  // user sees there). A new file is created 0644 and the umask applies.
  struct stat old {};
  const bool replacing = ::stat(path_.c_str(), &old) == 0 && S_ISREG(old.st_mode);
  for (int attempt = 0; fd_ < 0; ++attempt) {
    temp_path_ = temp_name(path_, attempt);
    // O_EXCL: never an existing file, nor a symlink at that name, dangling or not (O_NOFOLLOW says it twice).
    fd_ = injected_failure()
              ? -1
              : ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                       replacing ? 0600 : 0644);
    if (fd_ >= 0) break;
    FRUGAL_CHECK(errno == EEXIST || errno == ELOOP, "cannot create a temporary file '", temp_path_,
                 "' to write '", path_, "': ", errno_text(), "; '", path_, "' is unchanged");
    FRUGAL_CHECK(attempt + 1 < kTempNameAttempts, "cannot create a temporary file to write '", path_,
                 "': the ", kTempNameAttempts, " names tried (the last '", temp_path_, "') all exist; '",
                 path_, "' is unchanged");
  }
  if (!replacing) return;
  bool failed = false;
  try {
    failed = injected_failure() || ::fchmod(fd_, old.st_mode & 07777) != 0;
  } catch (const detail::SimulatedCrash&) {
    ::close(fd_);  // no destructor runs for an object whose constructor throws
    throw;
  }
  if (failed) {
    const std::string why = errno_text();
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", unsigned(old.st_mode & 07777));
    fail("giving the temporary file '" + temp_path_ + "' the permissions of '" + path_ + "' (" + mode + ")",
         why);
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  if (g_crashed) {  // a simulated kill: the descriptor goes, as the kernel closes it, and the temporary stays
    ::close(fd_);
    return;
  }
  abandon();  // destroyed without commit()
}

void AtomicFile::abandon() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_path_.c_str());
}

void AtomicFile::fail(const std::string& step, const std::string& why) {
  abandon();
  FRUGAL_CHECK(false, step, " failed: ", why, "; '", path_, "' is unchanged and the temporary is deleted");
}

void AtomicFile::write(const void* data, int64_t nbytes) {
  FRUGAL_CHECK(fd_ >= 0, "writing '", path_, "': the file was already ",
               renamed_ ? "committed" : "abandoned after a failed step");
  const char* p = static_cast<const char*>(data);
  switch (next_step()) {
    case Step::Run:
      break;
    case Step::Fail:
      fail("writing the temporary file '" + temp_path_ + "'", std::strerror(EIO));
    case Step::Crash:
      (void)!::write(fd_, p, size_t(nbytes / 2));  // killed halfway through
      throw detail::SimulatedCrash();
  }
  while (nbytes > 0) {
    // Linux writes at most about 2 GiB per call; loop over partial writes.
    const ssize_t n = ::write(fd_, p, size_t(std::min<int64_t>(nbytes, int64_t(1) << 30)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing the temporary file '" + temp_path_ + "'", n < 0 ? errno_text() : "no progress");
    p += n;
    nbytes -= n;
  }
}

void AtomicFile::commit() {
  FRUGAL_CHECK(fd_ >= 0, "committing '", path_, "': the file was already ",
               renamed_ ? "committed" : "abandoned after a failed step");
  if (injected_failure() || ::fsync(fd_) != 0)
    fail("fsync of the temporary file '" + temp_path_ + "'", errno_text());
  // Closed before the rename: some file systems (NFS) report write-back errors only at close.
  if (injected_failure()) fail("closing the temporary file '" + temp_path_ + "'", errno_text());
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("closing the temporary file '" + temp_path_ + "'", errno_text());
  if (injected_failure() || ::rename(temp_path_.c_str(), path_.c_str()) != 0)
    fail("renaming the temporary file '" + temp_path_ + "' over '" + path_ + "'", errno_text());
  renamed_ = true;
  const std::string dir = parent_dir(path_);
  FRUGAL_CHECK(fsync_directory(dir), "'", path_, "' holds the new contents, but the fsync of its directory '",
               dir, "' failed: ", errno_text(), "; after a power loss it could hold the old ones again");
}

void atomic_write(const std::string& path, std::string_view bytes) {
  AtomicFile f(path);
  f.write(bytes.data(), int64_t(bytes.size()));
  f.commit();
}

void rename_durably(const std::string& from, const std::string& to) {
  FRUGAL_CHECK(!injected_failure() && ::rename(from.c_str(), to.c_str()) == 0, "renaming '", from, "' over '",
               to, "' failed: ", errno_text(), "; neither file changed");
  const std::string dir = parent_dir(to);
  FRUGAL_CHECK(fsync_directory(dir), "'", from, "' is renamed to '", to,
               "', but the fsync of the directory '", dir, "' failed: ", errno_text(),
               "; after a power loss the rename could be undone");
}

}  // namespace frugal::io

// File reads and atomic writes over POSIX calls (fsync, O_EXCL and pread have no portable C++ spelling).
#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

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

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), temp_path_(path_ + ".tmp") {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  FRUGAL_CHECK(fd_ >= 0, "cannot create '", temp_path_, "' to write '", path_, "': ", errno_text());
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;  // committed
  ::close(fd_);
  ::unlink(temp_path_.c_str());
}

void AtomicFile::write(const void* data, int64_t nbytes) {
  FRUGAL_CHECK(fd_ >= 0, "writing '", path_, "': the file was already committed");
  const char* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    // Linux writes at most about 2 GiB per call; loop over partial writes.
    const ssize_t n = ::write(fd_, p, size_t(std::min<int64_t>(nbytes, int64_t(1) << 30)));
    if (n < 0 && errno == EINTR) continue;
    FRUGAL_CHECK(n > 0, "writing '", temp_path_, "' failed: ", (n < 0 ? errno_text() : "no progress"), "; '",
                 path_, "' is unchanged");
    p += n;
    nbytes -= n;
  }
}

void AtomicFile::commit() {
  FRUGAL_CHECK(fd_ >= 0, "committing '", path_, "': the file was already committed");
  FRUGAL_CHECK(::fsync(fd_) == 0, "fsync of '", temp_path_, "' failed: ", errno_text(), "; '", path_,
               "' is unchanged");
  const int fd = fd_;
  fd_ = -1;
  const bool closed = ::close(fd) == 0;
  if (!closed || ::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(temp_path_.c_str());
    FRUGAL_CHECK(false, "cannot move '", temp_path_, "' to '", path_, "': ", why, "; '", path_,
                 "' is unchanged");
  }
  // Make the rename itself durable. A failure here leaves the new file in place, so it is not an error.
  const int dir = ::open(parent_dir(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
}

void atomic_write(const std::string& path, std::string_view bytes) {
  AtomicFile f(path);
  f.write(bytes.data(), int64_t(bytes.size()));
  f.commit();
}

}  // namespace frugal::io

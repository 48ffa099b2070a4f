// Whole-file reads and atomic writes over POSIX calls (fsync has no portable C++ spelling).
#include "io/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace frugal::io {

namespace {
std::string errno_text() { return std::strerror(errno); }

// The directory holding `path`, for the fsync that makes a rename durable.
std::string parent_dir(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}
}  // namespace

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  FRUGAL_CHECK(in.is_open(), "read_bytes: cannot open '", path, "': ", errno_text());
  const std::streamoff size = in.tellg();
  FRUGAL_CHECK(size >= 0, "read_bytes: cannot get the size of '", path, "'");
  std::string bytes(size_t(size), '\0');
  in.seekg(0);
  in.read(bytes.data(), size);
  FRUGAL_CHECK(in.gcount() == size, "read_bytes: '", path, "' ended after ", in.gcount(), " of ", size,
               " bytes (was it truncated while being read?)");
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

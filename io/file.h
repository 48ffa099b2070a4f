// File helpers: read a file (whole, or at offsets), and write one atomically (a temporary file, fsync,
// rename), so that an interrupted or failed write never destroys the previous version. Not a general I/O
// layer.
//
//   io::atomic_write("run/state.json", json_text);
//   io::AtomicFile f("model.safetensors");  // writes go to model.safetensors.tmp.<random>
//   f.write(header.data(), header.size());
//   f.commit();                              // flush, fsync, rename over model.safetensors
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace frugal::io {

// The whole file as bytes; throws Error naming the path when it cannot be read.
std::string read_bytes(const std::string& path);

// A regular file open for reading. A directory, FIFO or device is refused before anything is read (opening
// a FIFO never blocks); `who` begins every message ("load_safetensors: ...").
class InputFile {
 public:
  InputFile(std::string path, std::string who);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int64_t size() const { return size_; }  // when opened
  // The first size() bytes of the file mapped read-only and shared (the page cache's pages: nothing is read
  // or copied until touched), unmapped when the last holder lets go. A file cut shorter while mapped makes a
  // later read of the lost pages fault (SIGBUS), as with every mapping: map only files nobody rewrites in
  // place (frugal's saves replace files by renaming, which leaves a mapping of the old one intact).
  std::shared_ptr<const void> map() const;
  // Exactly nbytes at `offset` into dst; throws when the file ends first (it shrank while being read).
  void read_at(int64_t offset, void* dst, int64_t nbytes, const std::string& what) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_, who_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// A file being written in place of `path`. Bytes go to a new temporary file beside it (the same directory, so
// the rename stays on one file system), named `path`.tmp.<16 random hex digits> and created exclusively: it
// is never an existing file, and a symlink planted at its name is never followed (O_EXCL | O_NOFOLLOW;
// another name is tried). It gets the permission bits of the file it replaces (0644 less the umask for a new
// one). commit() fsyncs it, renames it over `path` and fsyncs the directory. On any failure the temporary is
// deleted and `path` is unchanged (the message says which step failed); the same when it is destroyed without
// commit() (an exception midway). Saves to one path at once write their own temporaries: the file ends up
// as one of them, whole.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, int64_t nbytes);  // throws Error (disk full, file too large, ...)
  void commit();
  // True once the rename is done: `path` holds the new bytes even if commit() then threw (the directory's
  // fsync failed, so a power loss could still bring the old file back).
  bool renamed() const { return renamed_; }
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  void abandon();  // closes and deletes the temporary
  // Abandons the save after a failed step and throws: which step, why, and that `path` is unchanged.
  [[noreturn]] void fail(const std::string& step, const std::string& why);
  std::string path_, temp_path_;
  int fd_ = -1;
  bool renamed_ = false;
};

// Replaces the file at `path` with `bytes`, atomically as AtomicFile does.
void atomic_write(const std::string& path, std::string_view bytes);

// Renames `from` over `to` (in the same directory) and fsyncs the directory, so that the rename survives a
// power loss; a symlink at `to` is replaced, never followed. Throws Error saying which step failed.
void rename_durably(const std::string& from, const std::string& to);

namespace detail {
// Note [save fault injection]
// A test hook for every save of io/ (AtomicFile and rename_durably, so save_safetensors and save_checkpoint
// too): inject_fault(n, kind) makes the n-th step from then on fail, counting from 1, a step being one system
// call of a save: creating the temporary, giving it the old file's permissions, one write(), the fsync, the
// close, a rename, a directory's fsync. Fault::Error makes that call fail with EIO, and the save's own error
// handling runs. Fault::Crash simulates the process being killed there: a write() writes half its bytes
// first, then SimulatedCrash (not an Error, so nothing that handles errors catches it) unwinds to the test
// and nothing is cleaned up: temporaries stay, as a killed process leaves them, and every later step throws
// SimulatedCrash too until the next inject_fault. inject_fault(0) disarms it and only counts: a dry run tells
// a test how many steps a save has to sweep over. Steps are counted across threads; a test sweeps one save
// at a time.
enum class Fault { Error, Crash };
struct SimulatedCrash : std::exception {
  const char* what() const noexcept override { return "a crash simulated by io::detail::inject_fault"; }
};
void inject_fault(int64_t step, Fault kind = Fault::Error);
int64_t fault_steps();  // the steps taken since the last inject_fault

// Test hook: names the temporary files (attempt 0, 1, ... until one can be created) instead of random
// suffixes, so that a test can plant files at the names a save will try; an empty function restores them.
void set_temp_names(std::function<std::string(const std::string& path, int attempt)> names);
}  // namespace detail

}  // namespace frugal::io

// File helpers: read a file (whole, or at offsets), and write one atomically (a temporary file, fsync,
// rename), so that an interrupted or failed write never destroys the previous version. Not a general I/O
// layer.
//
//   io::atomic_write("run/state.json", json_text);
//   io::AtomicFile f("model.safetensors");  // writes go to model.safetensors.tmp
//   f.write(header.data(), header.size());
//   f.commit();                              // flush, fsync, rename over model.safetensors
#pragma once

#include <cstdint>
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
  // Exactly nbytes at `offset` into dst; throws when the file ends first (it shrank while being read).
  void read_at(int64_t offset, void* dst, int64_t nbytes, const std::string& what) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_, who_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// A file being written in place of `path`. Bytes go to path + ".tmp" in the same directory (so the rename
// stays on one file system); commit() flushes, fsyncs and renames it over `path`, then fsyncs the directory.
// Destroyed without commit() (an exception midway), it deletes the temporary file and `path` is untouched.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, int64_t nbytes);  // throws Error (disk full, file too large, ...)
  void commit();
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  std::string path_, temp_path_;
  int fd_ = -1;
};

// Replaces the file at `path` with `bytes`, atomically as AtomicFile does.
void atomic_write(const std::string& path, std::string_view bytes);

}  // namespace frugal::io

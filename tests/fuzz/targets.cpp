// The fuzz targets of tests/fuzz/targets.h: each writes the input where its reader looks, reads it, and uses
// what it got (sums every tensor, samples a batch), so that a reader which accepts a bad file is caught
// reading past it. Only frugal::Error is an expected outcome.
#include "tests/fuzz/targets.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string_view>

#include "frugal.h"

namespace frugal::fuzz {
namespace {

namespace fs = std::filesystem;

// A folder of this process's own for the inputs, removed when the process ends (by the static's destructor:
// an atexit handler registered while the static was being made ran after its destructor, found an empty
// path and left every folder behind).
struct ScratchFolder {
  ScratchFolder() {
    std::string templ = (fs::temp_directory_path() / "frugal-fuzz-XXXXXX").string();
    if (!mkdtemp(templ.data())) throw std::runtime_error("fuzz: cannot make a scratch folder");
    path = templ;
  }
  ~ScratchFolder() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;
  fs::path path;
};
const fs::path& scratch() {
  static const ScratchFolder folder;
  return folder.path;
}

void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Reads every element: a tensor that claims more than its bytes hold is caught here (under ASan).
void touch(const Tensor& t) {
  if (t.numel() > 0) (void)ops::sum(t.to(DType::F64)).item<double>();
}

// Expected outcomes: the reader accepted the input, or refused it with frugal::Error.
template <typename Fn>
void expect_accept_or_refuse(Fn&& fn) {
  try {
    fn();
  } catch (const Error&) {
  }
}

// --- safetensors ------------------------------------------------------------------------------------------
void run_safetensors(const uint8_t* data, size_t size) {
  const fs::path path = scratch() / "input.safetensors";
  write_file(path, as_text(data, size));
  expect_accept_or_refuse([&] {
    for (const auto& [name, t] : io::load_safetensors(path.string()).tensors) touch(t);
  });
}

void seeds_safetensors(const std::string& dir) {
  manual_seed(1);
  io::save_safetensors(dir + "/mixed.safetensors",
                       {{"w", randn({2, 3})},
                        {"h", randn({4}).to(DType::BF16)},
                        {"i", tensor<int64_t>({1, -2, 3}, Shape{3})},
                        {"s", tensor<float>({2.5f}, Shape{})},
                        {"e", zeros({0, 4})}},
                       {{"format", "frugal"}, {"epoch", "3"}});
  io::save_safetensors(dir + "/empty.safetensors", {});
}

// --- IDX
// ------------------------------------------------------------------------------------------------------
void run_idx(const uint8_t* data, size_t size) {
  const fs::path path = scratch() / "input-idx3-ubyte";
  write_file(path, as_text(data, size));
  expect_accept_or_refuse([&] { touch(data::read_idx(path.string())); });
}

// frugal reads IDX and writes none: the seeds are written here, byte by byte as the format has it
// (magic 0 0 0x08 ndim, big-endian u32 dims, then the u8 elements).
void seeds_idx(const std::string& dir) {
  auto idx = [](std::initializer_list<uint32_t> dims) {
    std::string b = {0, 0, 0x08, char(dims.size())};
    size_t n = 1;
    for (uint32_t d : dims) {
      for (int s = 24; s >= 0; s -= 8) b += char((d >> s) & 0xff);
      n *= d;
    }
    for (size_t i = 0; i < n; ++i) b += char(i * 37 % 256);
    return b;
  };
  write_file(fs::path(dir) / "images-idx3-ubyte", idx({2, 3, 4}));
  write_file(fs::path(dir) / "labels-idx1-ubyte", idx({5}));
}

// --- the text corpus
// ----------------------------------------------------------------------------------------
void run_text(const uint8_t* data, size_t size) {
  const fs::path root = scratch() / "text";
  fs::create_directories(root);
  write_file(root / "corpus", as_text(data, size));
  expect_accept_or_refuse([&] {
    const data::TextDataset ds(data::TextDatasetOptions().root(root.string()).context(4).val_fraction(0.25));
    if (ds.size() == 0) return;
    Generator gen(7);
    const data::Batch b = ds.sample_batch(2, gen);
    (void)ds.decode(b.input.select(0, 0));
    (void)ds.encode(ds.decode(b.target.select(0, 1)));
  });
}

void seeds_text(const std::string& dir) {
  write_file(fs::path(dir) / "fortune", "You will be surprised by a loud noise.\n%\nThe quick brown fox.\n");
  write_file(fs::path(dir) / "bytes", std::string("\x00\x01\xff\xfe\n\t ", 7));
}

// --- checkpoints (io::load_checkpoint: weights and state files of one save)
// ------------------------------------ The input is both files: a little-endian u32 n, then n bytes of
// weights, then the state file's bytes.
void run_checkpoint(const uint8_t* data, size_t size) {
  const fs::path path = scratch() / "input.ckpt";
  const std::string_view all = as_text(data, size);
  uint32_t n = 0;
  for (size_t i = 0; i < 4 && i < all.size(); ++i) n |= uint32_t(uint8_t(all[i])) << (8 * i);
  const std::string_view rest = all.size() > 4 ? all.substr(4) : std::string_view();
  const size_t split = std::min<size_t>(n, rest.size());
  write_file(path, rest.substr(0, split));
  write_file(io::checkpoint_state_path(path.string()), rest.substr(split));
  std::error_code ec;
  fs::remove(path.string() + ".state.next", ec);
  expect_accept_or_refuse([&] {
    const io::Checkpoint c = io::load_checkpoint(path.string());
    for (const auto& [name, t] : c.weights.tensors) touch(t);
    for (const auto& [name, t] : c.state.tensors) touch(t);
  });
}

// A checkpoint as the trainers write one, packed into one input as run_checkpoint reads it.
void seeds_checkpoint(const std::string& dir) {
  manual_seed(2);
  const fs::path tmp = scratch() / "seed.ckpt";
  io::save_checkpoint(
      tmp.string(), {{"1.weight", randn({3, 2})}, {"1.bias", randn({3})}}, {{"model", "mlp"}},
      {{"optimizer.step", tensor<int64_t>({4}, Shape{})}, {"trainer.epoch", tensor<int64_t>({1}, Shape{})}},
      {{"optimizer", "Adam"}});
  const std::string weights = io::read_bytes(tmp.string());
  const std::string state = io::read_bytes(io::checkpoint_state_path(tmp.string()));
  std::string packed(4, '\0');
  for (int i = 0; i < 4; ++i) packed[size_t(i)] = char((weights.size() >> (8 * i)) & 0xff);
  write_file(fs::path(dir) / "adam_mlp", packed + weights + state);
}

// --- byte counts (memory::parse_bytes, every program's size flags)
// ------------------------------------------
void run_byte_count(const uint8_t* data, size_t size) {
  expect_accept_or_refuse([&] { (void)memory::parse_bytes(as_text(data, size)); });
}

void seeds_byte_count(const std::string& dir) {
  int i = 0;
  for (const char* s : {"64M", "1.5G", "1000", "512KiB", "0.25T", "9223372036854775807"})
    write_file(fs::path(dir) / ("count" + std::to_string(i++)), s);
}

}  // namespace

const std::vector<Target>& targets() {
  static const std::vector<Target> all = {
      {"safetensors", run_safetensors, seeds_safetensors},
      {"idx", run_idx, seeds_idx},
      {"text", run_text, seeds_text},
      {"byte_count", run_byte_count, seeds_byte_count},
      {"checkpoint", run_checkpoint, seeds_checkpoint},
      {"ops", run_ops, seeds_ops},
      {"kernels", run_kernels, seeds_kernels},
  };
  return all;
}

const Target& target(const std::string& name) {
  for (const Target& t : targets())
    if (name == t.name) return t;
  throw std::invalid_argument("no fuzz target named '" + name + "'");
}

}  // namespace frugal::fuzz

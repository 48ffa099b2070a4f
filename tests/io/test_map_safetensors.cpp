// io::map_safetensors: views of a mapped file equal the loaded tensors, cost no arena bytes, count as mapped
// bytes under their tag until the last view goes, refuse writes, and corrupt or truncated files are refused
// before anything is mapped.
#include <filesystem>
#include <fstream>
#include <string>

#include "io/safetensors.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;
using MapSafetensorsTest = testing::ScratchDirTest;

StateDict sample() {
  StateDict d;
  d["a.weight"] = testing::uniform({17, 5}, -2, 2, DType::F32, 3);
  d["b.bias"] = testing::uniform({3}, -1, 1, DType::F64, 4);
  d["c.half"] = testing::uniform({4, 3}, -1, 1, DType::BF16, 5);
  d["d.index"] = randint(-50, 50, {6}, DType::I64);
  d["e.codes"] = randint(0, 256, {9}, DType::I64).to(DType::U8);
  d["f.flags"] = randint(0, 2, {5}, DType::I64).to(DType::Bool);
  d["g.empty"] = empty({0, 4});
  return d;
}

std::string bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), size_t(c.nbytes()));
}

TEST_F(MapSafetensorsTest, ViewsEqualTheLoadedTensorsWithoutArenaBytes) {
  const std::string p = path("m.safetensors");
  io::save_safetensors(p, sample(), {{"step", "7"}}, {"e.codes"});
  const io::SafetensorsFile loaded = io::load_safetensors(p);
  const int64_t file_bytes = int64_t(std::filesystem::file_size(p));

  const memory::Stats before = memory::stats(kCPU);
  io::SafetensorsFile mapped;
  {
    memory::Tag tag("mapped-test");
    mapped = io::map_safetensors(p);
  }
  const memory::Stats after = memory::stats(kCPU);
  EXPECT_EQ(after.allocated.current, before.allocated.current);  // no tensor byte was copied
  EXPECT_EQ(after.mapped.current, before.mapped.current + file_bytes);
  EXPECT_EQ(after.footprint.current, after.allocated.current + after.mapped.current);
  int64_t tagged = -1;
  for (const auto& t : memory::tag_stats(kCPU))
    if (t.tag == "mapped-test") tagged = t.mapped.current;
  EXPECT_EQ(tagged, file_bytes);

  EXPECT_EQ(mapped.metadata, loaded.metadata);
  EXPECT_EQ(mapped.int8_names, loaded.int8_names);
  ASSERT_EQ(mapped.tensors.size(), loaded.tensors.size());
  for (const auto& [name, t] : loaded.tensors) {
    SCOPED_TRACE(name);
    const Tensor& m = mapped.tensors.at(name);
    EXPECT_EQ(m.dtype(), t.dtype());
    EXPECT_EQ(m.shape(), t.shape());
    EXPECT_FALSE(m.is_writable());
    EXPECT_EQ(bytes_of(m), bytes_of(t));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m.raw_data()) % uintptr_t(dtype_size(m.dtype())), 0u);
  }
  // Ops read them as any tensor; results are ordinary arena tensors.
  const Tensor sum = mapped.tensors.at("a.weight").sum();
  EXPECT_EQ(sum.item<float>(), loaded.tensors.at("a.weight").sum().item<float>());
  EXPECT_TRUE(sum.is_writable());

  // The mapping lives while one view does, and its bytes with it.
  const Tensor keep = mapped.tensors.at("b.bias").narrow(0, 1, 2);
  mapped = {};
  EXPECT_EQ(memory::stats(kCPU).mapped.current, before.mapped.current + file_bytes);
  EXPECT_EQ(keep.to_vector<double>()[0], loaded.tensors.at("b.bias").to_vector<double>()[1]);
  memory::allocator(kCPU).check_invariants();
}

TEST_F(MapSafetensorsTest, TheBytesGoWithTheLastViewAndTheSummaryShowsThem) {
  const std::string p = path("m.safetensors");
  io::save_safetensors(p, sample());
  const int64_t before = memory::stats(kCPU).mapped.current;
  {
    const Tensor w = io::map_safetensors(p).tensors.at("a.weight");
    EXPECT_GT(memory::stats(kCPU).mapped.current, before);
    const std::string summary = memory::memory_summary(kCPU);
    EXPECT_NE(summary.find("mapped (files)"), std::string::npos) << summary;
  }
  EXPECT_EQ(memory::stats(kCPU).mapped.current, before);
  memory::allocator(kCPU).check_invariants();
}

TEST_F(MapSafetensorsTest, WritesIntoAMappedTensorAreErrors) {
  const std::string p = path("m.safetensors");
  io::save_safetensors(p, sample());
  io::SafetensorsFile f = io::map_safetensors(p);
  Tensor w = f.tensors.at("a.weight");
  const std::string original = bytes_of(w);
  expect_error<Error>([&] { w.fill_(1.0); }, {"fill_", "read-only mapped file", "clone()"});
  expect_error<Error>([&] { w.copy_(zeros({17, 5})); }, {"copy_", "read-only"});
  expect_error<Error>([&] { w.mul_(zeros({17, 5})); }, {"read-only"});
  expect_error<Error>([&] { w.relu_(); }, {"relu_", "read-only"});
  Tensor p2 = io::map_safetensors(p).tensors.at("a.weight");  // its own handle, to train
  p2.requires_grad_();
  (p2 * p2).sum().backward();
  optim::SGD sgd({p2}, optim::SGDOptions(0.1));
  expect_error<Error>([&] { sgd.step(); }, {"step", "read-only"});
  EXPECT_EQ(bytes_of(w), original);
  // A clone is an ordinary tensor.
  Tensor c = w.clone();
  c.fill_(2.0);
  EXPECT_EQ(c.sum().item<float>(), 2.0f * 85);
}

TEST_F(MapSafetensorsTest, CorruptOrTruncatedFilesAreRefusedBeforeAnyView) {
  const std::string p = path("m.safetensors");
  io::save_safetensors(p, sample());
  std::string full;
  {
    std::ifstream in(p, std::ios::binary);
    full.assign(std::istreambuf_iterator<char>(in), {});
  }
  const int64_t mapped_before = memory::stats(kCPU).mapped.current;
  for (size_t len : {size_t(0), size_t(3), size_t(8), size_t(20), full.size() / 2, full.size() - 1}) {
    SCOPED_TRACE(len);
    std::ofstream(p, std::ios::binary | std::ios::trunc).write(full.data(), std::streamsize(len));
    EXPECT_THROW(io::map_safetensors(p), Error);
    EXPECT_EQ(memory::stats(kCPU).mapped.current, mapped_before);
  }
  // A BOOL byte other than 0 or 1, and a header that lies about the data.
  std::string bad = full;
  const io::SafetensorsFile ok = [&] {
    std::ofstream(p, std::ios::binary | std::ios::trunc).write(full.data(), std::streamsize(full.size()));
    return io::load_safetensors(p);
  }();
  bad[bad.size() - 1] = 7;  // the last tensor in the layout is the BOOL one
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bad.data(), std::streamsize(bad.size()));
  expect_error<Error>([&] { io::map_safetensors(p); }, {"map_safetensors", "BOOL", "byte 7"});
  EXPECT_EQ(memory::stats(kCPU).mapped.current, mapped_before);
  expect_error<Error>([&] { io::map_safetensors(path("missing.safetensors")); },
                      {"map_safetensors", "cannot open"});
  expect_error<Error>([&] { io::map_safetensors(dir_.string()); }, {"map_safetensors", "not a file"});
}

}  // namespace
}  // namespace frugal

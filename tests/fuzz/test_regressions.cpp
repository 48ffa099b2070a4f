// The fuzz targets (tests/fuzz/targets.h) over every regression file (tests/fuzz/regressions/<target>/:
// inputs that once crashed or fooled a reader), over the seeds frugal writes, and over hostile inputs too big
// to keep as files. A target may accept or refuse its input; this program failing means a reader crashed,
// read out of bounds (under the sanitizers) or threw something other than frugal::Error.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/targets.h"

namespace frugal::fuzz {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void run_bytes(const Target& t, const std::string& bytes, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_NO_THROW(t.run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

class FuzzRegressions : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzRegressions, EveryRegressionFileAndSeedGoesThroughItsTarget) {
  const Target& t = target(GetParam());
  const fs::path regressions = fs::path(FRUGAL_FUZZ_DIR) / "regressions" / t.name;
  int files = 0;
  if (fs::is_directory(regressions))
    for (const auto& entry : fs::directory_iterator(regressions)) {
      run_bytes(t, read_file(entry.path()), entry.path().string());
      ++files;
    }
  const fs::path seeds = fs::temp_directory_path() / ("frugal-fuzz-seeds-" + std::to_string(::getpid()));
  fs::create_directories(seeds);
  t.write_seeds(seeds.string());
  int seeded = 0;
  for (const auto& entry : fs::directory_iterator(seeds)) {
    run_bytes(t, read_file(entry.path()), "seed " + entry.path().filename().string());
    ++seeded;
  }
  fs::remove_all(seeds);
  EXPECT_GT(seeded, 0) << t.name << " writes no seeds";
  EXPECT_GT(files, 0) << "no regression files for " << t.name;
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzRegressions,
                         ::testing::Values("safetensors", "idx", "text", "byte_count", "checkpoint", "ops",
                                           "kernels"),
                         [](const auto& info) { return info.param; });

// A safetensors header whose shape, offsets or metadata nest 100,000 deep: the reader must refuse it without
// recursing per level (it once overflowed the stack while quoting the value in its message).
TEST(FuzzRegressions, DeeplyNestedSafetensorsHeaders) {
  const Target& t = target("safetensors");
  constexpr size_t kDepth = 100000;
  const std::string open(kDepth, '['), close(kDepth, ']'), objects = [] {
    std::string s;
    for (size_t i = 0; i < kDepth; ++i) s += "{\"a\":";
    return s + "1" + std::string(kDepth, '}');
  }();
  for (const std::string& header :
       {"{\"x\":{\"dtype\":\"F32\",\"shape\":" + open + close + ",\"data_offsets\":[0,0]}}",
        "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":" + open + close + "}}",
        "{\"__metadata__\":" + objects + "}", open + close}) {
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[size_t(i)] = char((uint64_t(header.size()) >> (8 * i)) & 0xff);
    run_bytes(t, file + header, "nested header of " + std::to_string(header.size()) + " bytes");
  }
}

}  // namespace
}  // namespace frugal::fuzz

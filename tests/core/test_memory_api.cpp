// Tests of the memory API over the device allocators (core/memory_api.cpp, core/storage.cpp): storage, peaks,
// the summary table, the allocator registry, FRUGAL_ALLOCATOR and the errors. The arena's own algorithm is
// tested in test_memory.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "core/storage.h"

namespace frugal {
namespace {

using memory::Allocation;
using memory::Allocator;

constexpr int64_t kKiB = 1024, kMiB = 1024 * kKiB;

// Storage draws from the device's registered allocator and gives its block back.
TEST(Memory, StorageAllocatesFromTheDeviceAllocator) {
  const auto before = memory::stats(kCPU);
  {
    Storage st(1000, kCPU);
    ASSERT_NE(st.data(), nullptr);
    std::memset(st.data(), 1, 1000);
    EXPECT_EQ(st.nbytes(), 1000);
    EXPECT_EQ(memory::stats(kCPU).requested.current, before.requested.current + 1000);
  }
  EXPECT_EQ(memory::stats(kCPU).requested.current, before.requested.current);
  memory::allocator(kCPU).check_invariants();
}

// memory::reset_peak(device) resets the device's peaks and its per-tag peaks.
TEST(Memory, ResetPeakOfADeviceResetsTagPeaksToo) {
  {
    memory::Tag t("reset_peak_probe");
    Storage st(3 * kMiB, kCPU);
  }
  auto probe = [] {
    for (const auto& t : memory::tag_stats(kCPU))
      if (t.tag == "reset_peak_probe") return t.allocated;
    ADD_FAILURE() << "tag missing";
    return memory::Stat{};
  };
  EXPECT_EQ(probe().peak, 3 * kMiB);
  EXPECT_GE(memory::stats(kCPU).allocated.peak, 3 * kMiB);
  memory::reset_peak(kCPU);
  const auto s = memory::stats(kCPU);
  EXPECT_EQ(s.allocated.peak, s.allocated.current);
  EXPECT_EQ(s.requested.peak, s.requested.current);
  EXPECT_EQ(probe().current, 0);
  EXPECT_EQ(probe().peak, 0);
}

// (i) format_bytes and the summary table.
TEST(Memory, FormatBytes) {
  EXPECT_EQ(memory::format_bytes(0), "0 B");
  EXPECT_EQ(memory::format_bytes(512), "512 B");
  EXPECT_EQ(memory::format_bytes(1023), "1023 B");
  EXPECT_EQ(memory::format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(memory::format_bytes(3 * kMiB), "3.00 MiB");
  EXPECT_EQ(memory::format_bytes(2 * 1024 * kMiB), "2.00 GiB");
  EXPECT_EQ(memory::format_bytes(int64_t(3) << 40), "3.00 TiB");
}

TEST(Memory, SummaryHasEveryRow) {
  Allocator& cpu = memory::allocator(kCPU);
  Allocation big, small;
  {
    memory::Tag t("summary_big");
    big = cpu.allocate(5 * kMiB);
  }
  {
    memory::Tag t("summary_small");
    small = cpu.allocate(1000);
  }
  const std::string s = memory::memory_summary(kCPU);
  for (const char* row : {"cpu", "limit", "requested", "allocated", "reserved", "active blocks", "segments",
                          "allocs", "frees", "segment allocs", "segment frees", "cache flushes", "OOMs",
                          "largest free block", "fragmentation", "live bytes by tag", "current", "peak"})
    EXPECT_NE(s.find(row), std::string::npos) << "no '" << row << "' in\n" << s;
  EXPECT_NE(s.find(cpu.kind()), std::string::npos) << s;
  EXPECT_NE(s.find("5.00 MiB"), std::string::npos) << s;
  // Sorted by peak, biggest first.
  ASSERT_NE(s.find("summary_big"), std::string::npos) << s;
  ASSERT_NE(s.find("summary_small"), std::string::npos) << s;
  EXPECT_LT(s.find("summary_big"), s.find("summary_small")) << s;
  cpu.deallocate(big.block);
  cpu.deallocate(small.block);
}

// (j) One allocator per device, for every thread; FRUGAL_ALLOCATOR's values.
TEST(Memory, DeviceAllocatorIsASingleton) {
  Allocator* here = &memory::allocator(kCPU);
  Allocator* there = nullptr;
  std::thread([&] { there = &memory::allocator(kCPU); }).join();
  EXPECT_EQ(here, &memory::allocator(kCPU));
  EXPECT_EQ(here, there);
  memory::set_memory_limit(kCPU, 123 * kMiB);
  EXPECT_EQ(memory::memory_limit(kCPU), 123 * kMiB);
  memory::set_memory_limit(kCPU, 0);
  EXPECT_EQ(memory::memory_limit(kCPU), 0);
  // Too late to swap the CPU backing: the allocator exists.
  EXPECT_THROW(memory::register_backing(DeviceType::CPU, [](int) { return memory::make_host_backing(); }),
               Error);
}

TEST(Memory, AllocatorKindFromEnvironment) {
  EXPECT_STREQ(detail::allocator_kind_from_env(nullptr), "arena");
  EXPECT_STREQ(detail::allocator_kind_from_env(""), "arena");
  EXPECT_STREQ(detail::allocator_kind_from_env("arena"), "arena");
  EXPECT_STREQ(detail::allocator_kind_from_env("system"), "system");
  try {
    detail::allocator_kind_from_env("cudaMalloc");
    FAIL() << "expected Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("FRUGAL_ALLOCATOR='cudaMalloc'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'arena'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'system'"), std::string::npos) << msg;
  }
}

// (k) Without a CUDA backend or without a GPU, asking for a GPU allocator is a clear DeviceError that says
// which of the two it is.
TEST(Memory, CudaAllocatorWithoutBackendIsADeviceError) {
  if (cuda_is_available()) GTEST_SKIP() << "this machine has a GPU";
  try {
    memory::allocator(cuda(0));
    FAIL() << "expected DeviceError";
  } catch (const DeviceError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("no allocator for cuda:0: "), std::string::npos) << msg;
#ifdef FRUGAL_HAVE_CUDA
    EXPECT_NE(msg.find("the CUDA backend is loaded but no GPU answers"), std::string::npos) << msg;
#else
    EXPECT_NE(msg.find("frugal was built without CUDA"), std::string::npos) << msg;
#endif
  }
  EXPECT_THROW(memory::allocator(Device(DeviceType::CUDA, 5000)), DeviceError);
}

// The internal assertion says it is a bug, and where.
TEST(Memory, InternalErrorNamesTheBugAndPlace) {
  try {
    FRUGAL_ASSERT(1 + 1 == 3, "arithmetic is off by ", 1);
    FAIL() << "expected InternalError";
  } catch (const InternalError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("internal error (a bug in frugal): 1 + 1 == 3 failed at "), std::string::npos) << msg;
    EXPECT_NE(msg.find("test_memory_api.cpp:"), std::string::npos) << msg;
    EXPECT_NE(msg.find(": arithmetic is off by 1"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace frugal

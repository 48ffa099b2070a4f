// memory::parse_bytes (core/byte_count.cpp): what it reads, exactly, and what it refuses with a clear error.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "core/memory.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

constexpr int64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024, kTiB = kGiB * 1024;

TEST(ByteCount, ReadsWholeAndDecimalNumbersWithBinaryUnits) {
  EXPECT_EQ(memory::parse_bytes("1"), 1);
  EXPECT_EQ(memory::parse_bytes("1000"), 1000);
  EXPECT_EQ(memory::parse_bytes("1000B"), 1000);
  EXPECT_EQ(memory::parse_bytes("512K"), 512 * kKiB);
  EXPECT_EQ(memory::parse_bytes("512k"), 512 * kKiB);
  EXPECT_EQ(memory::parse_bytes("512KiB"), 512 * kKiB);
  EXPECT_EQ(memory::parse_bytes("64M"), 64 * kMiB);
  EXPECT_EQ(memory::parse_bytes("64MiB"), 64 * kMiB);
  EXPECT_EQ(memory::parse_bytes("1.5G"), 3 * kGiB / 2);
  EXPECT_EQ(memory::parse_bytes("2g"), 2 * kGiB);
  EXPECT_EQ(memory::parse_bytes("3T"), 3 * kTiB);
  EXPECT_EQ(memory::parse_bytes(".5K"), 512);
  EXPECT_EQ(memory::parse_bytes("1.K"), 1024);
  EXPECT_EQ(memory::parse_bytes("007M"), 7 * kMiB);
  // Exact, where a double would round: 2^63 - 1 and a fraction of a huge count.
  EXPECT_EQ(memory::parse_bytes("9223372036854775807"), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(memory::parse_bytes("8388607.99999999999999999999T"), int64_t(8388607) * kTiB + (kTiB - 1));
  EXPECT_EQ(memory::parse_bytes("1.0009765625K"), 1025);  // 1024 * (1 + 2^-10)
  EXPECT_EQ(memory::parse_bytes("1.3G"), 1395864371);     // 1.3 * 2^30 = 1395864371.2: fractions round down
  EXPECT_EQ(memory::parse_bytes("1.9"), 1);
}

TEST(ByteCount, RefusesWhatIsNotAPositiveRepresentableCount) {
  // Each was once read as 0 ("no limit"), as a silently wrong number, or through undefined behaviour.
  for (const char* bad : {"",
                          "0",
                          "0.5",
                          "0.0M",
                          "1e-300",
                          "1e9",
                          "-5",
                          "-1M",
                          "+5",
                          "inf",
                          "nan",
                          "0x10",
                          " 5",
                          "5 ",
                          "5 M",
                          "10MB",
                          "10Mi",
                          "1,5G",
                          "1.5.5",
                          ".",
                          "K",
                          "M1",
                          "9999999999G",
                          "9223372036854775808",
                          "8388608T",
                          "8388607.99999999999999999999999T5",
                          "99999999999999999999999999999999"}) {
    SCOPED_TRACE(std::string("'") + bad + "'");
    try {
      const int64_t got = memory::parse_bytes(bad);
      ADD_FAILURE() << "read as " << got;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("as a byte count"), std::string::npos) << msg;
      EXPECT_NE(msg.find("e.g. 512M"), std::string::npos) << msg;
    }
  }
}

TEST(ByteCount, QuotesOnlyAPrefixOfALongText) {
  const std::string text(100000, '9');
  try {
    memory::parse_bytes(text);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_LT(msg.size(), 400u) << msg;
    EXPECT_NE(msg.find("beyond 2^63 - 1 bytes"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace frugal

// The 8-bit codes of optim::Adam8bit's moments: the dynamic code (its entries, the round trip's error, the
// CPU's bucket search and block quantiser against a scan of every entry) and the float8 codes (their values
// and rounding against their definition, and the CPU kernel's block encoder). The kernel and the optimizer
// that use them: test_adam8bit.cpp.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "frugal.h"
#include "kernels/cpu/reference.h"
#include "kernels/dynamic_code.h"
#include "kernels/float8_code.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

TEST(DynamicCode, EntriesAreBitsandbytesDynamicMap) {
  const auto& s = dynamic_code::signed_code();
  const auto& u = dynamic_code::unsigned_code();
  for (int k = 1; k < 256; ++k) {
    EXPECT_LT(s.value[k - 1], s.value[k]) << k;
    EXPECT_LT(u.value[k - 1], u.value[k]) << k;
  }
  EXPECT_EQ(s.zero, 127);
  EXPECT_EQ(s.value[127], 0.0f);
  EXPECT_EQ(s.value[255], 1.0f);
  EXPECT_FLOAT_EQ(s.value[0], -(0.1f + 0.9f * 63.5f / 64));  // -(the last mean of linspace(0.1, 1, 65))
  EXPECT_FLOAT_EQ(s.value[128], 5.5e-7f);                    // 1e-6 x mean(linspace(0.1, 1, 2))
  EXPECT_EQ(u.zero, 0);
  EXPECT_EQ(u.value[0], 0.0f);
  EXPECT_EQ(u.value[255], 1.0f);
  EXPECT_FLOAT_EQ(u.value[1], 3.25e-7f);  // 1e-6 x the first mean of linspace(0.1, 1, 3)
  EXPECT_FLOAT_EQ(u.value[254], 1.0f - 0.9f / 256);
}

// Values over every magnitude the moments take, both signs, every entry, every threshold and its float
// neighbours, and the special values.
std::vector<float> values_to_quantise() {
  std::vector<float> qs = {0.0f,
                           -0.0f,
                           1.0f,
                           -1.0f,
                           2.0f,
                           -2.0f,
                           1e-30f,
                           -1e-30f,
                           1e-45f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::max()};
  Generator g(7);
  const std::vector<double> r = rand({200000}, DType::F64, &g).to_vector<double>();
  for (size_t i = 0; i < r.size(); ++i) {
    const double magnitude = std::pow(10.0, -9.0 + 9.5 * r[i]);  // 1e-9 .. 3
    qs.push_back(float(i % 2 ? magnitude : -magnitude));
  }
  for (bool is_signed : {true, false}) {
    const auto& c = is_signed ? dynamic_code::signed_code() : dynamic_code::unsigned_code();
    for (int k = 0; k < 256; ++k) qs.push_back(c.value[k]);
    for (int side = 0; side < 2; ++side)
      for (int k = 0; k + 1 < c.count[side]; ++k) {
        // The threshold and the 8 floats on either side (the comparison the kernels' last step decides).
        float below = c.threshold[side][k], above = below;
        qs.push_back(side ? -below : below);
        for (int ulps = 0; ulps < 8; ++ulps) {
          below = std::nextafter(below, 0.0f);
          above = std::nextafter(above, 2.0f);
          for (float q : {below, above}) qs.push_back(side ? -q : q);
        }
      }
  }
  return qs;
}

// On values_to_quantise(): the CPU's bucket search, the GPU's binary search and the naive scan of all 256
// entries agree on every one.
TEST(DynamicCode, BucketSearchEqualsTheScanOfEveryEntry) {
  const std::vector<float> qs = values_to_quantise();
  int64_t checked = 0;
  for (bool is_signed : {true, false}) {
    const auto& c = is_signed ? dynamic_code::signed_code() : dynamic_code::unsigned_code();
    for (float q : qs) {
      const uint8_t want = dynamic_code_quantize_reference(is_signed, q);
      ASSERT_EQ(dynamic_code_quantize_cpu(is_signed, q), want)
          << (is_signed ? "signed" : "unsigned") << " " << q;
      ASSERT_EQ(dynamic_code::quantize(c, q), want) << (is_signed ? "signed" : "unsigned") << " " << q;
      ++checked;
    }
  }
  std::printf("dynamic code: %lld values, bucket search == binary search == scan of all entries\n",
              static_cast<long long>(checked));
}

// The kernel's block quantiser (with AVX2, 32 values at a time and the rest one by one) on the same values:
// the same codes as the scan of all 256 entries.
TEST(DynamicCode, BlockQuantiserEqualsTheScan) {
  const std::vector<float> qs = values_to_quantise();
  for (bool is_signed : {true, false}) {
    std::vector<uint8_t> codes(qs.size());
    dynamic_code_quantize_block_cpu(is_signed, qs.data(), codes.data(), int64_t(qs.size()));
    for (size_t i = 0; i < qs.size(); ++i)
      ASSERT_EQ(codes[i], dynamic_code_quantize_reference(is_signed, qs[i]))
          << (is_signed ? "signed" : "unsigned") << " " << qs[i] << " at " << i;
  }
}

// The block quantiser on floats spread over every bit pattern (one in 65521, both signs, NaNs and infinities
// included) and beside every power of two (where the AVX-512 quantiser's octaves change): the same codes as
// the bucket search, which the tests above hold to the scan. (Every one of the 2^32 patterns was compared
// once by hand, on Zen 4, with no difference.)
TEST(DynamicCode, BlockQuantiserEqualsTheBucketsOnEveryOctave) {
  std::vector<float> qs;
  for (uint64_t bits = 0; bits < (uint64_t(1) << 32); bits += 65521)
    qs.push_back(std::bit_cast<float>(uint32_t(bits)));
  for (int e = -30; e <= 8; ++e) {
    float below = std::ldexp(1.0f, e), above = below;
    for (int ulps = 0; ulps < 4;
         ++ulps, below = std::nextafter(below, 0.0f), above = std::nextafter(above, 8.0f))
      for (float q : {below, above, -below, -above}) qs.push_back(q);
  }
  for (bool is_signed : {true, false}) {
    std::vector<uint8_t> codes(qs.size());
    dynamic_code_quantize_block_cpu(is_signed, qs.data(), codes.data(), int64_t(qs.size()));
    for (size_t i = 0; i < qs.size(); ++i)
      ASSERT_EQ(codes[i], dynamic_code_quantize_cpu(is_signed, qs[i]))
          << (is_signed ? "signed" : "unsigned") << " " << qs[i] << " (bits "
          << std::bit_cast<uint32_t>(qs[i]) << ") at " << i;
  }
}

// The round trip q -> code -> value is off by at most half the spacing of the decade q lies in (the
// spacing of [0.1, 1] x 10^-d is 0.9 x 10^-d / items), and by at most the smallest entry below 1e-7.
TEST(DynamicCode, RoundTripErrorIsHalfTheSpacingOfItsDecade) {
  Generator g(8);
  const std::vector<double> r = rand({100000}, DType::F64, &g).to_vector<double>();
  for (bool is_signed : {true, false}) {
    const auto& c = is_signed ? dynamic_code::signed_code() : dynamic_code::unsigned_code();
    double worst_ratio = 0, sum_rel = 0;
    int64_t rel_count = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      const double magnitude = std::pow(10.0, -7.0 * r[i]);  // 1e-7 .. 1
      const float q = float(is_signed && i % 2 ? -magnitude : magnitude);
      const double back = c.value[dynamic_code::quantize(c, q)];
      const double err = std::fabs(back - double(q));
      const int decade = std::min(6, int(std::floor(std::log10(magnitude) + 7)));  // 6: [0.1, 1]
      const int items = is_signed ? 1 << decade : 1 << (decade + 1);
      // The first and last entries of a decade lie half a spacing inside it, so its ends are that near too.
      const double bound = 0.5 * 0.9 * std::pow(10.0, decade - 6) / items * (1 + 1e-6) + 1e-13;
      worst_ratio = std::max(worst_ratio, err / bound);
      ASSERT_LE(err, bound) << q << " -> " << back;
      if (magnitude > 1e-3) sum_rel += err / magnitude, ++rel_count;
    }
    std::printf(
        "%s dynamic code round trip over [1e-7, 1]: worst error %.2f of the bound, mean relative "
        "error above 1e-3 %.4f\n",
        is_signed ? "signed" : "unsigned", worst_ratio, sum_rel / double(rel_count));
  }
}

// Every byte of both float8 codes decodes to its definition's value (kernels/float8_code.h), -0 included;
// the magnitudes ascend and end at 1.875 (E4M3) and 1.9375 (E4M4).
TEST(Float8Code, EveryCodeDecodesToItsDefinition) {
  for (int k = 0; k < 256; ++k) {
    const auto code = uint8_t(k);
    EXPECT_EQ(std::bit_cast<uint32_t>(float8_code::decode_signed(code)),
              std::bit_cast<uint32_t>(float(float8_code_decode_reference(true, code))))
        << "signed " << k;
    EXPECT_EQ(float8_code::decode_unsigned(code), float(float8_code_decode_reference(false, code)))
        << "unsigned " << k;
    if (k > 0 && k != 128) {
      EXPECT_LT(float8_code::decode_unsigned(uint8_t(k - 1)), float8_code::decode_unsigned(code));
      EXPECT_LT(std::fabs(float8_code::decode_signed(uint8_t(k - 1))),
                std::fabs(float8_code::decode_signed(code)))
          << k;
    }
  }
  EXPECT_EQ(float8_code::decode_signed(0x7f), 1.875f);
  EXPECT_EQ(float8_code::decode_signed(0xff), -1.875f);
  EXPECT_EQ(float8_code::decode_signed(0x01), std::ldexp(1.0f, -17));  // the smallest subnormal
  EXPECT_EQ(float8_code::decode_signed(0x08), std::ldexp(1.0f, -14));  // the smallest normal
  EXPECT_EQ(float8_code::decode_unsigned(0xff), 1.9375f);
  EXPECT_EQ(float8_code::decode_unsigned(0x01), std::ldexp(1.0f, -18));
  EXPECT_EQ(float8_code::decode_signed(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(float8_code::decode_signed(0x80)));
}

// Values for the float8 codes: every code's value, the midpoints between neighbours (where the tie rule
// decides) and the 4 floats on either side of each, magnitudes from 1e-9 to 3 of both signs, floats spread
// over every bit pattern (one in 65521), and the special values.
std::vector<float> values_to_encode() {
  std::vector<float> qs = {0.0f,
                           -0.0f,
                           2.0f,
                           -2.0f,
                           1e-45f,
                           -1e-45f,
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::quiet_NaN()};
  for (int k = 0; k < 256; ++k)
    for (bool is_signed : {true, false}) {
      const double value = float8_code_decode_reference(is_signed, uint8_t(k));
      const double next =
          float8_code_decode_reference(is_signed, uint8_t(k + 1 == 256 || k == 127 ? k : k + 1));
      for (double x : {value, (value + next) / 2}) {
        float below = float(x), above = below;
        for (int ulps = 0; ulps <= 4;
             ++ulps, below = std::nextafter(below, 0.0f), above = std::nextafter(above, 4.0f))
          for (float q : {below, above}) qs.push_back(q), qs.push_back(-q);
      }
    }
  Generator g(9);
  const std::vector<double> r = rand({100000}, DType::F64, &g).to_vector<double>();
  for (size_t i = 0; i < r.size(); ++i) {
    const double magnitude = std::pow(10.0, -9.0 + 9.5 * r[i]);
    qs.push_back(float(i % 2 ? magnitude : -magnitude));
  }
  for (uint64_t bits = 0; bits < (uint64_t(1) << 32); bits += 65521)
    qs.push_back(std::bit_cast<float>(uint32_t(bits)));
  return qs;
}

// float8_code's encoders (integer rounding, the subnormals' add) give the nearest code by the scan of every
// code, ties to the even one; the CPU kernel's block encoder (AVX-512 or AVX2 where built) gives the same
// codes, in vectors that mix every kind of value (where it takes its general path) and in vectors of normal
// codes only (Note [encoding normal codes]), sorted by magnitude so that each run of normal values fills
// whole vectors, inf and values beyond the top among them.
TEST(Float8Code, EncodingIsTheNearestCodeAndTheBlockEncoderAgrees) {
  const std::vector<float> qs = values_to_encode();
  for (float q : qs) {
    ASSERT_EQ(float8_code::encode_signed(q), float8_code_encode_reference(true, q)) << "signed " << q;
    ASSERT_EQ(float8_code::encode_unsigned(q), float8_code_encode_reference(false, q)) << "unsigned " << q;
  }
  std::vector<uint8_t> signed_codes(qs.size()), unsigned_codes(qs.size());
  float8_code_encode_block_cpu(qs.data(), signed_codes.data(), qs.data(), unsigned_codes.data(),
                               int64_t(qs.size()));
  for (size_t i = 0; i < qs.size(); ++i) {
    ASSERT_EQ(signed_codes[i], float8_code::encode_signed(qs[i])) << "signed " << qs[i] << " at " << i;
    ASSERT_EQ(unsigned_codes[i], float8_code::encode_unsigned(qs[i])) << "unsigned " << qs[i] << " at " << i;
  }
  std::vector<float> magnitudes;
  for (float q : qs)
    if (!std::isnan(q)) magnitudes.push_back(std::fabs(q));
  std::sort(magnitudes.begin(), magnitudes.end());
  std::vector<float> with_signs(magnitudes);
  for (size_t i = 0; i < with_signs.size(); i += 3) with_signs[i] = -with_signs[i];
  const int64_t n = int64_t(magnitudes.size());
  float8_code_encode_block_cpu(with_signs.data(), signed_codes.data(), magnitudes.data(),
                               unsigned_codes.data(), n);
  int64_t normal = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(signed_codes[size_t(i)], float8_code::encode_signed(with_signs[size_t(i)]))
        << "signed " << with_signs[size_t(i)] << " at " << i;
    ASSERT_EQ(unsigned_codes[size_t(i)], float8_code::encode_unsigned(magnitudes[size_t(i)]))
        << "unsigned " << magnitudes[size_t(i)] << " at " << i;
    normal += magnitudes[size_t(i)] >= 0x1p-14f;
  }
  EXPECT_GT(normal, n / 4);  // enough whole vectors of normal codes, up to inf
  EXPECT_EQ(magnitudes.back(), std::numeric_limits<float>::infinity());
  // The rules at the edges: NaN, and for the unsigned code every q <= 0, to 0; inf and beyond the top to the
  // top; -0 keeps its sign.
  EXPECT_EQ(float8_code::encode_signed(std::nanf("")), 0);
  EXPECT_EQ(float8_code::encode_unsigned(-1.0f), 0);
  EXPECT_EQ(float8_code::encode_signed(-std::numeric_limits<float>::infinity()), 0xff);
  EXPECT_EQ(float8_code::encode_unsigned(3.0f), 0xff);
  EXPECT_EQ(float8_code::encode_signed(-0.0f), 0x80);
  std::printf("float8 codes: %zu values, the encoders == the scan of every code\n", qs.size());
}

}  // namespace
}  // namespace frugal

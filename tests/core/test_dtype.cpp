// Tests of dtypes (core/dtype.h) and the 16-bit float types (core/half.h). The conversions are checked
// against references written from the IEEE definitions: decode with std::ldexp, round by picking the nearest
// of the two neighbouring representable values in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"

namespace frugal {
namespace {

constexpr DType kAll[kNumDTypes] = {DType::F32, DType::F64, DType::F16, DType::BF16,
                                    DType::I64, DType::I32, DType::U8,  DType::Bool};

TEST(DType, NamesSizesAndKinds) {
  struct Row {
    DType t;
    const char* name;
    int64_t size;
    bool floating, integral;
  };
  const Row rows[] = {{DType::F32, "f32", 4, true, false}, {DType::F64, "f64", 8, true, false},
                      {DType::F16, "f16", 2, true, false}, {DType::BF16, "bf16", 2, true, false},
                      {DType::I64, "i64", 8, false, true}, {DType::I32, "i32", 4, false, true},
                      {DType::U8, "u8", 1, false, true},   {DType::Bool, "bool", 1, false, false}};
  for (const Row& r : rows) {
    EXPECT_STREQ(dtype_name(r.t), r.name);
    EXPECT_EQ(dtype_size(r.t), r.size) << r.name;
    EXPECT_EQ(is_floating(r.t), r.floating) << r.name;
    EXPECT_EQ(is_integral(r.t), r.integral) << r.name;
    std::ostringstream os;
    os << r.t;
    EXPECT_EQ(os.str(), r.name);
    EXPECT_EQ(dtype_from_name(r.name), r.t);
  }
}

TEST(DType, CppTypesMatchDTypes) {
  static_assert(dtype_v<float> == DType::F32 && dtype_v<double> == DType::F64);
  static_assert(dtype_v<Half> == DType::F16 && dtype_v<BFloat16> == DType::BF16);
  static_assert(dtype_v<int64_t> == DType::I64 && dtype_v<int32_t> == DType::I32);
  static_assert(dtype_v<uint8_t> == DType::U8 && dtype_v<bool> == DType::Bool);
  static_assert(std::is_same_v<acc_t<Half>, float> && std::is_same_v<acc_t<BFloat16>, float>);
  static_assert(std::is_same_v<acc_t<double>, double> && std::is_same_v<acc_t<int32_t>, int32_t>);
  for (DType t : kAll) {
    visit_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      EXPECT_EQ(dtype_v<T>, t) << dtype_name(t);
      EXPECT_EQ(int64_t(sizeof(T)), dtype_size(t)) << dtype_name(t);
    });
  }
}

TEST(DType, VisitFloatingDtypeTakesTheFourFloatsAndRefusesTheRest) {
  for (DType t : kAll) {
    if (is_floating(t)) {
      int calls = 0;
      visit_floating_dtype(t, "visit", [&](auto tag) {
        EXPECT_EQ(dtype_v<decltype(tag)>, t) << dtype_name(t);
        ++calls;
      });
      EXPECT_EQ(calls, 1) << dtype_name(t);
      continue;
    }
    try {
      visit_floating_dtype(t, "layer_norm x-hat", [](auto) { FAIL() << "called for a non-floating dtype"; });
      ADD_FAILURE() << "no error for " << dtype_name(t);
    } catch (const DTypeError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("layer_norm x-hat"), std::string::npos) << what;
      EXPECT_NE(what.find(dtype_name(t)), std::string::npos) << what;
    }
  }
}

TEST(DType, NameAliases) {
  const std::pair<const char*, DType> aliases[] = {
      {"float32", DType::F32}, {"float", DType::F32}, {"float64", DType::F64},   {"double", DType::F64},
      {"float16", DType::F16}, {"half", DType::F16},  {"bfloat16", DType::BF16}, {"int64", DType::I64},
      {"int32", DType::I32},   {"uint8", DType::U8},  {"bool", DType::Bool}};
  for (const auto& [name, t] : aliases) EXPECT_EQ(dtype_from_name(name), t) << name;
}

TEST(DType, UnknownNameThrowsDTypeErrorListingValidNames) {
  for (const char* bad : {"f8", "Float32", "", "int", "f32 "}) {
    try {
      dtype_from_name(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const std::exception& e) {
      EXPECT_EQ(typeid(e), typeid(DTypeError));
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'" + std::string(bad) + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("f32, f64, f16, bf16, i64, i32, u8, bool"), std::string::npos) << msg;
    }
  }
}

// The promotion table written out by hand (row = a, column = b) in enum order F32 F64 F16 BF16 I64 I32 U8
// Bool.
TEST(DType, PromoteTypesAllPairs) {
  constexpr DType f = DType::F32, d = DType::F64, h = DType::F16, b = DType::BF16, l = DType::I64,
                  i = DType::I32, u = DType::U8, o = DType::Bool;
  const DType expected[kNumDTypes][kNumDTypes] = {
      /* F32  */ {f, d, f, f, f, f, f, f},
      /* F64  */ {d, d, d, d, d, d, d, d},
      /* F16  */ {f, d, h, f, h, h, h, h},
      /* BF16 */ {f, d, f, b, b, b, b, b},
      /* I64  */ {f, d, h, b, l, l, l, l},
      /* I32  */ {f, d, h, b, l, i, i, i},
      /* U8   */ {f, d, h, b, l, i, u, u},
      /* Bool */ {f, d, h, b, l, i, u, o},
  };
  for (int r = 0; r < kNumDTypes; ++r)
    for (int c = 0; c < kNumDTypes; ++c)
      EXPECT_EQ(promote_types(kAll[r], kAll[c]), expected[r][c])
          << dtype_name(kAll[r]) << " with " << dtype_name(kAll[c]);
  EXPECT_EQ(promote_types(DType::F16, DType::BF16), DType::F32);
  EXPECT_EQ(promote_types(DType::BF16, DType::F16), DType::F32);
}

// ---- Half -------------------------------------------------------------------------------------------------

// IEEE binary16 from its fields: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
double half_reference(uint16_t bits) {
  const int sign = bits >> 15, exp = (bits >> 10) & 0x1f, man = bits & 0x3ff;
  double v;
  if (exp == 0x1f)
    v = man == 0 ? INFINITY : NAN;
  else if (exp == 0)
    v = std::ldexp(double(man), -24);  // subnormal: man * 2^(1 - 15 - 10)
  else
    v = std::ldexp(double(1024 + man), exp - 25);  // (1 + man / 2^10) * 2^(exp - 15)
  return sign ? -v : v;
}

// bfloat16 from its fields: 1 sign, 8 exponent (bias 127), 7 mantissa bits.
double bf16_reference(uint16_t bits) {
  const int sign = bits >> 15, exp = (bits >> 7) & 0xff, man = bits & 0x7f;
  double v;
  if (exp == 0xff)
    v = man == 0 ? INFINITY : NAN;
  else if (exp == 0)
    v = std::ldexp(double(man), -133);  // subnormal: man * 2^(1 - 127 - 7)
  else
    v = std::ldexp(double(128 + man), exp - 134);
  return sign ? -v : v;
}

// The bit pattern a correct float -> 16-bit conversion gives for x (not nan): the nearest of the two
// representable neighbours of |x|, ties to the even pattern, and values at or past the midpoint between the
// largest finite value and the next power of two (`overflow`) go to infinity. `positives` lists the
// non-negative finite values in bit-pattern order (pattern p has value positives[p]); inf is the pattern
// after the last one.
uint16_t round_reference(double x, const std::vector<double>& positives, double overflow) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  const uint16_t inf_pattern = uint16_t(positives.size());
  if (std::isinf(a)) return sign | inf_pattern;
  // lo: the largest representable value <= a.
  const size_t lo = size_t(std::upper_bound(positives.begin(), positives.end(), a) - positives.begin()) - 1;
  if (positives[lo] == a) return uint16_t(sign | lo);
  const double lo_v = positives[lo], hi_v = lo + 1 < positives.size() ? positives[lo + 1] : overflow;
  const double d_lo = a - lo_v, d_hi = hi_v - a;
  const size_t pick = d_lo < d_hi ? lo : d_hi < d_lo ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
  return uint16_t(sign | pick);  // pick == positives.size() is the inf pattern
}

std::vector<double> half_positives() {
  std::vector<double> v;
  for (uint32_t p = 0; p < 0x7c00; ++p) v.push_back(half_reference(uint16_t(p)));
  return v;
}
std::vector<double> bf16_positives() {
  std::vector<double> v;
  for (uint32_t p = 0; p < 0x7f80; ++p) v.push_back(bf16_reference(uint16_t(p)));
  return v;
}

bool same_float(float a, double ref) {
  if (std::isnan(ref)) return std::isnan(a);
  return double(a) == ref && std::signbit(a) == std::signbit(ref);
}

TEST(Half, AllBitPatternsDecodeLikeTheReference) {
  for (uint32_t p = 0; p < 0x10000; ++p) {
    const float f = Half::from_bits(uint16_t(p));
    ASSERT_TRUE(same_float(f, half_reference(uint16_t(p)))) << std::hex << "pattern 0x" << p << " gave " << f;
  }
  EXPECT_EQ(float(Half::from_bits(0x3c00)), 1.0f);
  EXPECT_EQ(float(Half::from_bits(0x7bff)), 65504.0f);
  EXPECT_EQ(float(Half::from_bits(0x0001)), std::ldexp(1.0f, -24));
  EXPECT_EQ(float(Half::from_bits(0xc000)), -2.0f);
}

TEST(Half, AllBitPatternsRoundTripThroughFloat) {
  for (uint32_t p = 0; p < 0x10000; ++p) {
    const uint16_t back = Half(float(Half::from_bits(uint16_t(p)))).bits;
    const bool is_nan = (p & 0x7c00) == 0x7c00 && (p & 0x3ff) != 0;
    if (is_nan) {
      ASSERT_TRUE((back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0) << std::hex << p << " -> " << back;
      ASSERT_EQ(back & 0x8000, p & 0x8000) << std::hex << p;
    } else {
      ASSERT_EQ(back, p) << std::hex << "pattern 0x" << p;
    }
  }
}

// Checks Half(f) against the reference; returns false (after one failure message) when they differ.
bool check_half(float f, const std::vector<double>& positives) {
  const uint16_t got = Half(f).bits;
  if (std::isnan(f)) {
    EXPECT_TRUE((got & 0x7c00) == 0x7c00 && (got & 0x3ff) != 0) << "nan became 0x" << std::hex << got;
    return !::testing::Test::HasFailure();
  }
  const uint16_t want = round_reference(f, positives, 65536.0);
  EXPECT_EQ(got, want) << std::hexfloat << f << " (" << std::defaultfloat << f << "): got 0x" << std::hex
                       << got << ", want 0x" << want;
  return got == want;
}

TEST(Half, RandomFloatsRoundToNearestEven) {
  const auto positives = half_positives();
  std::mt19937 rng(2024);
  for (int i = 0; i < 1000000; ++i) {
    // Bias the exponent towards the half range (including its subnormals, the overflow edge and zero) while
    // still drawing some arbitrary bit patterns (huge, tiny, inf and nan).
    uint32_t bits = rng();
    if (i % 4 != 0) bits = (bits & 0x807fffffu) | (uint32_t(96 + rng() % 50) << 23);  // 2^-31 .. 2^18
    float f;
    std::memcpy(&f, &bits, 4);
    if (!check_half(f, positives)) return;
  }
}

TEST(Half, MidpointsAndTheirNeighboursRoundCorrectly) {
  // Exact midpoints between consecutive halves are ties (they go to the even pattern); one float ulp either
  // side they are not. Covers every pair, including 65504/65536 (overflow at 65520) and the subnormals.
  const auto positives = half_positives();
  for (size_t p = 0; p < positives.size(); ++p) {
    const double next = p + 1 < positives.size() ? positives[p + 1] : 65536.0;
    const float mid = float((positives[p] + next) / 2);  // exact: a half midpoint needs at most 12 bits
    ASSERT_EQ(double(mid), (positives[p] + next) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      if (!check_half(f, positives) || !check_half(-f, positives)) return;
    }
  }
  EXPECT_EQ(Half(65519.99f).bits, 0x7bff);
  EXPECT_EQ(Half(65520.0f).bits, 0x7c00);
  EXPECT_EQ(Half(1e10f).bits, 0x7c00);
  EXPECT_EQ(Half(-INFINITY).bits, 0xfc00);
  EXPECT_EQ(Half(-0.0f).bits, 0x8000);
  EXPECT_EQ(Half(std::ldexp(1.0f, -25)).bits, 0x0000);  // half the smallest subnormal: tie to 0
  EXPECT_EQ(Half(std::nextafter(std::ldexp(1.0f, -25), 1.0f)).bits, 0x0001);
  EXPECT_EQ(Half(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);  // tie between 1 and 1 + 2^-10: to even (1)
}

// ---- BFloat16 ---------------------------------------------------------------------------------------------

TEST(BFloat16, AllBitPatternsDecodeLikeTheReference) {
  for (uint32_t p = 0; p < 0x10000; ++p) {
    const float f = BFloat16::from_bits(uint16_t(p));
    ASSERT_TRUE(same_float(f, bf16_reference(uint16_t(p)))) << std::hex << "pattern 0x" << p << " gave " << f;
  }
  EXPECT_EQ(float(BFloat16::from_bits(0x3f80)), 1.0f);
  EXPECT_EQ(float(BFloat16::from_bits(0xc0a0)), -5.0f);
}

bool check_bf16(float f, const std::vector<double>& positives) {
  const uint16_t got = BFloat16(f).bits;
  if (std::isnan(f)) {
    EXPECT_TRUE((got & 0x7f80) == 0x7f80 && (got & 0x7f) != 0) << "nan became 0x" << std::hex << got;
    return !::testing::Test::HasFailure();
  }
  const uint16_t want = round_reference(f, positives, std::ldexp(1.0, 128));
  EXPECT_EQ(got, want) << std::hexfloat << f << ": got 0x" << std::hex << got << ", want 0x" << want;
  return got == want;
}

TEST(BFloat16, RandomFloatsRoundToNearestEvenAndNanStaysNan) {
  const auto positives = bf16_positives();
  std::mt19937 rng(99);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t bits = rng();  // every exponent occurs, including subnormals, inf and nan
    float f;
    std::memcpy(&f, &bits, 4);
    if (!check_bf16(f, positives)) return;
  }
}

TEST(BFloat16, MidpointsAndTheirNeighboursRoundCorrectly) {
  const auto positives = bf16_positives();
  for (size_t p = 0; p < positives.size(); ++p) {
    const double next = p + 1 < positives.size() ? positives[p + 1] : std::ldexp(1.0, 128);
    const float mid = float((positives[p] + next) / 2);  // exact: a bf16 midpoint needs at most 9 bits
    ASSERT_EQ(double(mid), (positives[p] + next) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      if (!check_bf16(f, positives) || !check_bf16(-f, positives)) return;
    }
  }
  EXPECT_EQ(BFloat16(std::numeric_limits<float>::max()).bits, 0x7f80);  // rounds up to infinity
  EXPECT_EQ(BFloat16(-0.0f).bits, 0x8000);
  EXPECT_EQ(BFloat16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);      // tie: to even
  EXPECT_EQ(BFloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);  // tie: to even (up)
}

TEST(BFloat16, NanPatternsStayNan) {
  for (uint32_t man : {1u, 0x7fu, 0x8000u, 0x10000u, 0x400000u, 0x7fffffu}) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t bits = sign | 0x7f800000u | man;
      float f;
      std::memcpy(&f, &bits, 4);
      ASSERT_TRUE(std::isnan(f));
      const uint16_t b = BFloat16(f).bits;
      EXPECT_TRUE(std::isnan(float(BFloat16::from_bits(b)))) << std::hex << bits << " -> " << b;
      EXPECT_TRUE(std::isnan(float(Half(f)))) << std::hex << bits;
    }
  }
}

}  // namespace
}  // namespace frugal

// The run conversions f32 <-> f16 / bf16 (kernels/cpu/convert.h, vectorised where the build allows) bit for
// bit against core/half.h's scalar conversions: every 16-bit pattern, f32 patterns around every rounding
// boundary, NaN payloads, infinities, subnormals, ties; unaligned runs with tails; and the cast op over
// contiguous and strided tensors.
#include <cstring>

#include "kernels/cpu/convert.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

uint32_t bits_of(float f) { return detail::f32_bits(f); }

// Every f32 whose upper 16 bits take each of the 65536 values and whose lower 16 bits are 0, each power of
// two, and each power of two +- 1: all the tie and near-tie positions of both 16-bit formats, in every
// exponent, sign and NaN/inf class.
std::vector<float> boundary_floats() {
  std::vector<uint32_t> low = {0, 0xffff};
  for (int b = 0; b < 16; ++b) {
    low.push_back(1u << b);
    low.push_back((1u << b) - 1);
    low.push_back((1u << b) + 1);
  }
  std::vector<float> out;
  out.reserve(65536 * low.size());
  for (uint32_t hi = 0; hi < 65536; ++hi)
    for (uint32_t lo : low) out.push_back(detail::bits_f32((hi << 16) | (lo & 0xffff)));
  return out;
}

template <typename T>
std::vector<T> every_pattern() {
  std::vector<T> out(65536);
  for (uint32_t i = 0; i < 65536; ++i) out[i] = T::from_bits(uint16_t(i));
  return out;
}

// Converts [offset, offset + n) of `in` with both conversions and expects identical bits.
template <typename T>
void expect_widening_exact(const std::vector<T>& in, size_t offset, size_t n, const char* what) {
  std::vector<float> fast(n), slow(n);
  cpu::to_f32(in.data() + offset, fast.data(), int64_t(n));
  cpu::to_f32_portable(in.data() + offset, slow.data(), int64_t(n));
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(bits_of(fast[i]), bits_of(slow[i]))
        << what << " from bits 0x" << std::hex << in[offset + i].bits << " (offset " << std::dec << offset
        << ")";
}

template <typename T>
void expect_narrowing_exact(const std::vector<float>& in, size_t offset, size_t n, const char* what) {
  std::vector<T> fast(n), slow(n);
  cpu::from_f32(in.data() + offset, fast.data(), int64_t(n));
  cpu::from_f32_portable(in.data() + offset, slow.data(), int64_t(n));
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(fast[i].bits, slow[i].bits)
        << what << " from f32 bits 0x" << std::hex << bits_of(in[offset + i]) << " (offset " << std::dec
        << offset << ")";
}

TEST(Convert, EverySixteenBitPatternWidensExactly) {
  std::cout << "conversions use: " << cpu::conversion_isa() << "\n";
  const auto halves = every_pattern<Half>();
  const auto bf16s = every_pattern<BFloat16>();
  // Aligned whole runs, then shifted by one so every pattern meets every lane and the tails run.
  for (size_t offset : {0, 1, 7}) {
    expect_widening_exact(halves, offset, halves.size() - offset, "f16 -> f32");
    expect_widening_exact(bf16s, offset, bf16s.size() - offset, "bf16 -> f32");
  }
}

TEST(Convert, BoundaryFloatsNarrowExactly) {
  const auto floats = boundary_floats();
  for (size_t offset : {0, 1, 5}) {
    expect_narrowing_exact<Half>(floats, offset, floats.size() - offset, "f32 -> f16");
    expect_narrowing_exact<BFloat16>(floats, offset, floats.size() - offset, "f32 -> bf16");
  }
}

// A NaN or subnormal inside a vector block takes the element-by-element path for that block only; runs of
// every length up to a few blocks check the tails and the blocks beside a special value.
TEST(Convert, SpecialValuesAnywhereInShortRuns) {
  const float specials[] = {detail::bits_f32(0x7f800001), detail::bits_f32(0xffc02000),
                            detail::bits_f32(0x00000001), detail::bits_f32(0x807fffff), INFINITY};
  for (float special : specials)
    for (size_t n = 1; n <= 40; ++n)
      for (size_t at = 0; at < n; at += 3) {
        std::vector<float> in(n);
        for (size_t i = 0; i < n; ++i) in[i] = float(i) * 0.37f - 3.1f;
        in[at] = special;
        expect_narrowing_exact<Half>(in, 0, n, "short f32 -> f16");
        expect_narrowing_exact<BFloat16>(in, 0, n, "short f32 -> bf16");
        std::vector<Half> h(n);
        cpu::from_f32_portable(in.data(), h.data(), int64_t(n));
        h[at] = Half::from_bits(0x7d01);  // a signalling NaN
        expect_widening_exact(h, 0, n, "short f16 -> f32");
      }
}

// The scalar conversions themselves on hand-checked values, so that "bit-exact with them" means correct.
TEST(Convert, ScalarConversionsKnownValues) {
  struct Case {
    uint32_t f32;
    uint16_t f16, bf16;
  };
  const Case cases[] = {
      {0x3f800000, 0x3c00, 0x3f80},  // 1
      {0xbf800000, 0xbc00, 0xbf80},  // -1
      {0x477fe000, 0x7bff, 0x4780},  // 65504, the largest f16
      {0x477fefff, 0x7bff, 0x4780},  // just below 65520: rounds down to 65504
      {0x477ff000, 0x7c00, 0x4780},  // 65520: ties to even, which overflows to inf
      {0x33800000, 0x0001, 0x3380},  // 2^-24, the smallest f16 subnormal
      {0x33000000, 0x0000, 0x3300},  // 2^-25: a tie between 0 and 2^-24, to even (0)
      {0x33c00000, 0x0002, 0x33c0},  // 1.5 * 2^-24: a tie between 1 and 2 ulps, to even (2)
      {0x3f808000, 0x3c04, 0x3f80},  // bf16 tie with an even lower neighbour: down
      {0x3f818000, 0x3c0c, 0x3f82},  // bf16 tie with an odd lower neighbour: up
      {0x3f801000, 0x3c00, 0x3f80},  // f16 tie (1 + 2^-11), even neighbour: down
      {0x3f803000, 0x3c02, 0x3f80},  // f16 tie (1 + 3 * 2^-11), odd neighbour: up
      {0x00000001, 0x0000, 0x0000},  // the smallest f32 subnormal
      {0x807fffff, 0x8000, 0x8080},  // the largest negative f32 subnormal: rounds up into bf16's normals
      {0x7f800000, 0x7c00, 0x7f80},  // inf
      {0x7f7fffff, 0x7c00, 0x7f80},  // the largest f32: overflows both
      {0x7f800001, 0x7e00, 0x7fc0},  // signalling NaN: quiet NaN
      {0xffc02000, 0xfe00, 0xffc0},  // negative NaN with a payload
  };
  for (const Case& c : cases) {
    const float f = detail::bits_f32(c.f32);
    EXPECT_EQ(detail::float_to_half(f), c.f16) << std::hex << "f32 0x" << c.f32 << " -> f16";
    EXPECT_EQ(detail::float_to_bf16(f), c.bf16) << std::hex << "f32 0x" << c.f32 << " -> bf16";
  }
  EXPECT_EQ(bits_of(detail::half_to_float(0x0001)), 0x33800000u);
  EXPECT_EQ(bits_of(detail::half_to_float(0x7d01)), 0x7fa02000u);  // the payload kept as it is
  EXPECT_EQ(bits_of(detail::bf16_to_float(0xff81)), 0xff810000u);
}

// The cast op: contiguous runs go through the vectorised conversions, strided ones element by element; both
// must give the scalar conversions' bits.
TEST(Convert, CastOpMatchesScalarConversions) {
  const auto floats = boundary_floats();
  const std::vector<float> some(floats.begin(), floats.begin() + 200003);  // not a multiple of any block
  const Tensor f = tensor<float>(some);
  for (DType t : {DType::F16, DType::BF16})
    for (bool strided : {false, true}) {
      const Tensor src = strided ? f.slice(0, 0, f.numel(), 3) : f;
      const Tensor low = src.to(t);
      const Tensor back = low.to(DType::F32);
      const auto src_v = src.contiguous().to_vector<float>();
      std::vector<uint16_t> low_bits(size_t(low.numel()));
      std::memcpy(low_bits.data(), low.contiguous().raw_data(), low_bits.size() * 2);
      const auto back_v = back.to_vector<float>();
      for (size_t i = 0; i < src_v.size(); ++i) {
        const uint16_t want =
            t == DType::F16 ? detail::float_to_half(src_v[i]) : detail::float_to_bf16(src_v[i]);
        ASSERT_EQ(low_bits[i], want) << dtype_name(t) << (strided ? " strided" : "") << " at " << i;
        const float want_back = t == DType::F16 ? detail::half_to_float(want) : detail::bf16_to_float(want);
        ASSERT_EQ(bits_of(back_v[i]), bits_of(want_back)) << dtype_name(t) << " back to f32 at " << i;
      }
    }
}

}  // namespace
}  // namespace frugal

// One register of the widest vector kind the build targets, as a GCC/Clang vector type of float or double
// (kernels that keep blocks of values in registers: the attention's small products, a LayerNorm row's sums).
// A wider GCC vector would be split over several registers and passed in memory (-Wpsabi).
//
//   cpu::Vec<float> v;  // cpu::kLanes<float> floats; v + w, v * w, v - x lane by lane
//   _mm512_maskz_loadu_ps(cpu::first_lanes(n - j), row + j);  // AVX-512: a row's last, partial vector
#pragma once

#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace frugal::cpu {

#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#elif defined(__AVX__)
constexpr int kVectorBytes = 32;
#else
constexpr int kVectorBytes = 16;
#endif
template <typename T>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(kVectorBytes)));
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(kVectorBytes)));
};
template <typename T>
using Vec = typename VecOf<T>::type;
template <typename T>
constexpr int kLanes = int(kVectorBytes / sizeof(T));

#if defined(__AVX512F__)
// The mask of a vector's first `count` lanes of 16 (all for 16 or more, none for 0 or fewer): the last,
// partial vector of a row.
inline __mmask16 first_lanes(int64_t count) {
  return count >= 16 ? __mmask16(0xffff) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}
#endif

}  // namespace frugal::cpu

// One register of the widest vector kind the build targets, as a GCC/Clang vector type of float or double
// (kernels that keep blocks of values in registers: the attention's small products, a LayerNorm row's sums).
// A wider GCC vector would be split over several registers and passed in memory (-Wpsabi).
//
//   cpu::Vec<float> v;  // cpu::kLanes<float> floats; v + w, v * w, v - x lane by lane
//   _mm512_maskz_loadu_ps(cpu::first_lanes(n - j), row + j);  // AVX-512: a row's last, partial vector
//   cpu::prefetch_rows(next, rows, cols, stride);  // the next operands on their way while this one computes
#pragma once

#include <cstdint>

#if defined(__AVX__)
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

#if defined(__AVX__)
// The sum of a vector's lanes, its halves added until one lane is left (the dot products of a few rows,
// kernels/cpu/linear.cpp and sparse.cpp; not _mm512_reduce_add_ps, inside which GCC 12 warned
// -Wuninitialized in bench/workloads.cpp).
inline float sum_lanes(__m256 v) {
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}
#endif
#if defined(__AVX512F__)
inline float sum_lanes(__m512 v) {
  return sum_lanes(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

// The mask of a vector's first `count` lanes of 16 (all for 16 or more, none for 0 or fewer): the last,
// partial vector of a row.
inline __mmask16 first_lanes(int64_t count) {
  return count >= 16 ? __mmask16(0xffff) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}
#endif

// Asks for the cache lines of `rows` rows of `cols` elements, `stride` elements apart, ahead of their use:
// the attention's next head's operands (strided rows of a large tensor, which the hardware prefetchers follow
// late), softmax's next row (fetched while this row's exps are computed).
template <typename T>
inline void prefetch_rows(const T* p, int64_t rows, int64_t cols, int64_t stride) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += 64 / int64_t(sizeof(T))) __builtin_prefetch(p + r * stride + c);
}

}  // namespace frugal::cpu

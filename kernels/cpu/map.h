// Elementwise CPU kernels over a Loop's runs: map_functor runs an op's functor (kernels/math.h) with an
// optional Eigen form for the runs it vectorises (kernels/cpu/elementwise.cpp); map_kernel runs an Eigen
// array expression alone (kernels/cpu/activation.cpp). The math of an op is a callable f(out, in_1, ...,
// in_N) on Eigen maps, so contiguous f32/f64 runs use Eigen's vectorised exp, tanh, erf, ...; other runs
// (strided, broadcast, f16/bf16) pass through small buffers in the compute type (f32 for f16/bf16).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "core/op_table.h"
#include "kernels/cpu/convert.h"

namespace frugal::cpu {

template <typename C>
using Arr = Eigen::Array<C, Eigen::Dynamic, 1>;
template <typename C>
using Out = Eigen::Map<Arr<C>>;
template <typename C>
using In = Eigen::Map<const Arr<C>>;

constexpr int64_t kMapChunk = 256;  // elements per buffered step: a few KiB, stays in L1

// f16/bf16 <-> f32 runs convert through kernels/cpu/convert.h (vectorised).
template <typename T, typename C>
constexpr bool kWidens = std::is_same_v<C, float> && (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>);

template <typename T, typename C>
inline void load(const char* p, int64_t stride, int64_t n, C* buf) {
  if constexpr (kWidens<T, C>) {
    if (stride == int64_t(sizeof(T))) return to_f32(reinterpret_cast<const T*>(p), buf, n);
  }
  if (stride == int64_t(sizeof(T))) {
    const T* q = reinterpret_cast<const T*>(p);
    for (int64_t i = 0; i < n; ++i) buf[i] = C(q[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) buf[i] = C(*reinterpret_cast<const T*>(p + i * stride));
  }
}

template <typename T, typename C>
inline void store(char* p, int64_t stride, int64_t n, const C* buf) {
  if constexpr (kWidens<T, C>) {
    if (stride == int64_t(sizeof(T))) return from_f32(buf, reinterpret_cast<T*>(p), n);
  }
  if (stride == int64_t(sizeof(T))) {
    T* q = reinterpret_cast<T*>(p);
    for (int64_t i = 0; i < n; ++i) q[i] = T(buf[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p + i * stride) = T(buf[i]);
  }
}

// Note [pieces of a run, bit for bit]: Eigen assigns to a destination's unaligned head, and to the tail
// after its last whole packet, element by element (scalar erf, exp, ...: their last bit can differ from the
// packet functions'), and the rest by packets. A contiguous run cut into pieces that each start where
// `out` is packet-aligned (but the first, which ends there) has each element go the way it goes when the
// run is assigned whole: a rule run in pieces then gives the whole run's results bit for bit. The first
// piece's length: up to `out`'s first aligned element, or kMapChunk when `out` starts aligned.
template <typename C>
int64_t first_piece(const C* out, int64_t n) {
  // A packet's alignment is its size (unpacket_traits<Packet>::alignment, whose template argument would lose
  // the vector type's attributes).
  constexpr int kAlignment = int(sizeof(typename Eigen::internal::packet_traits<C>::type));
  const int64_t head = Eigen::internal::first_aligned<kAlignment>(out, n);
  return std::min(head > 0 ? head : kMapChunk, n);
}

// Runs f(out, in_1, ..., in_N) over every run of a loop whose operands (all of type T) are out, in_1, ...:
// straight over memory when T is its own compute type and every operand is contiguous, through
// kMapChunk-sized buffers otherwise. `Chunked` also cuts the contiguous runs into pieces of at most
// kMapChunk (Note [pieces of a run, bit for bit]), so that a rule of several statements (each a pass over
// its piece) finds its first results still in L1.
template <typename T, int N, bool Chunked = false, typename F>
void map_kernel(const Loop& loop, F f) {
  using C = acc_t<T>;
  for_each_run(loop, [&](char* const* p, const int64_t* s, int64_t n) {
    if constexpr (std::is_same_v<T, C>) {
      bool contiguous = true;
      for (int k = 0; k <= N; ++k) contiguous = contiguous && s[k] == int64_t(sizeof(T));
      if (contiguous) {
        for (int64_t i = 0, m = Chunked ? first_piece(reinterpret_cast<C*>(p[0]), n) : n; i < n;
             i += m, m = std::min(kMapChunk, n - i)) {
          Out<C> o(reinterpret_cast<C*>(p[0]) + i, m);
          [&]<int... K>(std::integer_sequence<int, K...>) {
            f(o, In<C>(reinterpret_cast<const C*>(p[K + 1]) + i, m)...);
          }
          (std::make_integer_sequence<int, N>{});
        }
        return;
      }
    }
    alignas(64) C in[N][kMapChunk], r[kMapChunk];
    for (int64_t i = 0; i < n; i += kMapChunk) {
      const int64_t m = std::min(kMapChunk, n - i);
      for (int k = 0; k < N; ++k) load<T>(p[k + 1] + i * s[k + 1], s[k + 1], m, in[k]);
      Out<C> o(r, m);
      [&]<int... K>(std::integer_sequence<int, K...>) { f(o, In<C>(in[K], m)...); }
      (std::make_integer_sequence<int, N>{});
      store<T>(p[0] + i * s[0], s[0], m, r);
    }
  });
}

// Runs an elementwise op over every run of a loop whose operands (all of type T) are out, in_1, ..., in_N.
// With `vec`, a callable vec(out, in_1, ..., in_N) on Eigen maps (the op's Eigen form): straight over memory
// when T is its own compute type, the output contiguous and each input contiguous or one value repeated (a
// scalar, a broadcast row); through kMapChunk buffers in the compute type otherwise. Without one (vec is
// nullptr), the functor f (kernels/math.h: compute-type values in, one out): element by element when T is
// its own compute type, through the buffers otherwise (f16/bf16, converted vectorised).
template <typename T, int N, typename F, typename V>
void map_functor(const Loop& loop, const F& f, const V& vec) {
  using C = acc_t<T>;
  constexpr int64_t kSize = int64_t(sizeof(T));
  for_each_run(loop, [&](char* const* p, const int64_t* s, int64_t n) {
    if constexpr (std::is_same_v<T, C> && !std::is_same_v<V, std::nullptr_t>) {
      bool direct = s[0] == kSize, repeats = false;
      for (int k = 1; k <= N; ++k) {
        direct = direct && (s[k] == kSize || s[k] == 0);
        repeats = repeats || s[k] == 0;
      }
      if (direct && !repeats) {
        Out<C> o(reinterpret_cast<C*>(p[0]), n);
        [&]<int... K>(std::integer_sequence<int, K...>) {
          vec(o, In<C>(reinterpret_cast<const C*>(p[K + 1]), n)...);
        }
        (std::make_integer_sequence<int, N>{});
        return;
      }
      if (direct) {  // a repeated input is read from a buffer holding its value kMapChunk times
        alignas(64) C rep[N][kMapChunk];
        for (int k = 0; k < N; ++k)
          if (s[k + 1] == 0) std::fill_n(rep[k], kMapChunk, *reinterpret_cast<const C*>(p[k + 1]));
        for (int64_t i = 0; i < n; i += kMapChunk) {
          const int64_t m = std::min(kMapChunk, n - i);
          Out<C> o(reinterpret_cast<C*>(p[0]) + i, m);
          auto in = [&](int k) {
            return In<C>(s[k + 1] == 0 ? rep[k] : reinterpret_cast<const C*>(p[k + 1]) + i, m);
          };
          [&]<int... K>(std::integer_sequence<int, K...>) { vec(o, in(K)...); }
          (std::make_integer_sequence<int, N>{});
        }
        return;
      }
    }
    if constexpr (!std::is_same_v<V, std::nullptr_t>) {
      // Strided and f16/bf16 runs of an op with an Eigen form: through buffers in C, then that form (a
      // scalar functor here cost 7x on bf16 gelu and 3x on a transposed tanh).
      alignas(64) C in[N][kMapChunk], r[kMapChunk];
      for (int64_t i = 0; i < n; i += kMapChunk) {
        const int64_t m = std::min(kMapChunk, n - i);
        for (int k = 0; k < N; ++k) load<T>(p[k + 1] + i * s[k + 1], s[k + 1], m, in[k]);
        Out<C> o(r, m);
        [&]<int... K>(std::integer_sequence<int, K...>) { vec(o, In<C>(in[K], m)...); }
        (std::make_integer_sequence<int, N>{});
        store<T>(p[0] + i * s[0], s[0], m, r);
      }
    } else if constexpr (std::is_same_v<T, C>) {
      auto at = [&](int k, int64_t i) { return *reinterpret_cast<const C*>(p[k + 1] + i * s[k + 1]); };
      for (int64_t i = 0; i < n; ++i) [&]<int... K>(std::integer_sequence<int, K...>) {
          *reinterpret_cast<T*>(p[0] + i * s[0]) = T(f(at(K, i)...));
        }
      (std::make_integer_sequence<int, N>{});
    } else {
      alignas(64) C in[N][kMapChunk], r[kMapChunk];
      for (int64_t i = 0; i < n; i += kMapChunk) {
        const int64_t m = std::min(kMapChunk, n - i);
        for (int k = 0; k < N; ++k) load<T>(p[k + 1] + i * s[k + 1], s[k + 1], m, in[k]);
        for (int64_t j = 0; j < m; ++j) [&]<int... K>(std::integer_sequence<int, K...>) {
            r[j] = C(f(in[K][j]...));
          }
        (std::make_integer_sequence<int, N>{});
        store<T>(p[0] + i * s[0], s[0], m, r);
      }
    }
  });
}

// out = exp(x) for an Eigen array expression x, right down to the underflow. Why not x.exp() alone: Eigen
// 3.4's SSE/AVX exp clamps its argument at about -88.4 (f32) / -709.4 (f64), so exp(-100) came out as
// 2.9e-39 instead of 3.8e-44 and exp(-inf) not as 0 (its AVX-512 kernels are right). The rare elements below
// that bound are redone as exp(x + 64) e^-64, whose factors are normal numbers.
template <typename O, typename X>
void exp_into(O&& out, const X& x) {
  using C = typename std::decay_t<O>::Scalar;
  constexpr C lo = std::is_same_v<C, float> ? C(-87) : C(-708);
  out = x.exp();
  // minCoeff is a vectorised reduction where any() is a scalar loop; PropagateNumbers: the least number
  // among NaNs.
  if (x.template minCoeff<Eigen::PropagateNumbers>() < lo)
    out = (x < lo).select((x + C(64)).exp() * C(1.6038108905486378e-28), out);
}

}  // namespace frugal::cpu

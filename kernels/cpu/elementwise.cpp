// CPU elementwise kernels. The math of each op is one Eigen array expression, so contiguous f32/f64 runs use
// Eigen's vectorised exp, tanh, erf, ...; other runs (strided, broadcast, f16/bf16) pass through small
// buffers in the compute type (f32 for f16/bf16). The naive references these are tested against are in
// tests/kernels/test_elementwise.cpp (plain std:: math in f64).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <unsupported/Eigen/SpecialFunctions>

#include "core/op_table.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/map.h"
#include "kernels/cpu/register.h"

namespace frugal {
namespace {

using cpu::for_types;

using cpu::In;
using cpu::kWidens;
using cpu::map_kernel;
using cpu::Out;

// The math: one Eigen expression per op. `A` is the OpArgs (clamp's bounds).
#define FRUGAL_UNARY_MATH(X)                                                                            \
  X(neg, o = -x)                                                                                        \
  X(abs, o = x.abs())                                                                                   \
  X(exp, cpu::exp_into(o, x))                                                                           \
  X(log, o = x.log())                                                                                   \
  X(sqrt, o = x.sqrt())                                                                                 \
  X(rsqrt, o = x.rsqrt())                                                                               \
  X(relu, o = x.max(C(0)))                                                                              \
  X(gelu, o = C(0.5) * x * (C(1) + (x * C(0.70710678118654752)).erf()))                                 \
  X(gelu_tanh, o = C(0.5) * x * (C(1) + (C(0.7978845608028654) * (x + C(0.044715) * x.cube())).tanh())) \
  X(sigmoid, cpu::exp_into(o, -x); o = C(1) / (C(1) + o))                                               \
  X(tanh, o = x.tanh())                                                                                 \
  X(silu, cpu::exp_into(o, -x); o = x / (C(1) + o))                                                     \
  X(erf, o = x.erf())                                                                                   \
  X(clamp, o = x.max(clamp_bound<C>(A.a)).min(clamp_bound<C>(A.b)))

#define FRUGAL_BINARY_MATH(X) \
  X(add, o = x + y)           \
  X(sub, o = x - y)           \
  X(mul, o = x * y)           \
  X(div, o = x / y)           \
  X(pow, o = x.pow(y))        \
  X(maximum, o = x.max(y))    \
  X(minimum, o = x.min(y))

// A clamp bound in the compute type; infinite bounds become the type's extremes for integers.
template <typename C>
C clamp_bound(double v) {
  if constexpr (std::is_integral_v<C>) {
    if (v <= double(std::numeric_limits<C>::lowest())) return std::numeric_limits<C>::lowest();
    if (v >= double(std::numeric_limits<C>::max())) return std::numeric_limits<C>::max();
    return C(v);  // truncates a fractional bound toward zero
  } else {
    return C(v);
  }
}

#define FRUGAL_UNARY_KERNEL(name, expr)                     \
  template <typename T>                                     \
  void name##_cpu(const Loop& loop, const OpArgs& A) {      \
    using C = acc_t<T>;                                     \
    map_kernel<T, 1>(loop, [&](Out<C>& o, const In<C>& x) { \
      (void)A;                                              \
      expr;                                                 \
    });                                                     \
  }
FRUGAL_UNARY_MATH(FRUGAL_UNARY_KERNEL)
#undef FRUGAL_UNARY_KERNEL

#define FRUGAL_BINARY_KERNEL(name, expr)                                              \
  template <typename T>                                                               \
  void name##_cpu(const Loop& loop, const OpArgs&) {                                  \
    using C = acc_t<T>;                                                               \
    map_kernel<T, 2>(loop, [&](Out<C>& o, const In<C>& x, const In<C>& y) { expr; }); \
  }
FRUGAL_BINARY_MATH(FRUGAL_BINARY_KERNEL)
#undef FRUGAL_BINARY_KERNEL

// Integer pow: Eigen has no integer power of arrays; exponentiation by squaring (negative exponents give 0,
// except for bases 1 and -1, as in PyTorch).
template <typename T>
void pow_int_cpu(const Loop& loop, const OpArgs&) {
  for_each_run(loop, [&](char* const* p, const int64_t* s, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      T base = *reinterpret_cast<const T*>(p[1] + i * s[1]);
      int64_t e = int64_t(*reinterpret_cast<const T*>(p[2] + i * s[2]));
      T r = 1;
      if (e < 0) {
        r = base == 1 ? 1 : (base == T(-1) ? (e % 2 ? T(-1) : 1) : 0);
      } else {
        for (; e; e >>= 1, base *= base)
          if (e & 1) r *= base;
      }
      *reinterpret_cast<T*>(p[0] + i * s[0]) = r;
    }
  });
}

// Comparisons, where, cast, fill: plain loops (the compiler vectorises the contiguous ones).
#define FRUGAL_COMPARE_MATH(X) X(eq, ==) X(ne, !=) X(lt, <) X(le, <=) X(gt, >) X(ge, >=)
#define FRUGAL_COMPARE_KERNEL(name, op)                                                             \
  template <typename T>                                                                             \
  void name##_cpu(const Loop& loop, const OpArgs&) {                                                \
    using C = acc_t<T>;                                                                             \
    for_each_run(loop, [&](char* const* p, const int64_t* s, int64_t n) {                           \
      for (int64_t i = 0; i < n; ++i)                                                               \
        *reinterpret_cast<bool*>(p[0] + i * s[0]) = C(*reinterpret_cast<const T*>(p[1] + i * s[1])) \
            op C(*reinterpret_cast<const T*>(p[2] + i * s[2]));                                     \
    });                                                                                             \
  }
FRUGAL_COMPARE_MATH(FRUGAL_COMPARE_KERNEL)
#undef FRUGAL_COMPARE_KERNEL

template <typename T>
void where_cpu(const Loop& loop, const OpArgs&) {
  for_each_run(loop, [&](char* const* p, const int64_t* s, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      *reinterpret_cast<T*>(p[0] + i * s[0]) = *reinterpret_cast<const bool*>(p[1] + i * s[1])
                                                   ? *reinterpret_cast<const T*>(p[2] + i * s[2])
                                                   : *reinterpret_cast<const T*>(p[3] + i * s[3]);
  });
}

// Note [float to integer casts]
// C++ leaves a float converted to an integer type that cannot hold its truncated value undefined (UBSan
// flags -1.0f to u8), and machines differ: x86 gives the "integer indefinite" INT_MIN, CUDA and ARM saturate.
// frugal defines every case, alike in the CPU kernels (convert below, used by cast and fill) and in the CUDA
// math (math::convert in kernels/cuda/math.h, checked against these by tests/cuda/test_math.cpp):
// - to i64 and i32: truncation toward zero; NaN gives 0, and values beyond the type saturate to its lowest or
//   highest value (as CUDA's and ARM's conversions, and Rust's `as`, do);
// - to u8: to i64 as above, then modulo 256. PyTorch's CPU converts float -> int64 -> uint8, so -1.0
//   gives 255 and 300.0 gives 44 as there; where PyTorch is undefined (NaN, infinities, beyond int64) this
//   follows the i64 rule: NaN gives 0, +inf 255, -inf 0;
// - to bool: != 0.
template <typename I, typename F>
inline I float_to_int(F v) {
  if constexpr (std::is_same_v<I, uint8_t>) {
    return uint8_t(uint64_t(float_to_int<int64_t>(v)));  // modulo 256
  } else {
    constexpr F lowest = F(std::numeric_limits<I>::lowest());  // -2^31 or -2^63: exact in float and double
    if (v != v) return 0;
    if (v <= lowest) return std::numeric_limits<I>::lowest();
    if (v >= -lowest) return std::numeric_limits<I>::max();
    return I(v);
  }
}

// One value converted between element types: through the source's compute type; to bool means != 0; floats
// to integers as Note [float to integer casts] says.
template <typename To, typename From>
inline To convert(From v) {
  using C = acc_t<From>;
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bool>) {
    return C(v) != C(0);
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(float(C(v)));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<C>) {
    return float_to_int<To>(C(v));
  } else {
    return To(C(v));
  }
}

// Copies operand 1 (of dtype args.a) into operand 0 (of dtype To), converting.
template <typename To>
void cast_cpu(const Loop& loop, const OpArgs& args) {
  visit_dtype(DType(int(args.a)), [&](auto from_tag) {
    using From = decltype(from_tag);
    for_each_run(loop, [&](char* const* p, const int64_t* s, int64_t n) {
      const bool contiguous = s[0] == int64_t(sizeof(To)) && s[1] == int64_t(sizeof(From));
      if constexpr (std::is_same_v<To, From>) {
        if (contiguous) {
          std::memcpy(p[0], p[1], size_t(n) * sizeof(To));
          return;
        }
      } else if constexpr (kWidens<From, To>) {
        if (contiguous)
          return cpu::to_f32(reinterpret_cast<const From*>(p[1]), reinterpret_cast<To*>(p[0]), n);
      } else if constexpr (kWidens<To, From>) {
        if (contiguous)
          return cpu::from_f32(reinterpret_cast<const From*>(p[1]), reinterpret_cast<To*>(p[0]), n);
      }
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<To*>(p[0] + i * s[0]) =
            convert<To>(*reinterpret_cast<const From*>(p[1] + i * s[1]));
    });
  });
}

template <typename T>
void fill_cpu(const Loop& loop, const OpArgs& args) {
  const T v = convert<T>(args.a);
  for_each_run(loop, [&](char* const* p, const int64_t* s, int64_t n) {
    for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
  });
}

const bool kRegistered = [] {
  auto floating = [](auto reg) { for_types<float, double, Half, BFloat16>(reg); };
  auto numeric = [](auto reg) { for_types<float, double, Half, BFloat16, int64_t, int32_t, uint8_t>(reg); };
  auto all = [](auto reg) { for_types<float, double, Half, BFloat16, int64_t, int32_t, uint8_t, bool>(reg); };
#define FRUGAL_REG(name, types) \
  types([](auto t) { op_##name.set(DeviceType::CPU, dtype_v<decltype(t)>, name##_cpu<decltype(t)>); });
  FRUGAL_REG(neg, floating)
  for_types<int64_t, int32_t>(
      [](auto t) { op_neg.set(DeviceType::CPU, dtype_v<decltype(t)>, neg_cpu<decltype(t)>); });
  FRUGAL_REG(abs, numeric)
  FRUGAL_REG(relu, numeric)
  FRUGAL_REG(clamp, numeric)
  FRUGAL_REG(exp, floating)
  FRUGAL_REG(log, floating)
  FRUGAL_REG(sqrt, floating)
  FRUGAL_REG(rsqrt, floating)
  FRUGAL_REG(gelu, floating)
  FRUGAL_REG(gelu_tanh, floating)
  FRUGAL_REG(sigmoid, floating)
  FRUGAL_REG(tanh, floating)
  FRUGAL_REG(silu, floating)
  FRUGAL_REG(erf, floating)
  FRUGAL_REG(add, numeric)
  FRUGAL_REG(sub, numeric)
  FRUGAL_REG(mul, numeric)
  FRUGAL_REG(div, floating)
  FRUGAL_REG(pow, floating)
  for_types<int64_t, int32_t, uint8_t>(
      [](auto t) { op_pow.set(DeviceType::CPU, dtype_v<decltype(t)>, pow_int_cpu<decltype(t)>); });
  FRUGAL_REG(maximum, numeric)
  FRUGAL_REG(minimum, numeric)
  FRUGAL_REG(eq, all)
  FRUGAL_REG(ne, all)
  FRUGAL_REG(lt, all)
  FRUGAL_REG(le, all)
  FRUGAL_REG(gt, all)
  FRUGAL_REG(ge, all)
  FRUGAL_REG(where, all)
  FRUGAL_REG(cast, all)
  FRUGAL_REG(fill, all)
#undef FRUGAL_REG
  return true;
}();

}  // namespace
}  // namespace frugal

// CPU elementwise kernels, registered from core/op_list.h. The math of each op is its functor
// (kernels/math.h, shared with the CUDA kernels and the tests' reference); an op may also have an Eigen form
// of the same math, written below, which then takes its runs (Eigen's vectorised exp, tanh, erf, ...; strided
// and f16/bf16 runs through small f32 buffers: map_functor in kernels/cpu/map.h). The functor runs the ops
// without one, integer pow and bool arithmetic. tests/kernels/test_elementwise.cpp checks every op on every
// dtype and layout against the functor evaluated in f64.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <unsupported/Eigen/SpecialFunctions>

#include "core/op_table.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/gelu_forms.h"
#include "kernels/cpu/map.h"
#include "kernels/cpu/register.h"
#include "kernels/math.h"

namespace frugal {
namespace {

using cpu::for_types;

using cpu::kWidens;
using cpu::map_functor;

// The Eigen forms of the functors (kernels/math.h) that Eigen vectorises (exp, tanh, erf, ...):
// Vectorised<Op, C>::run(f, o, x[, y]) on Eigen maps. An op without one runs its functor everywhere. Each is
// tested against its functor (tests/kernels/test_elementwise.cpp, tests/cuda/test_math.cpp).
template <typename Op, typename C>
struct Vectorised {
  static constexpr bool kHas = false;
};
#define FRUGAL_EIGEN_UNARY(Op, expr)                     \
  template <typename C>                                  \
  struct Vectorised<math::Op, C> {                       \
    static constexpr bool kHas = true;                   \
    template <typename O, typename X>                    \
    static void run(const math::Op&, O& o, const X& x) { \
      expr;                                              \
    }                                                    \
  };
FRUGAL_EIGEN_UNARY(Neg, o = -x)
FRUGAL_EIGEN_UNARY(Abs, o = x.abs())
FRUGAL_EIGEN_UNARY(Exp, cpu::exp_into(o, x))
FRUGAL_EIGEN_UNARY(Log, o = x.log())
FRUGAL_EIGEN_UNARY(Sqrt, o = x.sqrt())
FRUGAL_EIGEN_UNARY(Rsqrt, o = x.rsqrt())
FRUGAL_EIGEN_UNARY(Relu, o = x.max(C(0)))
FRUGAL_EIGEN_UNARY(Gelu, o = cpu::gelu_form<C>(x, cpu::gelu_erf<C>(x)))
FRUGAL_EIGEN_UNARY(GeluTanh,
                   o = C(0.5) * x * (C(1) + (C(0.7978845608028654) * (x + C(0.044715) * x.cube())).tanh()))
FRUGAL_EIGEN_UNARY(Sigmoid, cpu::exp_into(o, -x); o = C(1) / (C(1) + o))
FRUGAL_EIGEN_UNARY(Tanh, o = x.tanh())
FRUGAL_EIGEN_UNARY(Silu, cpu::exp_into(o, -x); o = x / (C(1) + o))
FRUGAL_EIGEN_UNARY(Erf, o = x.erf())
#undef FRUGAL_EIGEN_UNARY
template <typename C>
struct Vectorised<math::Clamp<C>, C> {
  static constexpr bool kHas = true;
  template <typename O, typename X>
  static void run(const math::Clamp<C>& f, O& o, const X& x) {
    o = x.max(f.lo).min(f.hi);
  }
};
#define FRUGAL_EIGEN_BINARY(Op, has, expr)                           \
  template <typename C>                                              \
  struct Vectorised<math::Op, C> {                                   \
    static constexpr bool kHas = has;                                \
    template <typename O, typename X, typename Y>                    \
    static void run(const math::Op&, O& o, const X& x, const Y& y) { \
      expr;                                                          \
    }                                                                \
  };
FRUGAL_EIGEN_BINARY(Add, true, o = x + y)
FRUGAL_EIGEN_BINARY(Sub, true, o = x - y)
FRUGAL_EIGEN_BINARY(Mul, true, o = x * y)
FRUGAL_EIGEN_BINARY(Div, true, o = x / y)
FRUGAL_EIGEN_BINARY(Pow, std::is_floating_point_v<C>, o = x.pow(y))  // integers: the functor's squaring
FRUGAL_EIGEN_BINARY(Maximum, true, o = x.max(y))
FRUGAL_EIGEN_BINARY(Minimum, true, o = x.min(y))
#undef FRUGAL_EIGEN_BINARY

// One kernel for every elementwise op: the functor f of compute type C, with its Eigen form where it has one
// (never for bool: Eigen's arithmetic on bool arrays is not a logical one; nor for signed integers, whose
// arithmetic wraps, Note [integer overflow wraps] in kernels/math.h, where Eigen's would overflow).
template <typename T, int N, typename Op>
void functor_cpu(const Loop& loop, const Op& f) {
  using C = acc_t<T>;
  using V = Vectorised<Op, C>;
  if constexpr (V::kHas && !std::is_same_v<C, bool> && !(std::is_integral_v<C> && std::is_signed_v<C>)) {
    map_functor<T, N>(loop, f, [&](auto& o, const auto&... in) { V::run(f, o, in...); });
  } else {
    map_functor<T, N>(loop, f, nullptr);
  }
}
template <typename T, typename Op>
void unary_cpu(const Loop& loop, const OpArgs&) {
  functor_cpu<T, 1>(loop, Op{});
}
template <typename T, template <typename> class Op>
void unary_param_cpu(const Loop& loop, const OpArgs& args) {
  functor_cpu<T, 1>(loop, Op<acc_t<T>>(args.a, args.b));
}
template <typename T, typename Op>
void binary_cpu(const Loop& loop, const OpArgs&) {
  functor_cpu<T, 2>(loop, Op{});
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
// frugal defines every case, once, in math::float_to_int (kernels/math.h), which the CPU's convert below
// (used by cast and fill) and the CUDA math (math::convert in kernels/cuda/math.h) both call:
// - to i64 and i32: truncation toward zero; NaN gives 0, and values beyond the type saturate to its lowest or
//   highest value (as CUDA's and ARM's conversions, and Rust's `as`, do);
// - to u8: to i64 as above, then modulo 256. PyTorch's CPU converts float -> int64 -> uint8, so -1.0
//   gives 255 and 300.0 gives 44 as there; where PyTorch is undefined (NaN, infinities, beyond int64) this
//   follows the i64 rule: NaN gives 0, +inf 255, -inf 0;
// - to bool: != 0.
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
    return math::float_to_int<To>(C(v));
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

// out (f32) = a (f32) + b (H, f16 or bf16): b's runs widened into an L1 buffer by the vectorised
// conversion, kMapChunk at a time, then added.
template <typename H>
void add_widened_cpu(const Loop& loop, const OpArgs&) {
  for_each_run(loop, [&](char* const* p, const int64_t* s, int64_t n) {
    float* out = reinterpret_cast<float*>(p[0]);
    const float* a = reinterpret_cast<const float*>(p[1]);
    const H* b = reinterpret_cast<const H*>(p[2]);
    if (s[0] == 4 && s[1] == 4 && s[2] == int64_t(sizeof(H))) {
      alignas(64) float wide[cpu::kMapChunk];
      for (int64_t i = 0; i < n; i += cpu::kMapChunk) {
        const int64_t m = std::min(cpu::kMapChunk, n - i);
        cpu::to_f32(b + i, wide, m);
#pragma omp simd
        for (int64_t j = 0; j < m; ++j) out[i + j] = a[i + j] + wide[j];
      }
      return;
    }
    for (int64_t i = 0; i < n; ++i)
      *reinterpret_cast<float*>(p[0] + i * s[0]) = *reinterpret_cast<const float*>(p[1] + i * s[1]) +
                                                   float(*reinterpret_cast<const H*>(p[2] + i * s[2]));
  });
}

template <typename T>
void fill_cpu(const Loop& loop, const OpArgs& args) {
  const T v = convert<T>(args.a);
  for_each_run(loop, [&](char* const* p, const int64_t* s, int64_t n) {
    for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
  });
}

// The dtype classes of core/op_list.h on the CPU.
template <typename F>
void types_floating(F f) {
  for_types<float, double, Half, BFloat16>(f);
}
template <typename F>
void types_signed_numeric(F f) {
  for_types<float, double, Half, BFloat16, int64_t, int32_t>(f);
}
template <typename F>
void types_numeric(F f) {
  for_types<float, double, Half, BFloat16, int64_t, int32_t, uint8_t>(f);
}
template <typename F>
void types_all(F f) {
  for_types<float, double, Half, BFloat16, int64_t, int32_t, uint8_t, bool>(f);
}

const bool kRegistered = [] {
#define FRUGAL_REG_UNARY(name, F, dtypes, ...)                                             \
  types_##dtypes([](auto t) {                                                              \
    op_##name.set(DeviceType::CPU, dtype_v<decltype(t)>, unary_cpu<decltype(t), math::F>); \
  });
#define FRUGAL_REG_UNARY_PARAM(name, F, dtypes, ...)                                             \
  types_##dtypes([](auto t) {                                                                    \
    op_##name.set(DeviceType::CPU, dtype_v<decltype(t)>, unary_param_cpu<decltype(t), math::F>); \
  });
#define FRUGAL_REG_BINARY(name, F, dtypes, ...)                                             \
  types_##dtypes([](auto t) {                                                               \
    op_##name.set(DeviceType::CPU, dtype_v<decltype(t)>, binary_cpu<decltype(t), math::F>); \
  });
#define FRUGAL_REG(name, ...) \
  types_all([](auto t) { op_##name.set(DeviceType::CPU, dtype_v<decltype(t)>, name##_cpu<decltype(t)>); });
  FRUGAL_UNARY_OP_LIST(FRUGAL_REG_UNARY)
  FRUGAL_UNARY_PARAM_OP_LIST(FRUGAL_REG_UNARY_PARAM)
  FRUGAL_BINARY_OP_LIST(FRUGAL_REG_BINARY)
  FRUGAL_COMPARE_OP_LIST(FRUGAL_REG)
  FRUGAL_REG(where)
  FRUGAL_REG(cast)
  FRUGAL_REG(fill)
  op_add_widened.set(DeviceType::CPU, DType::F16, add_widened_cpu<Half>);
  op_add_widened.set(DeviceType::CPU, DType::BF16, add_widened_cpu<BFloat16>);
#undef FRUGAL_REG_UNARY
#undef FRUGAL_REG_UNARY_PARAM
#undef FRUGAL_REG_BINARY
#undef FRUGAL_REG
  return true;
}();

}  // namespace
}  // namespace frugal

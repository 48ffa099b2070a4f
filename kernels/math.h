// The elementwise math of frugal, one functor per op of core/op_list.h, written once for every backend: plain
// C++ callable on the host and on a GPU (FRUGAL_HOST_DEVICE), in the compute type C (f32 for f16/bf16
// storage, as everywhere in frugal). The CPU kernels run it on strided, broadcast and f16/bf16 runs
// (contiguous f32/f64 runs may use an Eigen form of the same math, kernels/cpu/elementwise.cpp), the CUDA
// kernels on every element, and the tests evaluate it in f64 as the naive reference. No CUDA or Eigen header.
//
//   math::Gelu f;  float y = f(0.5f);            // one element, as a kernel computes it
//   math::Clamp<double> c(-1, 1);  c(3.0) == 1.0
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#ifdef __CUDACC__
#define FRUGAL_HOST_DEVICE __host__ __device__
#else
#define FRUGAL_HOST_DEVICE
#endif

namespace frugal::math {

// libm by type: the float functions for float (on the device, CUDA's), the double ones for double.
#define FRUGAL_MATH_FN(name, f_name, d_name)                            \
  FRUGAL_HOST_DEVICE inline float name(float x) { return ::f_name(x); } \
  FRUGAL_HOST_DEVICE inline double name(double x) { return ::d_name(x); }
FRUGAL_MATH_FN(exp_, expf, exp)
FRUGAL_MATH_FN(log_, logf, log)
FRUGAL_MATH_FN(sqrt_, sqrtf, sqrt)
FRUGAL_MATH_FN(tanh_, tanhf, tanh)
FRUGAL_MATH_FN(erf_, erff, erf)
FRUGAL_MATH_FN(fabs_, fabsf, fabs)
FRUGAL_MATH_FN(log1p_, log1pf, log1p)
FRUGAL_MATH_FN(sin_, sinf, sin)
FRUGAL_MATH_FN(cos_, cosf, cos)
#undef FRUGAL_MATH_FN
// Note [integer overflow wraps]
// Integer arithmetic that leaves its type's range wraps modulo 2^bits (two's complement), as in PyTorch and
// NumPy: i64 9223372036854775807 + 1 is -9223372036854775808, -(-2^31) in i32 is -2^31, and an i64 sum of
// such values is their sum modulo 2^64 (and so the same in any order). C++ leaves signed overflow undefined
// (UBSan stops on it, and an optimiser may assume it never happens), so the functors below, the integer
// sums (kernels/cpu/reduce.cpp, math::SumReduce on the GPU) and scatter_add / index_add compute signed
// integers in the unsigned type of the same width, where overflow is defined, and convert back (modular
// since C++20); u8's operands promote to int, where one operation cannot overflow, and the result narrows
// modulo 256 as before. bool keeps its logical add and mul.
// The integer types whose arithmetic wraps: all but bool.
template <typename C>
inline constexpr bool kWraps = std::is_integral_v<C> && !std::is_same_v<C, bool>;
template <typename C>
FRUGAL_HOST_DEVICE C wrap_add(C x, C y) {
  using W = std::make_unsigned_t<C>;
  return C(W(x) + W(y));
}
template <typename C>
FRUGAL_HOST_DEVICE C wrap_sub(C x, C y) {
  using W = std::make_unsigned_t<C>;
  return C(W(x) - W(y));
}
template <typename C>
FRUGAL_HOST_DEVICE C wrap_mul(C x, C y) {
  using W = std::make_unsigned_t<C>;
  return C(W(x) * W(y));
}

FRUGAL_HOST_DEVICE inline float pow_(float x, float y) { return ::powf(x, y); }
FRUGAL_HOST_DEVICE inline double pow_(double x, double y) { return ::pow(x, y); }
template <typename C>
FRUGAL_HOST_DEVICE inline bool isnan_(C x) {
  if constexpr (std::is_floating_point_v<C>)
    return x != x;
  else
    return false;
}
// The largest and smallest value of C (infinities for floats), usable in device code.
template <typename C>
FRUGAL_HOST_DEVICE constexpr C lowest_() {
  if constexpr (std::is_floating_point_v<C>)
    return -std::numeric_limits<C>::infinity();
  else
    return std::numeric_limits<C>::lowest();
}
template <typename C>
FRUGAL_HOST_DEVICE constexpr C highest_() {
  if constexpr (std::is_floating_point_v<C>)
    return std::numeric_limits<C>::infinity();
  else
    return std::numeric_limits<C>::max();
}

// A float converted to an integer type as every cast does (Note [float to integer casts] in
// kernels/cpu/elementwise.cpp): truncation toward zero, NaN to 0, saturation beyond i32 / i64, and to u8
// through i64 modulo 256.
template <typename I, typename F>
FRUGAL_HOST_DEVICE I float_to_int(F v) {
  if constexpr (std::is_same_v<I, uint8_t>) {
    return uint8_t(uint64_t(float_to_int<int64_t>(v)));
  } else {
    constexpr F lowest = F(std::numeric_limits<I>::lowest());  // -2^31 or -2^63: exact in float and double
    if (v != v) return 0;
    if (v <= lowest) return std::numeric_limits<I>::lowest();
    if (v >= -lowest) return std::numeric_limits<I>::max();
    return I(v);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The elementwise ops of core/op_list.h, one functor each (the list names it). NaN propagates through relu,
// clamp, maximum and minimum, as in PyTorch.

struct Neg {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    if constexpr (kWraps<C>)
      return wrap_sub(C(0), x);  // Note [integer overflow wraps]
    else
      return -x;
  }
};
struct Abs {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    if constexpr (std::is_floating_point_v<C>)
      return fabs_(x);
    else if constexpr (std::is_unsigned_v<C>)
      return x;
    else
      return x < C(0) ? wrap_sub(C(0), x) : x;  // abs of the most negative value is itself
  }
};
struct Exp {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    return exp_(x);
  }
};
struct Log {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    return log_(x);
  }
};
struct Sqrt {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    return sqrt_(x);
  }
};
struct Rsqrt {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    return C(1) / sqrt_(x);
  }
};
struct Relu {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    return x < C(0) ? C(0) : x;
  }
};
struct Gelu {  // x Phi(x), the erf form
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    return C(0.5) * x * (C(1) + erf_(x * C(0.70710678118654752)));
  }
};
struct GeluTanh {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    return C(0.5) * x * (C(1) + tanh_(C(0.7978845608028654) * (x + C(0.044715) * x * x * x)));
  }
};
struct Sigmoid {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    return C(1) / (C(1) + exp_(-x));
  }
};
struct Tanh {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    return tanh_(x);
  }
};
struct Silu {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    return x / (C(1) + exp_(-x));
  }
};
struct Erf {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    return erf_(x);
  }
};
struct Sin {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    return sin_(x);
  }
};
struct Cos {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    return cos_(x);
  }
};

// The ops with two Scalar parameters are templates on C, built from the parameters (OpArgs a and b) once per
// kernel call.

// A clamp bound in C: infinite bounds become an integer type's extremes, fractional ones truncate toward
// zero.
template <typename C>
C clamp_bound(double v) {
  if constexpr (std::is_integral_v<C>) {
    if (v <= double(std::numeric_limits<C>::lowest())) return std::numeric_limits<C>::lowest();
    if (v >= double(std::numeric_limits<C>::max())) return std::numeric_limits<C>::max();
  }
  return C(v);
}
template <typename C>
struct Clamp {
  C lo, hi;
  Clamp(double a, double b) : lo(clamp_bound<C>(a)), hi(clamp_bound<C>(b)) {}
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    if (isnan_(x)) return x;
    return x < lo ? lo : (x > hi ? hi : x);
  }
};
// PyTorch's softplus: x where beta x > threshold (where log1p(exp(beta x)) / beta equals x in floating
// point), log1p(exp(beta x)) / beta elsewhere.
template <typename C>
struct Softplus {
  C beta, threshold;
  Softplus(double b, double t) : beta(C(b)), threshold(C(t)) {}
  FRUGAL_HOST_DEVICE C operator()(C x) const {
    const C bx = x * beta;
    return bx > threshold ? x : log1p_(exp_(bx)) / beta;
  }
};

struct Add {  // integers wrap (Note [integer overflow wraps])
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x, C y) const {
    if constexpr (kWraps<C>)
      return wrap_add(x, y);
    else
      return C(x + y);
  }
};
struct Sub {  // integers wrap (Note [integer overflow wraps])
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x, C y) const {
    if constexpr (kWraps<C>)
      return wrap_sub(x, y);
    else
      return C(x - y);
  }
};
struct Mul {  // integers wrap (Note [integer overflow wraps])
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x, C y) const {
    if constexpr (kWraps<C>)
      return wrap_mul(x, y);
    else
      return C(x * y);
  }
};
struct Div {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x, C y) const {
    return x / y;
  }
};
// Floats through libm; integers by squaring, with negative exponents giving 0 except for bases 1 and -1 (as
// PyTorch and the CPU kernel), wrapping as the other integer products.
struct Pow {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C base, C exponent) const {
    if constexpr (std::is_floating_point_v<C>) {
      return pow_(base, exponent);
    } else {
      int64_t e = int64_t(exponent);
      if (e < 0) return base == C(1) ? C(1) : (base == C(-1) ? (e % 2 ? C(-1) : C(1)) : C(0));
      C r = 1;  // the products wrap (Note [integer overflow wraps])
      for (; e; e >>= 1, base = wrap_mul(base, base))
        if (e & 1) r = wrap_mul(r, base);
      return r;
    }
  }
};
struct Maximum {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x, C y) const {
    if (isnan_(x) || isnan_(y)) return isnan_(x) ? x : y;
    return x < y ? y : x;
  }
};
struct Minimum {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C x, C y) const {
    if (isnan_(x) || isnan_(y)) return isnan_(x) ? x : y;
    return y < x ? y : x;
  }
};

#define FRUGAL_MATH_COMPARE(Name, op)                    \
  struct Name {                                          \
    template <typename C>                                \
    FRUGAL_HOST_DEVICE bool operator()(C x, C y) const { \
      return x op y;                                     \
    }                                                    \
  };
FRUGAL_MATH_COMPARE(Eq, ==)
FRUGAL_MATH_COMPARE(Ne, !=)
FRUGAL_MATH_COMPARE(Lt, <)
FRUGAL_MATH_COMPARE(Le, <=)
FRUGAL_MATH_COMPARE(Gt, >)
FRUGAL_MATH_COMPARE(Ge, >=)
#undef FRUGAL_MATH_COMPARE

}  // namespace frugal::math

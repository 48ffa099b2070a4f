// DType: the element types a tensor can hold, their names, sizes and promotion rules (NumPy/PyTorch-like).
//
//   DType t = promote_types(DType::I64, DType::F32);  // F32
//   dtype_name(DType::BF16);                           // "bf16"
//   Tensor x = zeros({2, 3}, kBF16);                   // or kBFloat16, as libtorch spells it
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "half.h"

namespace frugal {

enum class DType : uint8_t { F32, F64, F16, BF16, I64, I32, U8, Bool };
inline constexpr int kNumDTypes = 8;

// The dtypes under the names libtorch gives them (torch::kFloat32, torch::kLong, ...), short and long.
inline constexpr DType kF32 = DType::F32, kFloat32 = DType::F32, kFloat = DType::F32;
inline constexpr DType kF64 = DType::F64, kFloat64 = DType::F64, kDouble = DType::F64;
inline constexpr DType kF16 = DType::F16, kFloat16 = DType::F16, kHalf = DType::F16;
inline constexpr DType kBF16 = DType::BF16, kBFloat16 = DType::BF16;
inline constexpr DType kI64 = DType::I64, kInt64 = DType::I64, kLong = DType::I64;
inline constexpr DType kI32 = DType::I32, kInt32 = DType::I32, kInt = DType::I32;
inline constexpr DType kU8 = DType::U8, kUInt8 = DType::U8, kByte = DType::U8;
inline constexpr DType kBool = DType::Bool;

const char* dtype_name(DType t);
DType dtype_from_name(std::string_view name);  // "f32", "float32", "bfloat16", ...; throws DTypeError
int64_t dtype_size(DType t);
bool is_floating(DType t);
bool is_integral(DType t);  // i64, i32, u8 (not bool)
// The dtype a kernel computes and accumulates t in where it widens: f32 for f16 and bf16, t otherwise.
DType compute_dtype(DType t);
// The dtype both operands are converted to for a binary op: bool < u8 < i32 < i64 < f16/bf16 < f32 < f64;
// f16 with bf16 gives f32.
DType promote_types(DType a, DType b);
std::ostream& operator<<(std::ostream& os, DType t);

// C++ type <-> DType.
template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::F64;
};
template <>
struct dtype_of<Half> {
  static constexpr DType value = DType::F16;
};
template <>
struct dtype_of<BFloat16> {
  static constexpr DType value = DType::BF16;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::I64;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::I32;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::U8;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::Bool;
};
template <typename T>
inline constexpr DType dtype_v = dtype_of<T>::value;

// The type arithmetic on T is done in: f32 for the 16-bit floats, T itself otherwise.
template <typename T>
struct acc_type {
  using type = T;
};
template <>
struct acc_type<Half> {
  using type = float;
};
template <>
struct acc_type<BFloat16> {
  using type = float;
};
template <typename T>
using acc_t = typename acc_type<T>::type;

// Calls fn with a value of the C++ type matching t (fn(float{}), fn(Half{}), ...).
template <typename Fn>
decltype(auto) visit_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::F32:
      return fn(float{});
    case DType::F64:
      return fn(double{});
    case DType::F16:
      return fn(Half{});
    case DType::BF16:
      return fn(BFloat16{});
    case DType::I64:
      return fn(int64_t{});
    case DType::I32:
      return fn(int32_t{});
    case DType::U8:
      return fn(uint8_t{});
    case DType::Bool:
      return fn(bool{});
  }
  return fn(float{});  // unreachable: every enumerator is handled above
}

// Throws DTypeError "<what>: expected a floating dtype (...), got <t>".
[[noreturn]] void throw_not_floating(const char* what, DType t);

// visit_dtype over the floating dtypes only (fn(float{}), fn(double{}), fn(Half{}), fn(BFloat16{})); any
// other dtype is a DTypeError that names `what`.
template <typename Fn>
void visit_floating_dtype(DType t, const char* what, Fn&& fn) {
  if (!is_floating(t)) throw_not_floating(what, t);
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      fn(tag);
  });
}

}  // namespace frugal

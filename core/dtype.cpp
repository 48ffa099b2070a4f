// DType names, sizes and the promotion lattice.
#include "core/dtype.h"

#include <cstdlib>

#include "core/error.h"

namespace frugal {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::F64:
      return "f64";
    case DType::F16:
      return "f16";
    case DType::BF16:
      return "bf16";
    case DType::I64:
      return "i64";
    case DType::I32:
      return "i32";
    case DType::U8:
      return "u8";
    case DType::Bool:
      return "bool";
  }
  return "?";
}

DType dtype_from_name(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType t;
  };
  static constexpr Alias kAliases[] = {
      {"f32", DType::F32},     {"float32", DType::F32}, {"float", DType::F32},     {"f64", DType::F64},
      {"float64", DType::F64}, {"double", DType::F64},  {"f16", DType::F16},       {"float16", DType::F16},
      {"half", DType::F16},    {"bf16", DType::BF16},   {"bfloat16", DType::BF16}, {"i64", DType::I64},
      {"int64", DType::I64},   {"i32", DType::I32},     {"int32", DType::I32},     {"u8", DType::U8},
      {"uint8", DType::U8},    {"bool", DType::Bool}};
  for (const auto& a : kAliases)
    if (a.name == name) return a.t;
  throw DTypeError(detail::str_cat("unknown dtype name '", name,
                                   "'; valid names: f32, f64, f16, bf16, i64, i32, u8, bool"));
}

int64_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::F64:
      return 8;
    case DType::F16:
      return 2;
    case DType::BF16:
      return 2;
    case DType::I64:
      return 8;
    case DType::I32:
      return 4;
    case DType::U8:
      return 1;
    case DType::Bool:
      return 1;
  }
  return 0;
}

void throw_not_floating(const char* what, DType t) {
  FRUGAL_CHECK_DTYPE(false, what, ": expected a floating dtype (f32, f64, f16, bf16), got ", dtype_name(t));
  std::abort();  // not reached: the check above throws
}

bool is_floating(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16;
}
bool is_integral(DType t) { return t == DType::I64 || t == DType::I32 || t == DType::U8; }
DType compute_dtype(DType t) { return t == DType::F16 || t == DType::BF16 ? DType::F32 : t; }

namespace {
// Rank in the promotion order; f16 and bf16 share a rank and promote to f32 with each other.
int rank(DType t) {
  switch (t) {
    case DType::Bool:
      return 0;
    case DType::U8:
      return 1;
    case DType::I32:
      return 2;
    case DType::I64:
      return 3;
    case DType::F16:
      return 4;
    case DType::BF16:
      return 4;
    case DType::F32:
      return 5;
    case DType::F64:
      return 6;
  }
  return 0;
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (rank(a) == rank(b)) return DType::F32;  // f16 with bf16
  return rank(a) > rank(b) ? a : b;
}

std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

}  // namespace frugal

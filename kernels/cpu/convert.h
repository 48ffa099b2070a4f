// Conversions of contiguous runs between f32 and the 16-bit floats, for the kernels that widen 16-bit
// operands into f32 blocks (GEMM, convolution) and for the cast op. Bit-exact with core/half.h's scalar
// conversions: round to nearest even, NaN stays NaN (quieted), subnormals kept.
#pragma once

#include <cstdint>

#include "core/half.h"

namespace frugal::cpu {

void to_f32(const Half* in, float* out, int64_t n);
void to_f32(const BFloat16* in, float* out, int64_t n);
void from_f32(const float* in, Half* out, int64_t n);
void from_f32(const float* in, BFloat16* out, int64_t n);

}  // namespace frugal::cpu

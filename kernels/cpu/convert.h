// Conversions of contiguous runs between f32 and the 16-bit floats, for the kernels that widen 16-bit
// operands into f32 blocks (GEMM, convolution), the elementwise kernels' buffers and the cast op; vectorised
// where the build allows. Bit-exact with core/half.h's scalar conversions: round to nearest even, overflow to
// inf, subnormals kept, NaN stays NaN.
#pragma once

#include <cstdint>

#include "core/half.h"

namespace frugal::cpu {

void to_f32(const Half* in, float* out, int64_t n);
void to_f32(const BFloat16* in, float* out, int64_t n);
void from_f32(const float* in, Half* out, int64_t n);
void from_f32(const float* in, BFloat16* out, int64_t n);

// The instruction sets the conversions above use: "avx512bf16+f16c", ..., or "portable".
const char* conversion_isa();
// core/half.h's scalar conversions over runs: what the ones above must match bit for bit.
void to_f32_portable(const Half* in, float* out, int64_t n);
void to_f32_portable(const BFloat16* in, float* out, int64_t n);
void from_f32_portable(const float* in, Half* out, int64_t n);
void from_f32_portable(const float* in, BFloat16* out, int64_t n);

}  // namespace frugal::cpu

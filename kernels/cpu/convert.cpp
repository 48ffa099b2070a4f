// f32 <-> f16 / bf16 over contiguous runs (kernels/cpu/convert.h).
#include "kernels/cpu/convert.h"

namespace frugal::cpu {

void to_f32(const Half* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = detail::half_to_float(in[i].bits);
}
void to_f32(const BFloat16* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = detail::bf16_to_float(in[i].bits);
}
void from_f32(const float* in, Half* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i].bits = detail::float_to_half(in[i]);
}
void from_f32(const float* in, BFloat16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i].bits = detail::float_to_bf16(in[i]);
}

}  // namespace frugal::cpu

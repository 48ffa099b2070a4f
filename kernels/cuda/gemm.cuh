// The cuBLASLt GEMM behind op_gemm (kernels/cuda/gemm.cu) for the other CUDA kernels, with the result's
// dtype separate from the operands': f16/bf16 operands may give an f32 result (the attention scores), as
// cuBLAS computes both in f32.
//
//   gpu::gemm(args, DType::BF16, DType::F32);  // args as for op_gemm; C is f32
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/op_table_linalg.h"

namespace frugal::gpu {

// C = alpha A B + beta C as op_gemm (GemmArgs in core/op_table.h), A and B of ab_dtype (f32, f16, bf16), C of
// c_dtype (ab_dtype or f32), on the current stream of C's device.
void gemm(const GemmArgs& args, DType ab_dtype, DType c_dtype);

// acc (m, n) = x (m, k) w (n, k)^T, all dense row-major, s8 x s8 summed in s32, through cuBLASLt's int8
// GEMM on the current stream of acc's device; false, with nothing launched, where cuBLASLt offers no
// algorithm for the shape and alignment (or k is 0): the caller then runs a kernel of its own.
bool gemm_s8(const int8_t* x, const int8_t* w, int32_t* acc, int64_t m, int64_t k, int64_t n);

}  // namespace frugal::gpu

// The cuBLASLt GEMM behind op_gemm (kernels/cuda/gemm.cu) for the other CUDA kernels, with the result's
// dtype separate from the operands': f16/bf16 operands may give an f32 result (the attention scores), as
// cuBLAS computes both in f32.
//
//   gpu::gemm(args, DType::BF16, DType::F32);  // args as for op_gemm; C is f32
#pragma once

#include "core/dtype.h"
#include "core/op_table_linalg.h"

namespace frugal::gpu {

// C = alpha A B + beta C as op_gemm (GemmArgs in core/op_table.h), A and B of ab_dtype (f32, f16, bf16), C of
// c_dtype (ab_dtype or f32), on the current stream of C's device.
void gemm(const GemmArgs& args, DType ab_dtype, DType c_dtype);

}  // namespace frugal::gpu

// How the CUDA convolution kernels (kernels/cuda/conv.cu) run: through cuDNN when frugal was built with it
// (FRUGAL_CUDNN, kernels/cuda/conv_cudnn.cu), through im2col + the registered cuBLASLt GEMM otherwise and for
// the shapes cuDNN declines; likewise the batch norm (kernels/cuda/batch_norm.cu). Plain C++ (no CUDA
// header), so that tests can switch between the paths.
#pragma once

#include "core/dtype.h"
#include "core/op_table_conv.h"

namespace frugal {

// Whether this build has the cuDNN path.
bool cuda_conv_has_cudnn();
// The registered CUDA convolution kernels use cuDNN (true, the default where it is built in) or the im2col
// fallback (false); for the tests and benchmarks that compare both. A no-op without cuDNN.
void set_cuda_conv_cudnn(bool use);
// The CUDA batch norm's training forward and backward use cuDNN (true, the default where it is built in) or
// frugal's kernels (false; eval mode always runs them). A no-op without cuDNN.
void set_cuda_batch_norm_cudnn(bool use);
// The im2col fallback's column buffer limit per chunk of images (default 256 MiB; at least one image per
// chunk); the tests make it small to run the multi-chunk path.
void set_cuda_conv_im2col_chunk_bytes(int64_t bytes);

namespace gpu {

enum class ConvDirection { Forward, BackwardData, BackwardWeight };

// Runs one direction of a convolution (ConvArgs, core/op_table.h) through cuDNN; false (nothing done) when
// cuDNN cannot take the shape (sizes past its 32-bit limits, no algorithm within the workspace limit).
// Defined in conv_cudnn.cu only in builds with cuDNN.
bool cudnn_conv2d(ConvDirection dir, DType dtype, const ConvArgs& a);

}  // namespace gpu
}  // namespace frugal

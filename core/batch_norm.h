// Fused batch normalisation: its op tables (kernels in kernels/cpu/batch_norm.cpp and kernels/cuda/
// batch_norm.cu) and its forward ops without autograd (the differentiable nn::functional::batch_norm runs
// them, autograd/grad_batch_norm.cpp). Per channel k of x [n, c, hw] (hw the product of the dims after C):
//   training forward: mean[k] = the mean of x[:, k, :], invstd[k] = 1 / sqrt(biased variance + eps), both
//                     written (two passes: the mean, then the centred squares)
//   eval forward:     mean and invstd read (from the running statistics)
//   both:             y = (x - mean[k]) invstd[k] weight[k] + bias[k]
//   backward:         with xh = (x - mean) invstd and m = n * hw, dweight[k] = sum dy xh, dbias[k] = sum dy,
//                     training: dx = weight invstd (dy - dbias[k] / m - xh dweight[k] / m)
//                     eval:     dx = weight invstd dy
// x, y, dy, dx have the table's dtype; weight, bias, mean, invstd, dweight and dbias its compute type (f32
// for f16/bf16). weight and bias may be null (1 and 0); dx, dweight and dbias may be null (not wanted).
#pragma once

#include "op_table.h"
#include "tensor.h"

namespace frugal {

struct BatchNormArgs {
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  void* y = nullptr;         // forward out
  void* mean = nullptr;      // training forward out; otherwise in [c]
  void* invstd = nullptr;    // training forward out; otherwise in [c]
  const void* dy = nullptr;  // backward in
  void* dx = nullptr;        // backward out
  void* dweight = nullptr;   // backward out [c]
  void* dbias = nullptr;     // backward out [c]
  int64_t n = 0, c = 0, hw = 0;
  double eps = 1e-5;
  bool training = true;
};
using BatchNormKernel = void(const BatchNormArgs& args);
extern OpTable<BatchNormKernel> op_batch_norm;
extern OpTable<BatchNormKernel> op_batch_norm_backward;

namespace ops {

// x [N, C, ...] (at least 2-D; any layout); weight, bias [C] or undefined. Training: the batch's statistics
// (more than one value per channel), returned as mean and invstd ([C], the compute type); otherwise
// running_mean and running_var [C] (any floating dtype) give them. y has x's dtype. Running statistics are
// not updated here (nn::functional::batch_norm does that from mean and invstd).
struct BatchNormResult {
  Tensor y, mean, invstd;
};
BatchNormResult batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                           const Tensor& running_mean, const Tensor& running_var, bool training, double eps);
// Its gradients from d y: d x (when need_dx; x's dtype), d weight and d bias (when asked for; the compute
// type). mean and invstd are batch_norm's.
struct BatchNormGrads {
  Tensor dx, dweight, dbias;
};
BatchNormGrads batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& invstd, bool training, double eps,
                                   bool need_dx, bool need_dweight, bool need_dbias);

}  // namespace ops
}  // namespace frugal

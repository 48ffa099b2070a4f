// optim::Adam8bit and optim::AdamW8bit: Adam and AdamW (optim/adam.h, the same formulas and bias
// corrections) whose two moments are stored in 8 bits, as bitsandbytes' block-wise 8-bit optimizers
// (Dettmers et al., "8-bit Optimizers via Block-wise Quantization", 2022): about 2 bytes of state a
// parameter instead of 8.
//
//   optim::AdamW8bit opt(model->parameters(), optim::AdamW8bitOptions(1e-3).weight_decay(0.1));
//   optim::Adam8bit small(params, optim::Adam8bitOptions(1e-3).block_size(256).min_8bit_size(0));
//   opt.zero_grad(); loss.backward(); opt.step();
//
// Each moment of a parameter of n >= min_8bit_size elements is n u8 codes plus one f32 scale per block of
// block_size elements (the last block may be shorter): exp_avg in the signed dynamic code, exp_avg_sq in the
// unsigned one (Note [the dynamic code], kernels/dynamic_code.h); an element's value is code value x its
// block's scale, the block's largest |moment|. State tensors, by name: exp_avg_codes, exp_avg_absmax,
// exp_avg_sq_codes, exp_avg_sq_absmax. A step, one fused kernel per parameter (op_adam8bit_step):
// dequantise, the Adam/AdamW update in f32 (f64 for f64 parameters) from the new unrounded moments, the new
// scales, requantise to the nearest codes. Parameters smaller than min_8bit_size (biases, norms) keep f32
// moments, exp_avg and exp_avg_sq, and are updated by exactly Adam's/AdamW's kernel, as in bitsandbytes.
// f16/bf16 parameters compute in f32 as Adam's do; master_weights(true) keeps f32 copies (Note [master
// weights], optim/optimizer.h). amsgrad is not supported (bitsandbytes' 8-bit Adam has none either).
//
// Note [non-finite 8-bit moments]: a NaN or inf gradient element makes its parameter element NaN or inf, as
// Adam would. A block's scale is its largest finite |moment|, so the element's neighbours keep their
// moments; the element's own moment is stored as 0 (NaN) or the code's end (inf), unlike Adam, which keeps
// the NaN/inf in the moment. A step skipped by amp::GradScaler on overflow changes nothing at all.
#pragma once

#include <utility>

#include "adam.h"
#include "optimizer.h"

namespace frugal::optim {

class Adam8bitOptions : public AdamOptionsBase<Adam8bitOptions> {
 public:
  explicit Adam8bitOptions(double lr = 1e-3) : lr_(lr) {}
  FRUGAL_ARG(double, lr) = 1e-3;
  FRUGAL_ARG(Betas, betas) = std::make_pair(0.9, 0.999);
  FRUGAL_ARG(double, eps) = 1e-8;
  FRUGAL_ARG(double, weight_decay) = 0;
  // Not supported: validate() refuses true (kept so that code written for AdamOptions reads the same).
  FRUGAL_ARG(bool, amsgrad) = false;
  // f32 copies of f16/bf16 parameters (Note [master weights], optim/optimizer.h).
  FRUGAL_ARG(bool, master_weights) = false;
  // Elements that share one f32 scale: a multiple of 64 (a cache line of codes; the GPU's warps) in
  // [64, 4096] (the kernels hold a block's new moments in f32 on the stack or in registers).
  FRUGAL_ARG(int64_t, block_size) = 2048;
  // Parameters with fewer elements keep f32 moments, exactly as Adam; 0 quantises every parameter.
  FRUGAL_ARG(int64_t, min_8bit_size) = 4096;

 public:
  std::vector<HyperParam> hyperparams() override;
  void validate() const override;
};

class AdamW8bitOptions : public AdamOptionsBase<AdamW8bitOptions> {
 public:
  explicit AdamW8bitOptions(double lr = 1e-3) : lr_(lr) {}
  FRUGAL_ARG(double, lr) = 1e-3;
  FRUGAL_ARG(Betas, betas) = std::make_pair(0.9, 0.999);
  FRUGAL_ARG(double, eps) = 1e-8;
  FRUGAL_ARG(double, weight_decay) = 1e-2;
  FRUGAL_ARG(bool, amsgrad) = false;  // not supported, as Adam8bitOptions'
  FRUGAL_ARG(bool, master_weights) = false;
  FRUGAL_ARG(int64_t, block_size) = 2048;
  FRUGAL_ARG(int64_t, min_8bit_size) = 4096;

 public:
  std::vector<HyperParam> hyperparams() override;
  void validate() const override;
};

class Adam8bit : public Optimizer {
 public:
  Adam8bit(std::vector<Tensor> params, const Adam8bitOptions& options);
  Adam8bit(std::vector<ParamGroup> groups, const Adam8bitOptions& defaults);

 protected:
  void update(const OptimizerOptions& options, Tensor& param, const Tensor& grad, ParamState& state) override;
  std::vector<std::string> state_names(const OptimizerOptions& options, const Tensor& param) const override;
  Shape state_shape(const OptimizerOptions& options, const std::string& name,
                    const Tensor& param) const override;
  DType state_dtype_of(const std::string& name, const Tensor& param) const override;
};

class AdamW8bit : public Optimizer {
 public:
  AdamW8bit(std::vector<Tensor> params, const AdamW8bitOptions& options);
  AdamW8bit(std::vector<ParamGroup> groups, const AdamW8bitOptions& defaults);

 protected:
  void update(const OptimizerOptions& options, Tensor& param, const Tensor& grad, ParamState& state) override;
  std::vector<std::string> state_names(const OptimizerOptions& options, const Tensor& param) const override;
  Shape state_shape(const OptimizerOptions& options, const std::string& name,
                    const Tensor& param) const override;
  DType state_dtype_of(const std::string& name, const Tensor& param) const override;
};

}  // namespace frugal::optim

// Gradient clipping over a set of parameters, in place on their .grad, as torch.nn.utils does.
//
//   loss.backward();
//   double norm = optim::clip_grad_norm_(model->parameters(), /*max_norm=*/1.0);
//   optim::clip_grad_value_(model->parameters(), 0.5);
//   opt.step();
#pragma once

#include <vector>

#include "../core/tensor.h"

namespace frugal::optim {

// The norm of all gradients together (as one vector); when it exceeds max_norm every gradient is scaled by
// max_norm / (norm + 1e-6). norm_type is p > 0 or INFINITY (max |g|). Parameters without a gradient are
// skipped; with none, the norm is 0.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);
// Clamps every gradient element into [-clip_value, clip_value].
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

}  // namespace frugal::optim

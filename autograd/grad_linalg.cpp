// Differentiable matmul beside its backward rule (linear, the fused GEMM layer, is in grad_linear.cpp).
#include "amp/autocast.h"
#include "autograd/functions.h"
#include "autograd/replay.h"

namespace frugal {

using autograd::Grads;
using autograd::Node;
using autograd::recorded;

// matmul runs in its low dtype under autocast (Note [autocast policy], amp/autocast.h).
Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  const auto in = amp::autocast("matmul", a_in, b_in);
  const Tensor &a = in[0], &b = in[1];
  Tensor y = autograd::detail::replayable("matmul",
                                          [&] { return ops::matmul(a, b); });  // Note [selective recompute]
  if (Node* n = recorded("matmul", {&a, &b}, y)) {
    n->save(a);
    n->save(b);
    n->backward = [](const Grads& s, const Tensor& g) -> Grads {
      // With 1-D operands made 2-D as in the forward: dA = g B^T, dB = A^T g, then broadcast batch dims
      // summed.
      const Tensor& a = s[0];
      const Tensor& b = s[1];
      const Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
      const Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
      Tensor g2 = a.dim() == 1 ? g.unsqueeze(g.dim() - (b.dim() == 1 ? 0 : 1)) : g;
      if (b.dim() == 1) g2 = g2.unsqueeze(-1);
      const Tensor da = autograd::sum_to(matmul(g2, b2.transpose(-1, -2)), a2.shape()).reshape(a.shape());
      if (b2.dim() == 2 && a2.dim() > 2) {
        // A 2-D b under a batched a (activations times a weight): dB as one GEMM with the batch folded into
        // its reduction, [K, B M] x [B M, N], summed in the GEMM's accumulator (f32 for f16 and bf16) rather
        // than B products each rounded to the dtype and then summed, and with no [B, K, N] buffer.
        int64_t rows = 1;  // B M (not -1: with K or N 0, -1 could be any number)
        for (int64_t d = 0; d + 1 < a2.dim(); ++d) rows *= a2.size(d);
        const Tensor af = a2.reshape({rows, a2.size(-1)}), gf = g2.reshape({rows, g2.size(-1)});
        return {da, matmul(af.transpose(0, 1), gf).reshape(b.shape())};
      }
      const Tensor db = autograd::sum_to(matmul(a2.transpose(-1, -2), g2), b2.shape()).reshape(b.shape());
      return {da, db};
    };
  }
  return y;
}

}  // namespace frugal

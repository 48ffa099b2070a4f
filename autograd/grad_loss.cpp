// The differentiable fused softmax + cross-entropy (kernels: kernels/cpu/cross_entropy.cpp), beside its
// backward rule. nn::functional::cross_entropy_rows checks the arguments and calls it.
#include "autograd/nn_ops.h"
#include "core/memory_history.h"
#include "core/op_table_softmax.h"

namespace frugal::autograd {

Tensor cross_entropy_rows(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                          double label_smoothing) {
  memory::OpScope op_scope("cross_entropy", logits, target);  // Note [op names in the history]
  const DType acc = logits.dtype() == DType::F64 ? DType::F64 : DType::F32;
  const Tensor x = ops::contiguous(logits), t = ops::contiguous(target);
  Tensor loss = empty({logits.size(0)}, TensorOptions(acc).device(logits.device()));
  Tensor lse = empty({logits.size(0)}, TensorOptions(acc).device(logits.device()));
  CrossEntropyArgs a;
  a.logits = x.raw_data();
  a.target = t.data<int64_t>();
  a.loss = loss.raw_data();
  a.lse = lse.raw_data();
  a.rows = x.size(0);
  a.classes = x.size(1);
  a.ignore_index = ignore_index;
  a.label_smoothing = label_smoothing;
  if (a.rows > 0) op_cross_entropy.get(x.device(), x.dtype())(a);
  if (Node* n = recorded("cross_entropy", {&logits}, loss)) {
    n->save(x.detach());
    n->save(t);
    n->save(lse);
    n->backward = [ignore_index, label_smoothing](const Grads& s, const Tensor& g) -> Grads {
      const Tensor &x = s[0], &t = s[1], &lse = s[2];
      const Tensor gc = ops::contiguous(ops::cast(g, lse.dtype()));
      Tensor d = empty(x.shape(), x.options());
      CrossEntropyArgs b;
      b.logits = x.raw_data();
      b.target = t.data<int64_t>();
      b.lse = lse.raw_data();
      b.grad = gc.raw_data();
      b.d_logits = d.raw_data();
      b.rows = x.size(0);
      b.classes = x.size(1);
      b.ignore_index = ignore_index;
      b.label_smoothing = label_smoothing;
      if (b.rows > 0) op_cross_entropy_backward.get(x.device(), x.dtype())(b);
      return {d};
    };
  }
  return loss;
}

}  // namespace frugal::autograd

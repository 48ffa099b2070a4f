// nn::functional losses, and the checks of the fused softmax + cross-entropy op (its forward and backward
// rule are in autograd/grad_loss.cpp). Semantics follow PyTorch's, reductions included.
#include <cmath>

#include "amp/autocast.h"
#include "autograd/nn_ops.h"
#include "nn/functional.h"

namespace frugal::nn::functional {

// Every loss runs in f32 under autocast (Note [autocast policy], amp/autocast.h): its f16/bf16 inputs are
// cast up first, except the logits of the fused cross-entropy, whose kernel computes in f32 from them
// directly.

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::None:
      return "none";
    case Reduction::Mean:
      return "mean";
    case Reduction::Sum:
      return "sum";
    case Reduction::BatchMean:
      return "batchmean";
  }
  return "?";
}

namespace {

Tensor reduce(const Tensor& loss, Reduction r, const char* op) {
  switch (r) {
    case Reduction::None:
      return loss;
    case Reduction::Mean:
      return mean(loss);
    case Reduction::Sum:
      return sum(loss);
    case Reduction::BatchMean:
      break;
  }
  throw Error(detail::str_cat(op, ": reduction 'batchmean' is kl_div's only; use None, Mean or Sum"));
}

void check_floating(const Tensor& t, const char* op, const char* what) {
  FRUGAL_CHECK(t.defined(), op, ": the ", what, " is undefined");
  FRUGAL_CHECK_DTYPE(is_floating(t.dtype()), op, ": the ", what, " must be floating, got ",
                     dtype_name(t.dtype()), " (shape ", t.shape(), ")");
}

void check_same_shape(const Tensor& input, const Tensor& target, const char* op) {
  check_floating(input, op, "input");
  check_floating(target, op, "target");
  FRUGAL_CHECK_SHAPE(input.shape() == target.shape(), op, ": input shape ", input.shape(),
                     " and target shape ", target.shape(), " must be equal");
}

// Class-index losses: logits/log-probs [N, C, d...] and targets [N, d...] (or [C] and a 0-d target), checked.
// Returns the input as [rows, C] (class dim last) and the targets as [rows] i64, and the targets' shape (the
// shape of an unreduced loss).
struct ClassRows {
  Tensor input;   // [rows, C]
  Tensor target;  // [rows] i64
  Shape loss_shape;
};
ClassRows class_rows(const Tensor& input, const Tensor& target, int64_t ignore_index, const char* op) {
  check_floating(input, op, "input");
  FRUGAL_CHECK(target.defined(), op, ": the target is undefined");
  FRUGAL_CHECK_DTYPE(target.dtype() == DType::I64, op, ": the target must hold class indices as i64, got ",
                     dtype_name(target.dtype()), " (shape ", target.shape(),
                     "); class probabilities are not supported");
  FRUGAL_CHECK_T(DeviceError, target.device() == input.device(), op, ": the target is on ", target.device(),
                 " but the input is on ", input.device(), "; move one with .to(device)");
  FRUGAL_CHECK_SHAPE(input.dim() >= 1, op, ": expected input [N, C] or [N, C, d...], got a 0-d tensor");
  const bool unbatched = input.dim() == 1;
  Shape expected;
  if (!unbatched) {
    expected.push_back(input.size(0));
    for (int d = 2; d < input.dim(); ++d) expected.push_back(input.size(d));
  }
  FRUGAL_CHECK_SHAPE(target.shape() == expected, op, ": input shape ", input.shape(),
                     " expects target shape ", expected, " (input without its class dim 1), got ",
                     target.shape());
  const int64_t classes = unbatched ? input.size(0) : input.size(1);
  ClassRows r;
  r.loss_shape = expected;
  r.target = target.reshape({-1});
  if (r.target.numel() > 0) {
    const Tensor real = ops::where(ops::eq(r.target, double(ignore_index)), zeros_like(r.target), r.target);
    const auto [lo, hi] = ops::integer_range(real);  // one wait on a GPU
    FRUGAL_CHECK_INDEX(lo >= 0 && hi < classes, op, ": target ", lo < 0 ? lo : hi, " is out of range for ",
                       classes, " classes (input shape ", input.shape(), "); valid targets are [0, ",
                       classes - 1, "] or ignore_index (", ignore_index, ")");
  }
  if (unbatched) {
    r.input = input.unsqueeze(0);
  } else if (input.dim() == 2) {
    r.input = input;
  } else {  // [N, C, d...] -> [N, d..., C] -> [rows, C]
    Shape perm{0};
    for (int d = 2; d < input.dim(); ++d) perm.push_back(d);
    perm.push_back(1);
    r.input = input.permute(perm).reshape({-1, classes});
  }
  return r;
}

// The dtype cross_entropy returns: the logits' own, or f32 for f16/bf16 logits under autocast.
DType loss_dtype(const Tensor& logits) {
  const bool half = logits.dtype() == DType::F16 || logits.dtype() == DType::BF16;
  return half && amp::is_autocast_enabled() ? DType::F32 : logits.dtype();
}

// Mean over the rows whose target is not ignore_index (nan when there are none, as in PyTorch).
Tensor reduce_rows(const Tensor& rows, const ClassRows& r, Reduction reduction, int64_t ignore_index,
                   const char* op) {
  switch (reduction) {
    case Reduction::None:
      return rows.reshape(r.loss_shape);
    case Reduction::Sum:
      return sum(rows);
    case Reduction::Mean: {
      const Tensor count = ops::cast(ops::sum(ops::ne(r.target, double(ignore_index))), rows.dtype());
      return div(sum(rows), count);
    }
    case Reduction::BatchMean:
      break;
  }
  return reduce(rows, reduction, op);  // throws
}

}  // namespace

Tensor cross_entropy_rows(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                          double label_smoothing) {
  const char* op = "cross_entropy";
  check_floating(logits, op, "logits");
  FRUGAL_CHECK_SHAPE(logits.dim() == 2, op, ": the fused op expects logits [N, C], got shape ",
                     logits.shape());
  FRUGAL_CHECK_SHAPE(
      target.defined() && target.dtype() == DType::I64 && target.shape() == Shape{logits.size(0)}, op,
      ": expected i64 targets of shape [", logits.size(0), "], got ",
      target.defined() ? dtype_name(target.dtype()) : "undefined", " ",
      target.defined() ? target.shape() : Shape{});
  FRUGAL_CHECK(label_smoothing >= 0 && label_smoothing <= 1, op, ": label_smoothing must be in [0, 1], got ",
               label_smoothing);
  FRUGAL_CHECK_T(DeviceError, target.device() == logits.device(), op, ": the targets are on ",
                 target.device(), " but the logits are on ", logits.device(), "; move one with .to(device)");
  return autograd::cross_entropy_rows(logits, target, ignore_index, label_smoothing);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction, int64_t ignore_index,
                     double label_smoothing) {
  const char* op = "cross_entropy";
  FRUGAL_CHECK(label_smoothing >= 0 && label_smoothing <= 1, op, ": label_smoothing must be in [0, 1], got ",
               label_smoothing);
  const ClassRows r = class_rows(logits, target, ignore_index, op);
  const Tensor rows = cross_entropy_rows(r.input, r.target, ignore_index, label_smoothing);
  return reduce_rows(rows, r, reduction, ignore_index, op).to(loss_dtype(logits));
}

Tensor cross_entropy_composite(const Tensor& logits_in, const Tensor& target, Reduction reduction,
                               int64_t ignore_index, double label_smoothing) {
  const Tensor logits = amp::autocast("cross_entropy", logits_in)[0];
  const char* op = "cross_entropy";
  FRUGAL_CHECK(label_smoothing >= 0 && label_smoothing <= 1, op, ": label_smoothing must be in [0, 1], got ",
               label_smoothing);
  const ClassRows r = class_rows(logits, target, ignore_index, op);
  const Tensor x = r.input.dtype() == DType::F64 ? r.input : r.input.to(DType::F32);
  const Tensor lp = log_softmax(x, 1);
  const Tensor valid = ops::ne(r.target, double(ignore_index));
  const Tensor safe = ops::where(valid, r.target, zeros_like(r.target));
  const Tensor zero = scalar_tensor(0, lp.dtype());
  Tensor rows = where(valid, neg(gather(lp, 1, safe.unsqueeze(1)).squeeze(1)), zero);
  if (label_smoothing > 0) {
    const Tensor smooth = where(valid, div(neg(sum(lp, {1})), double(x.size(1))), zero);
    rows = add(mul(rows, 1 - label_smoothing), mul(smooth, label_smoothing));
  }
  return reduce_rows(rows, r, reduction, ignore_index, op).to(logits.dtype());
}

Tensor nll_loss(const Tensor& log_probs_in, const Tensor& target, Reduction reduction, int64_t ignore_index) {
  const char* op = "nll_loss";
  const Tensor log_probs = amp::autocast("nll_loss", log_probs_in)[0];
  const ClassRows r = class_rows(log_probs, target, ignore_index, op);
  const Tensor valid = ops::ne(r.target, double(ignore_index));
  const Tensor safe = ops::where(valid, r.target, zeros_like(r.target));
  const Tensor rows =
      where(valid, neg(gather(r.input, 1, safe.unsqueeze(1)).squeeze(1)), scalar_tensor(0, r.input.dtype()));
  return reduce_rows(rows, r, reduction, ignore_index, op);
}

Tensor mse_loss(const Tensor& input_in, const Tensor& target_in, Reduction reduction) {
  const auto in = amp::autocast("mse_loss", input_in, target_in);
  const Tensor &input = in[0], &target = in[1];
  check_same_shape(input, target, "mse_loss");
  const Tensor d = sub(input, target);
  return reduce(mul(d, d), reduction, "mse_loss");
}

Tensor l1_loss(const Tensor& input_in, const Tensor& target_in, Reduction reduction) {
  const auto in = amp::autocast("l1_loss", input_in, target_in);
  const Tensor &input = in[0], &target = in[1];
  check_same_shape(input, target, "l1_loss");
  return reduce(abs(sub(input, target)), reduction, "l1_loss");
}

Tensor kl_div(const Tensor& input_in, const Tensor& target_in, Reduction reduction, bool log_target) {
  const char* op = "kl_div";
  const auto in = amp::autocast(op, input_in, target_in);
  const Tensor &input = in[0], &target = in[1];
  check_same_shape(input, target, op);
  Tensor pointwise;
  if (log_target) {
    pointwise = mul(exp(target), sub(target, input));
  } else {
    // target * log(target) taken as 0 at target = 0; log reads 1 there so its gradient stays finite.
    const Tensor positive = ops::gt(target, 0.0);
    const Tensor safe = where(positive, target, scalar_tensor(1, target.dtype()));
    pointwise = sub(mul(target, log(safe)), mul(target, input));
  }
  if (reduction == Reduction::BatchMean) {
    FRUGAL_CHECK_SHAPE(input.dim() >= 1, op, ": batchmean needs an input with a batch dim, got a 0-d tensor");
    return div(sum(pointwise), double(input.size(0)));
  }
  return reduce(pointwise, reduction, op);
}

Tensor distillation_loss(const Tensor& student_logits, const Tensor& teacher_logits, const Tensor& targets,
                         double temperature, double alpha) {
  const char* op = "distillation_loss";
  FRUGAL_CHECK(temperature > 0 && std::isfinite(temperature), op, ": temperature must be positive, got ",
               temperature);
  FRUGAL_CHECK(alpha >= 0 && alpha <= 1, op, ": alpha must be in [0, 1], got ", alpha);
  check_floating(student_logits, op, "student's logits");
  check_floating(teacher_logits, op, "teacher's logits");
  FRUGAL_CHECK_SHAPE(student_logits.dim() == 2 && student_logits.shape() == teacher_logits.shape(), op,
                     ": the student's and the teacher's logits must both be [N, C], got ",
                     student_logits.shape(), " and ", teacher_logits.shape());
  const auto in = amp::autocast(op, student_logits, teacher_logits.detach());
  const Tensor soft_student = log_softmax(div(in[0], temperature), 1);
  const Tensor soft_teacher = log_softmax(div(in[1], temperature), 1);
  const Tensor soft = kl_div(soft_student, soft_teacher, Reduction::BatchMean, /*log_target=*/true);
  const Tensor hard = cross_entropy(student_logits, targets);
  return add(mul(soft, alpha * temperature * temperature), mul(hard.to(soft.dtype()), 1 - alpha));
}

Tensor binary_cross_entropy_with_logits(const Tensor& input_in, const Tensor& target_in, Reduction reduction,
                                        const Tensor& pos_weight_in) {
  const char* op = "binary_cross_entropy_with_logits";
  const auto in = amp::autocast(op, input_in, target_in, pos_weight_in);
  const Tensor &input = in[0], &target = in[1], &pos_weight = in[2];
  check_same_shape(input, target, op);
  // log(1 + exp(-|x|)) + max(-x, 0) is log(1 + exp(-x)) without overflow for large |x|.
  const Tensor softplus_neg = add(log(add(exp(neg(abs(input))), 1.0)), relu(neg(input)));
  Tensor loss;
  if (pos_weight.defined()) {
    check_floating(pos_weight, op, "pos_weight");
    FRUGAL_CHECK_SHAPE(input.dim() >= 1 && (pos_weight.dim() <= 1) &&
                           (pos_weight.numel() == 1 || pos_weight.numel() == input.size(-1)),
                       op, ": pos_weight shape ", pos_weight.shape(), " must be [1] or [",
                       input.dim() ? input.size(-1) : 0,
                       "] (one weight per class, the input's last dim; input shape ", input.shape(), ")");
    const Tensor w = add(mul(target, sub(pos_weight, 1.0)), 1.0);
    loss = add(mul(neg(sub(target, 1.0)), input), mul(w, softplus_neg));
  } else {
    loss = add(mul(neg(sub(target, 1.0)), input), softplus_neg);
  }
  return reduce(loss, reduction, op);
}

}  // namespace frugal::nn::functional

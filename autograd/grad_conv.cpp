// Differentiable convolution and pooling (conv2d, max_pool2d, avg_pool2d), each beside its backward rule,
// which calls the backward ops of core/ops.h (first-order only: the rules are not themselves recorded).
#include <tuple>

#include "amp/autocast.h"
#include "autograd/functions.h"
#include "autograd/replay.h"

namespace frugal {

using autograd::Grads;
using autograd::Node;
using autograd::recorded;

namespace {

// conv2d's rule, and conv2d_relu's (relu): then y, the output, is saved for the ReLU's mask first, and d z =
// y > 0 ? d y : 0 goes into the convolution's rule.
void record_conv(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y,
                 Size2 stride, Size2 padding, Size2 dilation, int64_t groups, bool relu) {
  Node* n = recorded(op, {&x, &weight, &bias}, y);
  if (!n) return;
  const bool need_x = autograd::needs_grad({&x}), need_w = autograd::needs_grad({&weight}),
             need_b = autograd::needs_grad({&bias});
  // Save only what the needed gradients read: dx reads the weight, dweight reads x, dbias neither.
  if (relu) n->save_output(y);
  if (need_x) n->save(weight);
  if (need_w) n->save(x);
  const Shape xs = x.shape(), ws = weight.shape();
  n->backward = [=](const Grads& s, const Tensor& g_in) -> Grads {
    const size_t first = relu ? 1 : 0;  // the conv's saved tensors start after y
    const Tensor w = need_x ? s[first] : Tensor();
    const Tensor xin = need_w ? s[first + (need_x ? 1 : 0)] : Tensor();
    ops::ConvGrads r = ops::conv2d_backward(g_in, xin, w, relu ? s[0] : Tensor(), xs, ws, stride, padding,
                                            dilation, groups, need_x, need_w, need_b);
    return {r.dx, r.dweight, r.dbias};
  };
}

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, Size2 stride, Size2 padding,
              Size2 dilation, int64_t groups) {
  // In the autocast dtype under autocast (Note [autocast policy], amp/autocast.h).
  const auto in = amp::autocast("conv2d", x_in, weight_in, bias_in);
  const Tensor &x = in[0], &weight = in[1], &bias = in[2];
  // Unbatched [C, H, W]: a batch of one through differentiable views, so the rule below sees 4-D only.
  if (x.defined() && x.dim() == 3)
    return squeeze(conv2d(unsqueeze(x, 0), weight, bias, stride, padding, dilation, groups), 0);
  // Kept by a recompute segment whose policy says so (Note [selective recompute]).
  Tensor y = autograd::detail::replayable(
      "conv2d", [&] { return ops::conv2d(x, weight, bias, stride, padding, dilation, groups); });
  record_conv("conv2d", x, weight, bias, y, stride, padding, dilation, groups, false);
  return y;
}

Tensor conv2d_relu(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, Size2 stride,
                   Size2 padding, Size2 dilation, int64_t groups) {
  const auto in = amp::autocast("conv2d", x_in, weight_in, bias_in);
  const Tensor &x = in[0], &weight = in[1], &bias = in[2];
  if (x.defined() && x.dim() == 3)
    return squeeze(conv2d_relu(unsqueeze(x, 0), weight, bias, stride, padding, dilation, groups), 0);
  Tensor y = autograd::detail::replayable(
      "conv2d_relu", [&] { return ops::conv2d_relu(x, weight, bias, stride, padding, dilation, groups); });
  record_conv("conv2d_relu", x, weight, bias, y, stride, padding, dilation, groups, true);
  return y;
}

Tensor max_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride, Size2 padding, Size2 dilation) {
  // The indices only for the backward: in inference and evaluation they would be an i64 a window for nothing
  // (W2's evaluation peak held 12 MiB of them).
  if (!autograd::needs_grad({&x})) return ops::max_pool2d(x, kernel, stride, padding, dilation);
  auto [y, indices] = ops::max_pool2d_with_indices(x, kernel, stride, padding, dilation);
  if (Node* n = recorded("max_pool2d", {&x}, y)) {
    n->save(indices);
    const Shape xs = x.shape();
    n->backward = [xs](const Grads& s, const Tensor& g) -> Grads {
      return {ops::max_pool2d_backward(g, s[0], xs)};
    };
  }
  return y;
}

Tensor avg_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride, Size2 padding,
                  bool count_include_pad) {
  Tensor y = ops::avg_pool2d(x, kernel, stride, padding, count_include_pad);
  if (Node* n = recorded("avg_pool2d", {&x}, y)) {
    const Shape xs = x.shape();
    const Size2 st = stride.value_or(kernel);
    n->backward = [=](const Grads&, const Tensor& g) -> Grads {
      return {ops::avg_pool2d_backward(g, xs, kernel, st, padding, count_include_pad)};
    };
  }
  return y;
}

}  // namespace frugal

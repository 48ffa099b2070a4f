// Convolution and pooling ops (conv2d, max_pool2d, avg_pool2d and their backward ops): argument checks with
// PyTorch's semantics, output shapes, and the call into the op table. The kernels are in kernels/cpu/.
#include <atomic>
#include <limits>
#include <string>
#include <tuple>

#include "core/memory_history.h"
#include "core/op_table.h"
#include "core/op_table_conv.h"
#include "core/ops.h"

namespace frugal::ops {

namespace {

// A convolution direction's multiply-adds, twice: each output (or weight) element sums c / groups x kh x kw
// products a pixel (Note [counted work in a dry run], core/estimate.cpp).
double conv_flops(const ConvArgs& a) {
  return 2.0 * double(a.n) * double(a.o) * double(a.oh) * double(a.ow) * double(a.c / a.groups) *
         double(a.kh) * double(a.kw);
}

// The bytes of a's input, weight and output (or their gradients) of `elem` bytes an element: what its
// directions read (Note [counted work in a dry run]).
struct ConvBytes {
  double x, w, y;
};
ConvBytes conv_bytes(const ConvArgs& a, int64_t elem) {
  const double e = double(elem);
  return {double(a.n * a.c * a.h * a.w) * e, double(a.o * (a.c / a.groups) * a.kh * a.kw) * e,
          double(a.n * a.o * a.oh * a.ow) * e};
}

std::string str2(Size2 s) { return detail::str_cat("(", s.h, ", ", s.w, ")"); }

// PyTorch's output size along one dim; 0 or less when the (dilated) kernel does not fit the padded input.
int64_t out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

void check_window_args(const char* op, Size2 stride, Size2 padding, Size2 dilation) {
  FRUGAL_CHECK(stride.h > 0 && stride.w > 0, op, ": stride must be positive, got ", str2(stride));
  FRUGAL_CHECK(padding.h >= 0 && padding.w >= 0, op, ": padding must be non-negative, got ", str2(padding));
  FRUGAL_CHECK(dilation.h > 0 && dilation.w > 0, op, ": dilation must be positive, got ", str2(dilation));
}

// Checks a convolution's shapes and arguments and returns its sizes (pointers unset) and y's shape.
ConvArgs conv_geometry(const char* op, const Shape& x, const Shape& w, Size2 stride, Size2 padding,
                       Size2 dilation, int64_t groups, Shape& y_shape) {
  FRUGAL_CHECK_SHAPE(x.size() == 4, op,
                     ": expected a 4-D input [N, C, H, W] (or 3-D [C, H, W] for conv2d), got shape ", x);
  FRUGAL_CHECK_SHAPE(w.size() == 4, op,
                     ": expected a 4-D weight [out_channels, in_channels / groups, kH, kW], got shape ", w);
  FRUGAL_CHECK(groups > 0, op, ": groups must be positive, got ", groups);
  check_window_args(op, stride, padding, dilation);
  FRUGAL_CHECK_SHAPE(w[1] > 0 && w[2] > 0 && w[3] > 0, op, ": the weight ", w,
                     " has an empty channel or kernel dim; in_channels / groups, kH and kW must be positive");
  FRUGAL_CHECK_SHAPE(w[0] % groups == 0, op, ": out_channels (", w[0], ", weight ", w,
                     ") must be divisible by groups (", groups, ")");
  FRUGAL_CHECK_SHAPE(x[1] == w[1] * groups, op, ": input ", x, " has ", x[1], " channels but weight ", w,
                     " with groups=", groups, " expects ", w[1] * groups,
                     " (in_channels = weight.size(1) * groups)");
  ConvArgs a;
  a.n = x[0];
  a.c = x[1];
  a.h = x[2];
  a.w = x[3];
  a.o = w[0];
  a.kh = w[2];
  a.kw = w[3];
  a.stride_h = stride.h;
  a.stride_w = stride.w;
  a.pad_h = padding.h;
  a.pad_w = padding.w;
  a.dil_h = dilation.h;
  a.dil_w = dilation.w;
  a.groups = groups;
  a.oh = out_size(a.h, a.kh, a.stride_h, a.pad_h, a.dil_h);
  a.ow = out_size(a.w, a.kw, a.stride_w, a.pad_w, a.dil_w);
  FRUGAL_CHECK_SHAPE(a.oh > 0 && a.ow > 0, op, ": the padded input (", a.h + 2 * a.pad_h, " x ",
                     a.w + 2 * a.pad_w, " from input ", x, " and padding ", str2(padding),
                     ") is smaller than the dilated kernel (", a.dil_h * (a.kh - 1) + 1, " x ",
                     a.dil_w * (a.kw - 1) + 1, " from weight ", w, " and dilation ", str2(dilation),
                     "); the output would be empty");
  y_shape = Shape{a.n, a.o, a.oh, a.ow};
  return a;
}

void check_conv_tensor(const char* op, const char* what, const Tensor& t, const Tensor& like,
                       const char* like_what = "the weight") {
  FRUGAL_CHECK(t.defined(), op, ": ", what, " is undefined");
  FRUGAL_CHECK_DTYPE(is_floating(t.dtype()), op, ": expected a floating dtype (f32, f64, f16, bf16), got ",
                     dtype_name(t.dtype()), " for ", what, " of shape ", t.shape());
  FRUGAL_CHECK_DTYPE(t.dtype() == like.dtype(), op, ": dtypes differ: ", what, " is ", dtype_name(t.dtype()),
                     " (shape ", t.shape(), "), ", like_what, " is ", dtype_name(like.dtype()), " (shape ",
                     like.shape(), "); convert one with .to(dtype)");
  FRUGAL_CHECK_T(DeviceError, t.device() == like.device(), op, ": ", what, " is on ", t.device(), " but ",
                 like_what, " is on ", like.device());
}

// f16/bf16 on a device without a native kernel compute in f32 (as matmul does; DESIGN.md, Precision).
template <typename Kernel>
bool via_f32(const OpTable<Kernel>& table, const Tensor& t) {
  return (t.dtype() == DType::F16 || t.dtype() == DType::BF16) && !table.has(t.device(), t.dtype());
}
Tensor to_f32(const Tensor& t) { return t.defined() ? ops::to(t, DType::F32) : t; }
Tensor to_dtype(const Tensor& t, DType dt) { return t.defined() ? ops::to(t, dt) : t; }

}  // namespace

namespace {

// conv2d, and conv2d_relu when relu: the ReLU goes into the kernel on the CPU (and so into the meta kernel
// that stands for it); elsewhere it runs in place after. pool2 (with relu): conv2d_relu_pool2, through its
// fused kernel where the device has one and the output has a window, else conv2d_relu and max_pool2d.
Tensor conv2d_forward(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias, Size2 stride,
                      Size2 padding, Size2 dilation, int64_t groups, bool relu, bool pool2 = false) {
  FRUGAL_CHECK(weight.defined(), op, ": the weight is undefined");
  check_conv_tensor(op, "the input", x, weight);
  check_conv_tensor(op, "the weight", weight, weight);
  // An unbatched input [C, H, W] is a batch of one, as in PyTorch.
  if (x.dim() == 3)
    return ops::squeeze(conv2d_forward(op, ops::unsqueeze(x, 0), weight, bias, stride, padding, dilation,
                                       groups, relu, pool2),
                        0);
  Shape y_shape;
  ConvArgs a = conv_geometry(op, x.shape(), weight.shape(), stride, padding, dilation, groups, y_shape);
  if (bias.defined()) {
    check_conv_tensor(op, "the bias", bias, weight);
    FRUGAL_CHECK_SHAPE(bias.dim() == 1 && bias.size(0) == a.o, op, ": expected a bias of shape [", a.o,
                       "] (out_channels of weight ", weight.shape(), "), got ", bias.shape());
  }
  if (pool2) {
    if (!op_conv2d_relu_pool2.has(x.device(), x.dtype()) || a.oh < 2 || a.ow < 2)
      return max_pool2d(conv2d_forward(op, x, weight, bias, stride, padding, dilation, groups, true), 2);
    y_shape[2] = a.oh / 2;
    y_shape[3] = a.ow / 2;
  }
  if (via_f32(op_conv2d, x))
    return ops::to(
        conv2d_forward(op, to_f32(x), to_f32(weight), to_f32(bias), stride, padding, dilation, groups, relu),
        x.dtype());
  const Tensor xc = ops::contiguous(x), wc = ops::contiguous(weight),
               bc = bias.defined() ? ops::contiguous(bias) : bias;
  Tensor y = empty(y_shape, x.options());
  if (y.numel() == 0) return y;
  a.x = xc.raw_data();
  a.weight = wc.raw_data();
  a.bias = bc.defined() ? bc.raw_data() : nullptr;
  a.y = y.raw_data();
  const DeviceType device = x.device().type;
  a.relu = relu && (device == DeviceType::CPU || device == DeviceType::Meta);
  const ConvBytes bytes = conv_bytes(a, x.element_size());
  detail::count_flops(x.device(), conv_flops(a), bytes.x + bytes.w);
  if (pool2) {
    op_conv2d_relu_pool2.get(x.device(), x.dtype())(a);
    return y;
  }
  op_conv2d.get(x.device(), x.dtype())(a);
  if (relu && !a.relu) relu_(y);
  return y;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Size2 stride, Size2 padding,
              Size2 dilation, int64_t groups) {
  memory::OpScope op_scope("conv2d", x, weight);  // Note [op names in the history]
  return conv2d_forward("conv2d", x, weight, bias, stride, padding, dilation, groups, false);
}

Tensor conv2d_relu(const Tensor& x, const Tensor& weight, const Tensor& bias, Size2 stride, Size2 padding,
                   Size2 dilation, int64_t groups) {
  memory::OpScope op_scope("conv2d_relu", x, weight);  // Note [op names in the history]
  return conv2d_forward("conv2d_relu", x, weight, bias, stride, padding, dilation, groups, true);
}

Tensor conv2d_relu_pool2(const Tensor& x, const Tensor& weight, const Tensor& bias, Size2 stride,
                         Size2 padding, Size2 dilation, int64_t groups) {
  memory::OpScope op_scope("conv2d_relu_pool2", x, weight);  // Note [op names in the history]
  return conv2d_forward("conv2d_relu_pool2", x, weight, bias, stride, padding, dilation, groups, true, true);
}

bool has_conv2d_relu_pool2(Device device, DType dtype) { return op_conv2d_relu_pool2.has(device, dtype); }

Tensor conv2d_backward_data(const Tensor& grad_out, const Tensor& weight, const Shape& x_shape, Size2 stride,
                            Size2 padding, Size2 dilation, int64_t groups) {
  memory::OpScope op_scope("conv2d_backward_data", grad_out, weight);  // Note [op names in the history]
  const char* op = "conv2d_backward_data";
  FRUGAL_CHECK(weight.defined(), op, ": the weight is undefined");
  check_conv_tensor(op, "the output gradient", grad_out, weight);
  Shape y_shape;
  ConvArgs a = conv_geometry(op, x_shape, weight.shape(), stride, padding, dilation, groups, y_shape);
  FRUGAL_CHECK_SHAPE(grad_out.shape() == y_shape, op, ": the output gradient has shape ", grad_out.shape(),
                     " but the convolution's output has shape ", y_shape);
  if (via_f32(op_conv2d_backward_data, weight))
    return ops::to(
        conv2d_backward_data(to_f32(grad_out), to_f32(weight), x_shape, stride, padding, dilation, groups),
        weight.dtype());
  if (grad_out.numel() == 0) return zeros(x_shape, weight.options());
  const Tensor gc = ops::contiguous(grad_out), wc = ops::contiguous(weight);
  Tensor dx = empty(x_shape, weight.options());
  a.dy = gc.raw_data();
  a.weight = wc.raw_data();
  a.dx = dx.raw_data();
  const ConvBytes bytes = conv_bytes(a, weight.element_size());
  detail::count_flops(weight.device(), conv_flops(a), bytes.y + bytes.w);
  op_conv2d_backward_data.get(weight.device(), weight.dtype())(a);
  return dx;
}

std::pair<Tensor, Tensor> conv2d_backward_weight(const Tensor& grad_out, const Tensor& x,
                                                 const Shape& weight_shape, Size2 stride, Size2 padding,
                                                 Size2 dilation, int64_t groups, bool with_bias) {
  memory::OpScope op_scope("conv2d_backward_weight", grad_out, x);  // Note [op names in the history]
  const char* op = "conv2d_backward_weight";
  FRUGAL_CHECK(x.defined(), op, ": the input is undefined");
  check_conv_tensor(op, "the output gradient", grad_out, x);
  Shape y_shape;
  ConvArgs a = conv_geometry(op, x.shape(), weight_shape, stride, padding, dilation, groups, y_shape);
  FRUGAL_CHECK_SHAPE(grad_out.shape() == y_shape, op, ": the output gradient has shape ", grad_out.shape(),
                     " but the convolution's output has shape ", y_shape);
  if (via_f32(op_conv2d_backward_weight, x)) {
    auto [dw, db] = conv2d_backward_weight(to_f32(grad_out), to_f32(x), weight_shape, stride, padding,
                                           dilation, groups, with_bias);
    return {ops::to(dw, x.dtype()), to_dtype(db, x.dtype())};
  }
  if (grad_out.numel() == 0)
    return {zeros(weight_shape, x.options()), with_bias ? zeros({a.o}, x.options()) : Tensor()};
  const Tensor gc = ops::contiguous(grad_out), xc = ops::contiguous(x);
  Tensor dw = empty(weight_shape, x.options());
  Tensor db = with_bias ? empty({a.o}, x.options()) : Tensor();
  a.dy = gc.raw_data();
  a.x = xc.raw_data();
  a.dweight = dw.raw_data();
  a.dbias = with_bias ? db.raw_data() : nullptr;
  const ConvBytes bytes = conv_bytes(a, x.element_size());
  detail::count_flops(x.device(), conv_flops(a), bytes.y + bytes.x);
  op_conv2d_backward_weight.get(x.device(), x.dtype())(a);
  return {dw, db};
}

ConvGrads conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& relu_y,
                          const Shape& x_shape, const Shape& weight_shape, Size2 stride, Size2 padding,
                          Size2 dilation, int64_t groups, bool need_dx, bool need_dweight, bool need_dbias) {
  const char* op = "conv2d_backward";
  FRUGAL_CHECK(grad_out.defined(), op, ": the output gradient is undefined");
  FRUGAL_CHECK(!need_dx || weight.defined(), op, ": d x needs the weight, which is undefined");
  FRUGAL_CHECK(!need_dweight || x.defined(), op, ": d weight needs the input, which is undefined");
  if (relu_y.defined()) {
    FRUGAL_CHECK_SHAPE(relu_y.shape() == grad_out.shape(), op, ": the ReLU's output has shape ",
                       relu_y.shape(), " but the output gradient has shape ", grad_out.shape());
    // relu_backward would convert the gradient to y's dtype, which the convolution's tensors do not share.
    FRUGAL_CHECK_DTYPE(relu_y.dtype() == grad_out.dtype(), op, ": dtypes differ: the ReLU's output is ",
                       dtype_name(relu_y.dtype()), ", the output gradient ", dtype_name(grad_out.dtype()));
    FRUGAL_CHECK_T(DeviceError, relu_y.device() == grad_out.device(), op, ": the ReLU's output is on ",
                   relu_y.device(), " but the output gradient is on ", grad_out.device());
  }
  // The fused kernel takes d weight's call (d bias alone is a sum, and d x alone has nothing to share).
  const Device device = grad_out.device();
  const bool fused = need_dweight && op_conv2d_backward.has(device, grad_out.dtype()) &&
                     x.dtype() == grad_out.dtype() && (!need_dx || weight.dtype() == grad_out.dtype()) &&
                     grad_out.numel() > 0;
  if (!fused) {
    const Tensor g = relu_y.defined() ? relu_backward(grad_out, relu_y) : grad_out;
    ConvGrads r;
    if (need_dx) r.dx = conv2d_backward_data(g, weight, x_shape, stride, padding, dilation, groups);
    if (need_dweight)
      std::tie(r.dweight, r.dbias) =
          conv2d_backward_weight(g, x, weight_shape, stride, padding, dilation, groups, need_dbias);
    else if (need_dbias)
      r.dbias = sum(g, {0, 2, 3});
    return r;
  }
  memory::OpScope op_scope(op, grad_out, x);  // Note [op names in the history]
  check_conv_tensor(op, "the input", x, grad_out, "the output gradient");
  if (need_dx) {
    check_conv_tensor(op, "the weight", weight, grad_out, "the output gradient");
    FRUGAL_CHECK_SHAPE(weight.shape() == weight_shape, op, ": the weight has shape ", weight.shape(),
                       ", expected ", weight_shape);
  }
  FRUGAL_CHECK_SHAPE(x.shape() == x_shape, op, ": the input has shape ", x.shape(), ", expected ", x_shape);
  Shape y_shape;
  ConvArgs a = conv_geometry(op, x_shape, weight_shape, stride, padding, dilation, groups, y_shape);
  FRUGAL_CHECK_SHAPE(grad_out.shape() == y_shape, op, ": the output gradient has shape ", grad_out.shape(),
                     " but the convolution's output has shape ", y_shape);
  const Tensor gc = contiguous(grad_out), xc = contiguous(x), wc = need_dx ? contiguous(weight) : Tensor(),
               yc = relu_y.defined() ? contiguous(relu_y) : Tensor();
  ConvGrads r;
  if (need_dx) r.dx = empty(x_shape, x.options());
  r.dweight = empty(weight_shape, x.options());
  if (need_dbias) r.dbias = empty({a.o}, x.options());
  a.dy = gc.raw_data();
  a.relu_y = yc.defined() ? yc.raw_data() : nullptr;
  a.x = xc.raw_data();
  a.weight = need_dx ? wc.raw_data() : nullptr;
  a.dx = need_dx ? r.dx.raw_data() : nullptr;
  a.dweight = r.dweight.raw_data();
  a.dbias = need_dbias ? r.dbias.raw_data() : nullptr;
  const ConvBytes bytes = conv_bytes(a, x.element_size());  // d weight reads dy and x; d x, dy and w
  detail::count_flops(device, conv_flops(a) * (need_dx ? 2 : 1),
                      bytes.y + bytes.x + (need_dx ? bytes.y + bytes.w : 0.0));
  op_conv2d_backward.get(device, grad_out.dtype())(a);
  return r;
}

namespace {

// Checks a pooling's input and arguments and returns its sizes (pointers unset) and y's shape.
PoolArgs pool_geometry(const char* op, const Shape& x, Size2 kernel, Size2 stride, Size2 padding,
                       Size2 dilation, bool is_max, Shape& y_shape) {
  FRUGAL_CHECK_SHAPE(x.size() == 3 || x.size() == 4, op,
                     ": expected a 3-D [C, H, W] or 4-D [N, C, H, W] input, got shape ", x);
  FRUGAL_CHECK(kernel.h > 0 && kernel.w > 0, op, ": kernel size must be positive, got ", str2(kernel));
  check_window_args(op, stride, padding, dilation);
  const int d = x.size() - 3;
  FRUGAL_CHECK_SHAPE(x[d] > 0 && x[d + 1] > 0 && x[d + 2] > 0, op,
                     ": expected non-empty channel and spatial dims, got input shape ", x);
  // PyTorch's limit: more padding than half the window would make windows of padding only.
  const Size2 eff{dilation.h * (kernel.h - 1) + 1, dilation.w * (kernel.w - 1) + 1};
  const Size2 half = is_max ? Size2{eff.h / 2, eff.w / 2} : Size2{kernel.h / 2, kernel.w / 2};
  FRUGAL_CHECK(padding.h <= half.h && padding.w <= half.w, op, ": padding ", str2(padding),
               " must be at most half the ", is_max ? "effective " : "", "kernel size ",
               str2(is_max ? eff : kernel), ", i.e. at most ", str2(half));
  PoolArgs a;
  a.planes = (d ? x[0] : 1) * x[d];
  a.h = x[d + 1];
  a.w = x[d + 2];
  a.kh = kernel.h;
  a.kw = kernel.w;
  a.stride_h = stride.h;
  a.stride_w = stride.w;
  a.pad_h = padding.h;
  a.pad_w = padding.w;
  a.dil_h = dilation.h;
  a.dil_w = dilation.w;
  a.oh = out_size(a.h, a.kh, a.stride_h, a.pad_h, a.dil_h);
  a.ow = out_size(a.w, a.kw, a.stride_w, a.pad_w, a.dil_w);
  FRUGAL_CHECK_SHAPE(a.oh > 0 && a.ow > 0, op, ": input ", x, " with kernel ", str2(kernel), ", stride ",
                     str2(stride), ", padding ", str2(padding), " and dilation ", str2(dilation),
                     " gives an output of ", a.oh, " x ", a.ow, "; the output size is too small");
  y_shape = x;
  y_shape[d + 1] = a.oh;
  y_shape[d + 2] = a.ow;
  return a;
}

void check_pool_input(const char* op, const Tensor& x) {
  FRUGAL_CHECK(x.defined(), op, ": the input tensor is undefined");
  FRUGAL_CHECK_DTYPE(is_floating(x.dtype()), op, ": expected a floating dtype (f32, f64, f16, bf16), got ",
                     dtype_name(x.dtype()), " (shape ", x.shape(), ")");
}

// max_pool2d with or without the indices (an undefined tensor then).
std::pair<Tensor, Tensor> max_pool2d_impl(const Tensor& x, Size2 kernel, std::optional<Size2> stride,
                                          Size2 padding, Size2 dilation, bool with_indices) {
  memory::OpScope op_scope("max_pool2d", x);  // Note [op names in the history]
  check_pool_input("max_pool2d", x);
  Shape y_shape;
  PoolArgs a = pool_geometry("max_pool2d", x.shape(), kernel, stride.value_or(kernel), padding, dilation,
                             true, y_shape);
  const Tensor xc = ops::contiguous(x);
  // The indices live beside the output, on x's device.
  Tensor y = empty(y_shape, x.options());
  Tensor indices = with_indices ? empty(y_shape, x.options().dtype(DType::I64)) : Tensor();
  if (y.numel() == 0) return {y, indices};
  a.x = xc.raw_data();
  a.y = y.raw_data();
  a.indices = with_indices ? indices.data<int64_t>() : nullptr;
  op_max_pool2d.get(x.device(), x.dtype())(a);
  return {y, indices};
}

}  // namespace

std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, Size2 kernel, std::optional<Size2> stride,
                                                  Size2 padding, Size2 dilation) {
  return max_pool2d_impl(x, kernel, stride, padding, dilation, true);
}

// Without the indices: an i64 a window (twice an f32 output's bytes) that nothing would read.
Tensor max_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride, Size2 padding, Size2 dilation) {
  return max_pool2d_impl(x, kernel, stride, padding, dilation, false).first;
}

Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& x_shape) {
  memory::OpScope op_scope("max_pool2d_backward", grad_out);  // Note [op names in the history]
  const char* op = "max_pool2d_backward";
  check_pool_input(op, grad_out);
  FRUGAL_CHECK(indices.defined() && indices.dtype() == DType::I64, op, ": expected i64 indices");
  FRUGAL_CHECK_T(DeviceError, indices.device() == grad_out.device(), op, ": the indices are on ",
                 indices.device(), " but the output gradient is on ", grad_out.device());
  FRUGAL_CHECK_SHAPE(indices.shape() == grad_out.shape() && (x_shape.size() == 3 || x_shape.size() == 4) &&
                         grad_out.dim() == x_shape.size(),
                     op, ": the output gradient ", grad_out.shape(), ", the indices ", indices.shape(),
                     " and the input shape ", x_shape, " do not belong to one max_pool2d");
  const int d = x_shape.size() - 3;
  for (int i = 0; i <= d; ++i)
    FRUGAL_CHECK_SHAPE(grad_out.size(i) == x_shape[i], op, ": the output gradient ", grad_out.shape(),
                       " and the input shape ", x_shape, " differ in batch or channel dims");
  if (via_f32(op_max_pool2d_backward, grad_out))
    return ops::to(max_pool2d_backward(ops::to(grad_out, DType::F32), indices, x_shape), grad_out.dtype());
  const Tensor gc = ops::contiguous(grad_out), ic = ops::contiguous(indices);
  Tensor dx = empty(x_shape, grad_out.options());
  if (dx.numel() == 0) return dx;
  PoolArgs a;
  a.planes = (d ? x_shape[0] : 1) * x_shape[d];
  a.h = x_shape[d + 1];
  a.w = x_shape[d + 2];
  a.oh = grad_out.size(d + 1);
  a.ow = grad_out.size(d + 2);
  a.dy = gc.raw_data();
  a.indices_in = ic.data<int64_t>();
  a.dx = dx.raw_data();
  constexpr int64_t kNone = std::numeric_limits<int64_t>::min();
  std::atomic<int64_t> bad{kNone};
  a.bad_index = &bad;
  op_max_pool2d_backward.get(grad_out.device(), grad_out.dtype())(a);
  FRUGAL_CHECK_INDEX(bad.load() == kNone, op, ": index ", bad.load(), " is out of range for input planes of ",
                     a.h, " x ", a.w, " (valid: 0 to ", a.h * a.w - 1, ", or -1 for a window with no tap)");
  return dx;
}

Tensor avg_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride, Size2 padding,
                  bool count_include_pad) {
  memory::OpScope op_scope("avg_pool2d", x);  // Note [op names in the history]
  check_pool_input("avg_pool2d", x);
  Shape y_shape;
  PoolArgs a =
      pool_geometry("avg_pool2d", x.shape(), kernel, stride.value_or(kernel), padding, 1, false, y_shape);
  a.count_include_pad = count_include_pad;
  const Tensor xc = ops::contiguous(x);
  Tensor y = empty(y_shape, x.options());
  if (y.numel() == 0) return y;
  a.x = xc.raw_data();
  a.y = y.raw_data();
  op_avg_pool2d.get(x.device(), x.dtype())(a);
  return y;
}

Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& x_shape, Size2 kernel, Size2 stride,
                           Size2 padding, bool count_include_pad) {
  memory::OpScope op_scope("avg_pool2d_backward", grad_out);  // Note [op names in the history]
  const char* op = "avg_pool2d_backward";
  check_pool_input(op, grad_out);
  Shape y_shape;
  PoolArgs a = pool_geometry(op, x_shape, kernel, stride, padding, 1, false, y_shape);
  FRUGAL_CHECK_SHAPE(grad_out.shape() == y_shape, op, ": the output gradient has shape ", grad_out.shape(),
                     " but avg_pool2d's output has shape ", y_shape);
  a.count_include_pad = count_include_pad;
  if (via_f32(op_avg_pool2d_backward, grad_out))
    return ops::to(avg_pool2d_backward(ops::to(grad_out, DType::F32), x_shape, kernel, stride, padding,
                                       count_include_pad),
                   grad_out.dtype());
  const Tensor gc = ops::contiguous(grad_out);
  Tensor dx = empty(x_shape, grad_out.options());
  if (dx.numel() == 0) return dx;
  a.dy = gc.raw_data();
  a.dx = dx.raw_data();
  op_avg_pool2d_backward.get(grad_out.device(), grad_out.dtype())(a);
  return dx;
}

}  // namespace frugal::ops

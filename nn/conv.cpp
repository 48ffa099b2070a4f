// nn::Conv2d, nn::MaxPool2d, nn::AvgPool2d: argument checks at construction, PyTorch's initialisation, and
// forward through the differentiable ops.
#include "nn/conv.h"

#include <cmath>

#include "nn/init.h"

namespace frugal::nn {

namespace {

std::string str2(Size2 s) { return detail::str_cat("(", s.h, ", ", s.w, ")"); }

void check_window(const char* module, Size2 kernel, Size2 stride, Size2 padding, Size2 dilation) {
  FRUGAL_CHECK(kernel.h > 0 && kernel.w > 0, module, ": kernel_size must be positive, got ", str2(kernel));
  FRUGAL_CHECK(stride.h > 0 && stride.w > 0, module, ": stride must be positive, got ", str2(stride));
  FRUGAL_CHECK(padding.h >= 0 && padding.w >= 0, module, ": padding must be non-negative, got ",
               str2(padding));
  FRUGAL_CHECK(dilation.h > 0 && dilation.w > 0, module, ": dilation must be positive, got ", str2(dilation));
}

// U(-bound, bound) as a fresh leaf, filled in place by nn::init (no temporary beside it), from the default
// generator.
Tensor uniform_init(const Shape& shape, double bound) {
  Tensor t = empty(shape);
  init::uniform_(t, -bound, bound);
  return t;
}

}  // namespace

Conv2dImpl::Conv2dImpl(const Conv2dOptions& o) : Module("Conv2d"), options_(o) {
  FRUGAL_CHECK(o.in_channels() > 0 && o.out_channels() > 0, "Conv2d: in_channels (", o.in_channels(),
               ") and out_channels (", o.out_channels(), ") must be positive");
  FRUGAL_CHECK(o.groups() > 0 && o.in_channels() % o.groups() == 0 && o.out_channels() % o.groups() == 0,
               "Conv2d: groups (", o.groups(), ") must be positive and divide in_channels (", o.in_channels(),
               ") and out_channels (", o.out_channels(), ")");
  check_window("Conv2d", o.kernel_size(), o.stride(), o.padding(), o.dilation());
  const Size2 k = o.kernel_size();
  const int64_t fan_in = o.in_channels() / o.groups() * k.h * k.w;
  const double bound = 1.0 / std::sqrt(double(fan_in));
  weight = register_parameter(
      "weight", uniform_init({o.out_channels(), o.in_channels() / o.groups(), k.h, k.w}, bound));
  if (o.bias()) bias = register_parameter("bias", uniform_init({o.out_channels()}, bound));
}

Tensor Conv2dImpl::forward(const Tensor& x) {
  apply_masks();
  const auto& o = options_;
  return conv2d(x, weight, bias, o.stride(), o.padding(), o.dilation(), o.groups());
}

MaxPool2dImpl::MaxPool2dImpl(Size2 kernel_size, std::optional<Size2> stride, Size2 padding, Size2 dilation)
    : Module("MaxPool2d"),
      kernel_size_(kernel_size),
      stride_(stride.value_or(kernel_size)),
      padding_(padding),
      dilation_(dilation) {
  check_window("MaxPool2d", kernel_size_, stride_, padding_, dilation_);
}

Tensor MaxPool2dImpl::forward(const Tensor& x) {
  return max_pool2d(x, kernel_size_, stride_, padding_, dilation_);
}

AvgPool2dImpl::AvgPool2dImpl(Size2 kernel_size, std::optional<Size2> stride, Size2 padding,
                             bool count_include_pad)
    : Module("AvgPool2d"),
      kernel_size_(kernel_size),
      stride_(stride.value_or(kernel_size)),
      padding_(padding),
      count_include_pad_(count_include_pad) {
  check_window("AvgPool2d", kernel_size_, stride_, padding_, 1);
}

Tensor AvgPool2dImpl::forward(const Tensor& x) {
  return avg_pool2d(x, kernel_size_, stride_, padding_, count_include_pad_);
}

}  // namespace frugal::nn

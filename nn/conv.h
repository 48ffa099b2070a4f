// Convolution and pooling layers in the style of PyTorch's C++ frontend: nn::Conv2d, nn::MaxPool2d,
// nn::AvgPool2d. The math is in conv2d / max_pool2d / avg_pool2d (autograd/functions.h).
//
//   nn::Conv2d conv(nn::Conv2dOptions(1, 32, 3).padding(1));  // a holder of an nn::Conv2dImpl
//   nn::MaxPool2d pool(2);
//   Tensor y = pool(relu(conv(x)));  // x [64, 1, 28, 28] -> y [64, 32, 14, 14]; conv->weight [32, 1, 3, 3]
#pragma once

#include <optional>

#include "module.h"
#include "module_holder.h"

namespace frugal::nn {

// Conv2dOptions(in_channels, out_channels,
// kernel_size).stride(2).padding(1).dilation(1).groups(1).bias(true); each setter returns the options, each
// getter (no argument) the value.
class Conv2dOptions {
 public:
  Conv2dOptions(int64_t in_channels, int64_t out_channels, Size2 kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  Conv2dOptions& stride(Size2 v) { return set(stride_, v); }
  Conv2dOptions& padding(Size2 v) { return set(padding_, v); }
  Conv2dOptions& dilation(Size2 v) { return set(dilation_, v); }
  Conv2dOptions& groups(int64_t v) { return set(groups_, v); }
  Conv2dOptions& bias(bool v) { return set(bias_, v); }
  int64_t in_channels() const { return in_channels_; }
  int64_t out_channels() const { return out_channels_; }
  Size2 kernel_size() const { return kernel_size_; }
  Size2 stride() const { return stride_; }
  Size2 padding() const { return padding_; }
  Size2 dilation() const { return dilation_; }
  int64_t groups() const { return groups_; }
  bool bias() const { return bias_; }

 private:
  template <typename T>
  Conv2dOptions& set(T& field, T v) {
    field = v;
    return *this;
  }
  int64_t in_channels_, out_channels_;
  Size2 kernel_size_;
  Size2 stride_ = 1, padding_ = 0, dilation_ = 1;
  int64_t groups_ = 1;
  bool bias_ = true;
};

// y = conv2d(x, weight, bias): weight [out, in / groups, kH, kW] and bias [out] start as PyTorch's do,
// U(-b, b) with b = 1 / sqrt(fan_in), fan_in = in / groups * kH * kW.
class Conv2dImpl : public Module {
 public:
  explicit Conv2dImpl(const Conv2dOptions& options);
  Conv2dImpl(int64_t in_channels, int64_t out_channels, Size2 kernel_size)
      : Conv2dImpl(Conv2dOptions(in_channels, out_channels, kernel_size)) {}
  Tensor forward(const Tensor& x) override;
  const Conv2dOptions& options() const { return options_; }

  Tensor weight;
  Tensor bias;  // undefined with bias(false)

 private:
  Conv2dOptions options_;
};
FRUGAL_MODULE(Conv2d);

// Max over windows; stride defaults to the kernel size.
class MaxPool2dImpl : public Module {
 public:
  explicit MaxPool2dImpl(Size2 kernel_size, std::optional<Size2> stride = {}, Size2 padding = 0,
                         Size2 dilation = 1);
  Tensor forward(const Tensor& x) override;
  Size2 kernel_size() const { return kernel_size_; }
  Size2 stride() const { return stride_; }
  Size2 padding() const { return padding_; }
  Size2 dilation() const { return dilation_; }

 private:
  Size2 kernel_size_, stride_, padding_, dilation_;
};
FRUGAL_MODULE(MaxPool2d);

// Mean over windows; stride defaults to the kernel size; count_include_pad counts padding in the divisor.
class AvgPool2dImpl : public Module {
 public:
  explicit AvgPool2dImpl(Size2 kernel_size, std::optional<Size2> stride = {}, Size2 padding = 0,
                         bool count_include_pad = true);
  Tensor forward(const Tensor& x) override;

 private:
  Size2 kernel_size_, stride_, padding_;
  bool count_include_pad_;
};
FRUGAL_MODULE(AvgPool2d);

}  // namespace frugal::nn

// FRUGAL_ARG: an option with a chaining setter and a getter, as libtorch's TORCH_ARG, for the options structs
// of layers and optimizers:
//   struct LinearOptions { FRUGAL_ARG(bool, bias) = true; };   LinearOptions().bias(false).bias() == false
#pragma once

#define FRUGAL_ARG(T, name)                 \
 public:                                    \
  auto& name(const T& value) {              \
    name##_ = value;                        \
    return *this;                           \
  }                                         \
  const T& name() const { return name##_; } \
                                            \
 private:                                   \
  T name##_

// A user's program against an installed frugal: only the installed headers and frugal::frugal are visible.
// Its own src/ folder has core/, nn/ and io/ headers named like frugal's (core/device.h, nn/module.h, ...),
// and is first on the include path: frugal's headers must still find their own.
#include <frugal/frugal.h>

#include <iostream>

#include "core/app.h"

// Installed, the headers are reachable only under frugal/.
#if __has_include(<frugal.h>) || __has_include(<optim/adam.h>)
#error "frugal's headers are reachable without the frugal/ prefix"
#endif

int main() {
  frugal::Tensor x = frugal::ones({2, 3});
  const float total = x.sum().item<float>();
  std::cout << app::name() << " ok " << total << "\n";
  // The installed CUDA backend (where one was built) loads from beside the installed libfrugal.so.
  const bool cuda_backend = frugal::load_backend(frugal::DeviceType::CUDA);
  std::cout << "cuda_backend=" << cuda_backend << " " << frugal::backend_error(frugal::DeviceType::CUDA)
            << "\n";
  return total == 6.0f ? 0 : 1;
}

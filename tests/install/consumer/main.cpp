// A user's program against an installed frugal: only the installed headers and frugal::frugal are visible.
// Its own src/ folder has core/, nn/ and io/ headers named like frugal's (core/device.h, nn/module.h, ...),
// and is first on the include path: frugal's headers must still find their own.
#include <frugal/frugal.h>

#include <iostream>

#include "core/app.h"

// Installed, the headers are reachable only under frugal/.
static_assert(!__has_include(<frugal.h>), "frugal.h is reachable without the frugal/ prefix");
static_assert(!__has_include(<optim/adam.h>), "optim/adam.h is reachable without the frugal/ prefix");

int main() {
  frugal::Tensor x = frugal::ones({2, 3});
  const float total = x.sum().item<float>();
  std::cout << app::name() << " ok " << total << "\n";
  return total == 6.0f ? 0 : 1;
}

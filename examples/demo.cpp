// The demo scripts/run.sh runs: tensors, views and a matmul, then where the memory goes (tags, a limit, the
// summary). It uses only the public header, as a user's program does.
#include <iostream>

#include <frugal/frugal.h>

using namespace frugal;

int main() try {
  manual_seed(0);
  std::cout << std::boolalpha << "frugal demo (" << num_threads() << " threads)\n\n";

  // Tensors and views: a view shares its storage with the tensor it looks at; no bytes move.
  Tensor x = randn({4, 3});
  Tensor xt = x.t();
  std::cout << "x =\n" << x << "\n";
  std::cout << "x.t() shares x's storage: " << (xt.storage() == x.storage())
            << ", is contiguous: " << xt.is_contiguous() << "\n\n";

  // One layer by hand. The tag names its allocations in the memory statistics.
  Tensor w = randn({3, 2});
  Tensor y;
  {
    memory::Tag tag("forward/layer1");
    y = relu(matmul(x, w) + 1.0);
  }
  std::cout << "y = relu(x @ w + 1) =\n" << y << "\nsum(y) = " << y.sum().item<float>() << "\n\n";

  // A memory limit lets the CPU play a small GPU: a request beyond it throws OutOfMemoryError, which says
  // why.
  memory::set_memory_limit(kCPU, 64 << 20);
  try {
    Tensor too_big = empty({8192, 8192});  // 256 MiB of f32
    std::cout << "unexpected: a 256 MiB tensor fit under a 64 MiB limit\n";
    return 1;
  } catch (const OutOfMemoryError& e) {
    std::cout << "a 256 MiB tensor under a 64 MiB limit:\n" << e.what() << "\n\n";
  }

  // The summary lists the live bytes per tag; here two 1 MiB tensors of "forward/block3" are alive.
  {
    memory::Tag tag("forward/block3");
    Tensor a = randn({512, 512});
    Tensor b = matmul(a, a);
    std::cout << "memory while forward/block3's tensors are alive:\n" << memory::memory_summary(kCPU) << "\n";
  }
  std::cout << "peak allocated: " << memory::format_bytes(memory::stats(kCPU).allocated.peak) << "\n";
  return 0;
} catch (const Error& e) {
  std::cerr << "demo: " << e.what() << "\n";
  return 1;
}

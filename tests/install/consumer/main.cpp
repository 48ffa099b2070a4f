// A user's program against an installed frugal: only the installed headers and frugal::frugal are visible.
#include <frugal.h>

#include <iostream>

int main() {
  frugal::Tensor x = frugal::ones({2, 3});
  const float total = x.sum().item<float>();
  std::cout << "consumer ok " << total << "\n";
  return total == 6.0f ? 0 : 1;
}

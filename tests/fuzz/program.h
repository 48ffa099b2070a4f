// The input of the program-shaped fuzz targets ("ops", "kernels"), read a byte at a time; past its end every
// byte reads as 0, so that every input is a whole program.
#pragma once

#include <cstddef>
#include <cstdint>

namespace frugal::fuzz {

class Program {
 public:
  Program(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t byte() { return p_ < end_ ? *p_++ : 0; }
  bool done() const { return p_ >= end_; }
  int64_t in(int64_t lo, int64_t hi) { return lo + int64_t(byte()) % (hi - lo + 1); }  // [lo, hi]

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace frugal::fuzz

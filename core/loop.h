// Loop: how an elementwise kernel walks its operands. The op layer broadcasts every operand to the output's
// shape (stride 0 where broadcast), drops size-1 dims and merges dims that are contiguous in every operand,
// so most loops end up one long run. A kernel only sees pointers, sizes and byte strides (STYLE.md rule 4).
//
//   Loop loop = make_loop({&out, &a, &b});
//   for_each_run(loop, [&](char* const* p, const int64_t* stride, int64_t n) { ...n elements... });
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>

#include "parallel.h"
#include "shape.h"

namespace frugal {

class Tensor;

inline constexpr int kMaxOperands = 4;

struct Loop {
  int ndim = 0;  // >= 1; sizes[ndim - 1] is the innermost run
  int nops = 0;  // operand 0 is the output (a kernel may write another: op_gelu_and_backward's y)
  int64_t numel = 0;
  std::array<int64_t, kMaxDims> sizes{};
  std::array<std::array<int64_t, kMaxDims>, kMaxOperands> strides{};  // bytes
  std::array<char*, kMaxOperands> data{};
};

// Extra numbers an elementwise op needs (clamp bounds, a gelu form...).
struct OpArgs {
  double a = 0;
  double b = 0;
};

// operands[0] is the output; the others must broadcast to its shape (checked by the caller).
Loop make_loop(std::initializer_list<const Tensor*> operands);

// Calls f(ptrs, inner_strides, n) for each innermost run in the linear index range [begin, end).
template <typename F>
void loop_range(const Loop& L, int64_t begin, int64_t end, F&& f) {
  const int nd = L.ndim, inner = nd - 1;
  const int64_t run = L.sizes[inner];
  std::array<int64_t, kMaxDims> idx{};
  int64_t rem = begin;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = rem % L.sizes[d];
    rem /= L.sizes[d];
  }
  std::array<int64_t, kMaxOperands> inner_strides{};
  for (int k = 0; k < L.nops; ++k) inner_strides[k] = L.strides[k][inner];
  int64_t pos = begin;
  while (pos < end) {
    std::array<char*, kMaxOperands> p{};
    for (int k = 0; k < L.nops; ++k) {
      char* q = L.data[k];
      for (int d = 0; d < nd; ++d) q += idx[d] * L.strides[k][d];
      p[k] = q;
    }
    const int64_t n = std::min(run - idx[inner], end - pos);
    f(p.data(), inner_strides.data(), n);
    pos += n;
    idx[inner] += n;
    for (int d = inner; d > 0 && idx[d] >= L.sizes[d]; --d) {
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
}

// loop_range over the whole loop, split across threads when it is larger than the grain.
template <typename F>
void for_each_run(const Loop& L, F&& f, int64_t grain = parallel_grain()) {
  parallel_for(0, L.numel, grain, [&](int64_t b, int64_t e) { loop_range(L, b, e, f); });
}

}  // namespace frugal

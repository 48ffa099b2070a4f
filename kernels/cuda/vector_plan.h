// Whether an elementwise loop can run on 16-byte vectors (kernels/cuda/elementwise.cuh), decided on the host
// from the Loop alone, so that it is tested on machines without a GPU (tests/cuda/test_vector_plan.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/loop.h"

namespace frugal::gpu {

struct VectorPlan {
  bool vectorizable = false;
  unsigned repeats = 0;  // bit k - 1: input k does not move along the innermost dim (one element, repeated)
};

// Vectors of `vec` elements along the innermost dim: every operand k (element size sizes[k], operand 0 the
// output) steps by its element size there, or, for an input, not at all; every vector start is aligned to the
// vector's size (the element's, for a repeated input); the innermost size is a multiple of vec, except for a
// 1-D loop, whose ragged tail the kernel takes one element at a time.
inline VectorPlan plan_vectors(const Loop& loop, int vec, const size_t* sizes, int nops) {
  VectorPlan p;
  const int inner = loop.ndim - 1;
  p.vectorizable = loop.ndim == 1 || loop.sizes[size_t(inner)] % vec == 0;
  for (int k = 0; k < nops && p.vectorizable; ++k) {
    const int64_t s = loop.strides[size_t(k)][size_t(inner)];
    const int64_t align = s == 0 ? int64_t(sizes[k]) : vec * int64_t(sizes[k]);
    if (s == 0 && k > 0)
      p.repeats |= 1u << (k - 1);
    else if (s != int64_t(sizes[k]) && !(loop.numel == 1 && loop.ndim == 1))
      p.vectorizable = false;
    p.vectorizable =
        p.vectorizable && reinterpret_cast<uintptr_t>(loop.data[size_t(k)]) % uint64_t(align) == 0;
    for (int d = 0; d < inner; ++d)
      p.vectorizable = p.vectorizable && loop.strides[size_t(k)][size_t(d)] % align == 0;
  }
  return p;
}

}  // namespace frugal::gpu

// Working memory for the CPU kernels that need it (GEMM tiles, im2col columns, oneDNN's scratchpads and
// reordered operands): U8 tensors from the arena, so the bytes show in the memory statistics under the
// caller's tag and go back to the cache when the kernel returns. Take it outside parallel regions.
#pragma once

#include <algorithm>

#include "core/tensor.h"

namespace frugal::cpu {

inline Tensor workspace(int64_t bytes) { return empty({std::max<int64_t>(bytes, 1)}, DType::U8); }

// The same bytes on the meta device, for a table's meta kernel (core/op_table.h): a dry run sees the working
// memory the cpu kernel will take, in the same order, while the kernel runs.
inline Tensor meta_workspace(int64_t bytes) {
  return empty({std::max<int64_t>(bytes, 1)}, TensorOptions(DType::U8).device(kMeta));
}

}  // namespace frugal::cpu

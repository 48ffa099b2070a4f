// The op tables of one family, with their argument structs. Copies that change place or layout: between
// devices, and the blocked 2-D transpose (core/ops_linalg.cpp, kernels/*/copy.*, kernels/*/transpose.*). The
// tables themselves are core/op_table.h's OpTable; a family's header is included only by its ops, its kernels
// and their tests, so a new op of one family recompiles only that family.
#pragma once

#include "op_table.h"

namespace frugal {

// Copies nbytes of contiguous bytes between two devices (cpu <-> cuda:N), returning once they are in place.
// Keyed by the type of the device that is not the cpu, one kernel for every dtype (the bytes cross as they
// are): ops::copy_ converts dtype, shape and layout on one side first.
struct DeviceCopyArgs {
  void* dst = nullptr;
  const void* src = nullptr;
  int64_t nbytes = 0;
  Device dst_device, src_device;
};
using DeviceCopyKernel = void(const DeviceCopyArgs& args);
extern OpTable<DeviceCopyKernel> op_copy_between_devices;

// out [cols, rows] = in [rows, cols]^T, in's rows in_stride elements apart (unit column stride), out
// contiguous. Keyed by the dtype (the copy is by element). Cache-blocked: a strided element-by-element copy
// misses the cache once per element of the transposed side.
struct TransposeArgs {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t rows = 0, cols = 0, in_stride = 0;
};
using TransposeKernel = void(const TransposeArgs& args);
extern OpTable<TransposeKernel> op_transpose2d;

}  // namespace frugal

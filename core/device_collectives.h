// A device's collective library (NCCL for CUDA), as the device's backend registers it: libfrugal_cuda.so,
// loaded on demand, registers a table of plain functions when it loads (kernels/cuda/nccl.cu), and dist's
// collectives (dist/dist.h) call them for that device's tensors. Here in core, as the op tables are, so that
// neither the backend nor dist includes the other. The communicator is made on the first collective of a
// device's tensors: rank 0 makes an id, MPI broadcasts its bytes, every rank joins with it.
#pragma once

#include <cstdint>
#include <vector>

#include "device.h"
#include "dtype.h"

namespace frugal {

struct DeviceCollectives {
  const char* library;                // "NCCL 2.27.3", for messages
  std::vector<uint8_t> (*make_id)();  // on rank 0: a new communicator id
  void (*join)(const std::vector<uint8_t>& id, int rank, int size, int device);
  void (*leave)();  // at dist::finalize()
  // Each returns once the result is in place (in the device's current stream's order, then synchronised).
  // count in elements of dtype (f32 or f64) for reductions, in bytes otherwise.
  void (*all_reduce)(void* data, int64_t count, DType dtype, bool max);
  void (*broadcast)(void* data, int64_t bytes, int root);
  void (*all_gather)(const void* in, void* out, int64_t bytes_per_rank);
  void (*reduce_scatter)(const void* in, void* out, int64_t count_per_rank, DType dtype, bool max);
};

// Called by a backend as it loads; a null table removes it.
void register_device_collectives(DeviceType type, const DeviceCollectives* table);
// The table registered for `type`, or null (no backend loaded, or one without a collective library).
const DeviceCollectives* device_collectives(DeviceType type);

}  // namespace frugal

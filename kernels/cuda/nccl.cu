// dist's collectives for CUDA tensors through NCCL (core/device_collectives.h), registered as the backend
// loads. Built with NCCL where CMake found it (FRUGAL_HAVE_NCCL); without it nothing is registered, and dist
// says a CUDA collective needs NCCL.
#include "core/device_collectives.h"

#if FRUGAL_HAVE_NCCL
#include <nccl.h>

#include <cstring>
#include <string>

#include "core/error.h"
#include "kernels/cuda/runtime.h"

namespace frugal::gpu {
namespace {

struct Communicator {
  ncclComm_t comm = nullptr;
  int device = -1;
};
Communicator g_comm;  // one a process: dist's world

void check(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess) return;
  throw Error(frugal::detail::str_cat("dist: ", what, " failed: ", ncclGetErrorString(rc)));
}

ncclComm_t comm(const char* op) {
  FRUGAL_CHECK(g_comm.comm != nullptr, "dist::", op, ": NCCL has no communicator (internal: join first)");
  return g_comm.comm;
}

ncclDataType_t nccl_type(DType d) {
  FRUGAL_CHECK_DTYPE(d == DType::F32 || d == DType::F64, "dist: NCCL reduces f32 or f64 here, got ",
                     dtype_name(d));
  return d == DType::F32 ? ncclFloat32 : ncclFloat64;
}

// Runs on the device's current stream, then waits for it: the collectives are synchronous for the caller.
template <typename F>
void on_stream(const char* what, F&& fn) {
  DeviceGuard guard(g_comm.device);
  cudaStream_t stream = current_stream(g_comm.device);
  check(fn(stream), what);
  FRUGAL_CUDA_CHECK(cudaStreamSynchronize(stream));
}

std::vector<uint8_t> make_id() {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  std::vector<uint8_t> bytes(sizeof(id.internal));
  std::memcpy(bytes.data(), id.internal, bytes.size());
  return bytes;
}

void join(const std::vector<uint8_t>& bytes, int rank, int size, int device) {
  ncclUniqueId id;
  FRUGAL_CHECK(bytes.size() == sizeof(id.internal), "dist: a NCCL id of ", bytes.size(), " bytes");
  std::memcpy(id.internal, bytes.data(), bytes.size());
  DeviceGuard guard(device);
  check(ncclCommInitRank(&g_comm.comm, size, id, rank), "ncclCommInitRank");
  g_comm.device = device;
}

void leave() {
  if (g_comm.comm) ncclCommDestroy(g_comm.comm);
  g_comm = {};
}

void all_reduce(void* data, int64_t count, DType dtype, bool max) {
  on_stream("ncclAllReduce", [&](cudaStream_t s) {
    return ncclAllReduce(data, data, size_t(count), nccl_type(dtype), max ? ncclMax : ncclSum,
                         comm("all_reduce"), s);
  });
}

void broadcast(void* data, int64_t bytes, int root) {
  on_stream("ncclBroadcast", [&](cudaStream_t s) {
    return ncclBroadcast(data, data, size_t(bytes), ncclUint8, root, comm("broadcast"), s);
  });
}

void all_gather(const void* in, void* out, int64_t bytes_per_rank) {
  on_stream("ncclAllGather", [&](cudaStream_t s) {
    return ncclAllGather(in, out, size_t(bytes_per_rank), ncclUint8, comm("all_gather"), s);
  });
}

void reduce_scatter(const void* in, void* out, int64_t count_per_rank, DType dtype, bool max) {
  on_stream("ncclReduceScatter", [&](cudaStream_t s) {
    return ncclReduceScatter(in, out, size_t(count_per_rank), nccl_type(dtype), max ? ncclMax : ncclSum,
                             comm("reduce_scatter"), s);
  });
}

std::string version() {
  int v = 0;
  ncclGetVersion(&v);
  return frugal::detail::str_cat("NCCL ", v / 10000, ".", v / 100 % 100, ".", v % 100);
}

[[maybe_unused]] const bool kRegistered = [] {
  static const std::string name = version();
  static const DeviceCollectives table{name.c_str(), make_id,   join,       leave,
                                       all_reduce,   broadcast, all_gather, reduce_scatter};
  register_device_collectives(DeviceType::CUDA, &table);
  return true;
}();

}  // namespace
}  // namespace frugal::gpu
#endif

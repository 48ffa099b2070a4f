// Convolution through cuDNN's convolution API (kernels/cuda/conv.h; compiled to nothing without
// FRUGAL_HAVE_CUDNN). f32 runs with FMA math only (no TF32: results match the CPU's to f32 rounding),
// f16/bf16 on tensor cores; all accumulate in f32. The algorithm for each problem is cuDNN's first heuristic
// choice (cudnnGet*Algorithm_v7: no trial runs, no memory of its own) whose workspace fits
// kMaxWorkspaceBytes, remembered per shape and dtype; the workspace comes from the arena for the call.
#ifdef FRUGAL_HAVE_CUDNN

#include <algorithm>
#include <array>
#include <climits>
#include <map>
#include <mutex>

#include "core/storage.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/conv.h"
#include "kernels/cuda/cudnn_util.h"

namespace frugal::gpu {

void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file, int line) {
  throw DeviceError(detail::str_cat("cuDNN error: ", call, " failed at ", file, ":", line, ": ",
                                    cudnnGetErrorString(status)));
}

cudnnDataType_t cudnn_data_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return CUDNN_DATA_FLOAT;
    case DType::F16:
      return CUDNN_DATA_HALF;
    case DType::BF16:
      return CUDNN_DATA_BFLOAT16;
    default:
      break;
  }
  throw DeviceError(detail::str_cat("cuDNN: frugal does not use cuDNN for dtype ", dtype_name(dtype)));
}

namespace {

constexpr int kMaxDevices = 64;
constexpr size_t kMaxWorkspaceBytes = size_t(1) << 30;

using Key = std::array<int64_t, 16>;

// What was chosen for one problem: no algorithm (use the fallback), or an algorithm, its math type and the
// workspace it needs.
struct Choice {
  bool ok = false;
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};

// Per device: the handle (its stream set for each call under the lock, which also guards the choices made).
struct Context {
  std::once_flag created;
  std::mutex mu;
  cudnnHandle_t handle = nullptr;
  std::map<Key, Choice> choices;
};

Context& context(int device) {
  // Never destroyed: the driver may be gone by the time static destructors run.
  static auto* all = new std::array<Context, kMaxDevices>();
  FRUGAL_CHECK_T(DeviceError, device >= 0 && device < kMaxDevices, "cuda:", device,
                 " is beyond the devices frugal supports");
  Context& c = (*all)[size_t(device)];
  std::call_once(c.created, [&] { FRUGAL_CUDNN_CHECK(cudnnCreate(&c.handle)); });
  return c;
}

bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

// The descriptors of one convolution problem.
struct Problem {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
};

void describe(Problem& p, DType dtype, const ConvArgs& a) {
  const cudnnDataType_t type = cudnn_data_type(dtype);
  p.x.set(dtype, int(a.n), int(a.c), int(a.h), int(a.w));
  p.y.set(dtype, int(a.n), int(a.o), int(a.oh), int(a.ow));
  FRUGAL_CUDNN_CHECK(cudnnSetFilter4dDescriptor(p.w.d, type, CUDNN_TENSOR_NCHW, int(a.o), int(a.c / a.groups),
                                                int(a.kh), int(a.kw)));
  FRUGAL_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(p.conv.d, int(a.pad_h), int(a.pad_w), int(a.stride_h),
                                                     int(a.stride_w), int(a.dil_h), int(a.dil_w),
                                                     CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  FRUGAL_CUDNN_CHECK(cudnnSetConvolutionGroupCount(p.conv.d, int(a.groups)));
  FRUGAL_CUDNN_CHECK(
      cudnnSetConvolutionMathType(p.conv.d, dtype == DType::F32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
}

// The first of cuDNN's ranked candidates that succeeded, fits the workspace limit and, for f32, uses no
// tensor-op (TF32) math.
template <typename Perf>
Choice pick(const Perf* perf, int count, DType dtype) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > kMaxWorkspaceBytes) continue;
    if (dtype == DType::F32 && perf[i].mathType != CUDNN_FMA_MATH && perf[i].mathType != CUDNN_DEFAULT_MATH)
      continue;
    // f32 keeps FMA math: CUDNN_DEFAULT_MATH would allow TF32 on Ampere and later.
    return {true, int(perf[i].algo), dtype == DType::F32 ? CUDNN_FMA_MATH : perf[i].mathType, perf[i].memory};
  }
  return {};
}

Choice choose(cudnnHandle_t h, const Problem& p, ConvDirection dir, DType dtype) {
  Choice c;
  if (dir == ConvDirection::Forward) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int count = 0;
    FRUGAL_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
        h, p.x.d, p.w.d, p.conv.d, p.y.d, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf));
    c = pick(perf, count, dtype);
  } else if (dir == ConvDirection::BackwardData) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int count = 0;
    FRUGAL_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, p.w.d, p.y.d, p.conv.d, p.x.d, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf));
    c = pick(perf, count, dtype);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int count = 0;
    FRUGAL_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, p.x.d, p.y.d, p.conv.d, p.w.d, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf));
    c = pick(perf, count, dtype);
  }
  if (!c.ok) return c;
  // The ranked list's memory is an estimate; the size query for the chosen algorithm is what cuDNN checks.
  FRUGAL_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv.d, c.math));
  size_t bytes = 0;
  if (dir == ConvDirection::Forward)
    FRUGAL_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, p.x.d, p.w.d, p.conv.d, p.y.d,
                                                               cudnnConvolutionFwdAlgo_t(c.algo), &bytes));
  else if (dir == ConvDirection::BackwardData)
    FRUGAL_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
        h, p.w.d, p.y.d, p.conv.d, p.x.d, cudnnConvolutionBwdDataAlgo_t(c.algo), &bytes));
  else
    FRUGAL_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, p.x.d, p.y.d, p.conv.d, p.w.d, cudnnConvolutionBwdFilterAlgo_t(c.algo), &bytes));
  c.workspace = bytes;
  return c;
}

}  // namespace

CudnnHandle cudnn_handle(int device, cudaStream_t stream) {
  Context& ctx = context(device);
  CudnnHandle h{std::unique_lock(ctx.mu), ctx.handle};
  FRUGAL_CUDNN_CHECK(cudnnSetStream(h.handle, stream));
  return h;
}

bool cudnn_conv2d(ConvDirection dir, DType dtype, const ConvArgs& a) {
  // cuDNN's 4-D descriptors take int sizes, and its kernels index tensors of fewer than 2^31 elements.
  for (int64_t v : {a.n, a.c, a.h, a.w, a.o, a.kh, a.kw, a.oh, a.ow, a.stride_h, a.stride_w, a.pad_h, a.pad_w,
                    a.dil_h, a.dil_w, a.groups, a.n * a.c * a.h * a.w, a.n * a.o * a.oh * a.ow,
                    a.o * (a.c / a.groups) * a.kh * a.kw})
    if (!fits_int(v)) return false;
  const void* out = dir == ConvDirection::Forward        ? a.y
                    : dir == ConvDirection::BackwardData ? a.dx
                                                         : a.dweight;
  LaunchOn on(out);
  Context& ctx = context(on.device);
  const CudnnHandle h = cudnn_handle(on.device, on.stream);  // holds ctx.mu
  Problem p;
  describe(p, dtype, a);
  const Key key{int64_t(dir), int64_t(dtype), a.n,        a.c,     a.h,     a.w,     a.o,     a.kh,
                a.kw,         a.stride_h,     a.stride_w, a.pad_h, a.pad_w, a.dil_h, a.dil_w, a.groups};
  auto it = ctx.choices.find(key);
  if (it == ctx.choices.end()) it = ctx.choices.emplace(key, choose(h.handle, p, dir, dtype)).first;
  const Choice& c = it->second;
  if (!c.ok) return false;
  FRUGAL_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv.d, c.math));
  // Working memory from the arena, returned to its cache (on this stream) when the call has been issued.
  Storage workspace(int64_t(std::max<size_t>(c.workspace, 1)), cuda(on.device));
  const float one = 1, zero = 0;
  if (dir == ConvDirection::Forward) {
    FRUGAL_CUDNN_CHECK(cudnnConvolutionForward(h.handle, &one, p.x.d, a.x, p.w.d, a.weight, p.conv.d,
                                               cudnnConvolutionFwdAlgo_t(c.algo), workspace.data(),
                                               c.workspace, &zero, p.y.d, a.y));
    if (a.bias) {
      TensorDesc b;
      b.set(dtype, 1, int(a.o), 1, 1);
      FRUGAL_CUDNN_CHECK(cudnnAddTensor(h.handle, &one, b.d, a.bias, &one, p.y.d, a.y));
    }
  } else if (dir == ConvDirection::BackwardData) {
    FRUGAL_CUDNN_CHECK(cudnnConvolutionBackwardData(h.handle, &one, p.w.d, a.weight, p.y.d, a.dy, p.conv.d,
                                                    cudnnConvolutionBwdDataAlgo_t(c.algo), workspace.data(),
                                                    c.workspace, &zero, p.x.d, a.dx));
  } else {
    FRUGAL_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
        h.handle, &one, p.x.d, a.x, p.y.d, a.dy, p.conv.d, cudnnConvolutionBwdFilterAlgo_t(c.algo),
        workspace.data(), c.workspace, &zero, p.w.d, a.dweight));
    if (a.dbias) {
      TensorDesc b;
      b.set(dtype, 1, int(a.o), 1, 1);
      FRUGAL_CUDNN_CHECK(cudnnConvolutionBackwardBias(h.handle, &one, p.y.d, a.dy, &zero, b.d, a.dbias));
    }
  }
  return true;
}

}  // namespace frugal::gpu

#endif  // FRUGAL_HAVE_CUDNN

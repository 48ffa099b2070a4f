// CUDA GEMM (op_gemm, GemmArgs in core/op_table.h) through cuBLASLt: f32, and f16/bf16 on tensor cores, all
// accumulating in f32 (no TF32: f32 results match the CPU's to f32 rounding), batched with strides (a batch
// stride of 0 broadcasts an operand). Falls back to cublasGemmStridedBatchedEx when cuBLASLt offers no
// algorithm for a layout. And the s8 x s8 -> s32 GEMM of QuantizedLinear (gemm_s8, kernels/cuda/quant.cu).
//
// Row-major C = A B is the column-major C^T = B^T A^T: cuBLAS's "A" is our B and its "B" our A, each either
// as stored (unit column stride) or transposed (unit row stride).
#include <cublasLt.h>
#include <cublas_v2.h>

#include <array>
#include <memory>
#include <mutex>

#include "core/op_table_linalg.h"
#include "core/storage.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/plan_cache.h"

namespace frugal {
namespace {

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) [[likely]]
    return;
  throw DeviceError(detail::str_cat("cuBLAS error: ", call, " failed at ", file, ":", line, ": ",
                                    cublasGetStatusName(status), " (", cublasGetStatusString(status), ")"));
}
#define FRUGAL_CUBLAS_CHECK(call) check_cublas((call), #call, __FILE__, __LINE__)

constexpr int kMaxDevices = 64;
constexpr int64_t kWorkspaceBytes = 32 << 20;  // what cuBLAS itself reserves on Hopper
// Plans kept per device: a training step uses a few dozen shapes; an LRU bound keeps a long run over varying
// shapes (sequence lengths, last batches) from growing the cache without end.
constexpr size_t kPlansPerDevice = 256;

// One operand in cuBLAS's terms: column-major rows x cols with leading dimension ld, used as is or
// transposed, and its batch stride (elements).
struct Operand {
  cublasOperation_t op;
  int64_t rows, cols, ld, batch_stride;
};

// X (r x c, row-major strides row/col, one of them 1) as cuBLAS sees X^T.
Operand transposed_view(int64_t r, int64_t c, int64_t row_stride, int64_t col_stride, int64_t batch_stride) {
  if (col_stride == 1) return {CUBLAS_OP_N, c, r, row_stride, batch_stride};  // X^T is column-major c x r
  return {CUBLAS_OP_T, r, c, col_stride, batch_stride};                       // X is column-major r x c
}

// The largest power of two (up to 256) dividing the address: cuBLASLt picks algorithms by it.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align) align /= 2;
  return align;
}

cudaDataType_t data_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::F16:
      return CUDA_R_16F;
    case DType::BF16:
      return CUDA_R_16BF;
    default:
      throw DeviceError(detail::str_cat("matmul on a GPU: no cuBLAS GEMM for ", dtype_name(t)));
  }
}

// One problem's cuBLASLt descriptors and the algorithm chosen for them, made once and kept in the device's
// cache (a destroy cannot usefully fail: its status is ignored). use_lt false: cuBLASLt offers no algorithm
// for the layout, and cuBLAS runs it.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  bool use_lt = false;
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { FRUGAL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p)); }
  ~Preference() { cublasLtMatmulPreferenceDestroy(p); }
  void set(cublasLtMatmulPreferenceAttributes_t attr, const void* value, size_t size) {
    FRUGAL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, value, size));
  }
};

void make_layout(cublasLtMatrixLayout_t* layout, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                 int64_t batch, int64_t batch_stride) {
  FRUGAL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout, type, uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    FRUGAL_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    FRUGAL_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                         &batch_stride, sizeof(batch_stride)));
  }
}

// Per device: the handles, the workspace (from the arena, kept for the process) and the plans made per
// problem: descriptors, layouts and the heuristic's algorithm (a heuristic query costs more than a small
// GEMM).
struct Context {
  std::once_flag created;
  std::mutex mu;
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
  void* workspace = nullptr;
  // The workspace is shared by every stream: work on a new stream waits for the previous stream's GEMMs.
  cudaStream_t last_stream = nullptr;
  cudaEvent_t stream_switch = nullptr;
  gpu::LruCache<gpu::GemmPlanKey, std::unique_ptr<Plan>, gpu::GemmPlanKeyHash> plans{kPlansPerDevice};
};

Context& context(int device) {
  // Never destroyed: the driver may be gone by the time static destructors run.
  static auto* all = new std::array<Context, kMaxDevices>();
  FRUGAL_CHECK_T(DeviceError, device >= 0 && device < kMaxDevices, "cuda:", device,
                 " is beyond the devices frugal supports");
  Context& c = (*all)[size_t(device)];
  std::call_once(c.created, [&] {
    FRUGAL_CUBLAS_CHECK(cublasLtCreate(&c.lt));
    FRUGAL_CUBLAS_CHECK(cublasCreate(&c.blas));
    memory::Tag tag("cublas workspace");
    // Leaked on purpose, like the contexts: it shows in the arena's statistics under its tag.
    c.workspace = (new Storage(kWorkspaceBytes, cuda(device)))->data();
    FRUGAL_CUBLAS_CHECK(cublasSetWorkspace(c.blas, c.workspace, size_t(kWorkspaceBytes)));
    FRUGAL_CUDA_CHECK(cudaEventCreateWithFlags(&c.stream_switch, cudaEventDisableTiming));
  });
  return c;
}

// The descriptors and layouts of key's problem (ca, cb: its operands), and the heuristic's algorithm for
// them.
std::unique_ptr<Plan> make_plan(const Context& ctx, const gpu::GemmPlanKey& key, const Operand& ca,
                                const Operand& cb) {
  auto plan = std::make_unique<Plan>();
  const auto type = cudaDataType_t(key.ab_type), c_type = cudaDataType_t(key.c_type);
  // s8 operands accumulate in s32, with s32 alpha and beta (gemm_s8); the floating types in f32.
  const bool int8 = type == CUDA_R_8I;
  FRUGAL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, int8 ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F,
                                               int8 ? CUDA_R_32I : CUDA_R_32F));
  FRUGAL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ca.op, sizeof(ca.op)));
  FRUGAL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &cb.op, sizeof(cb.op)));
  const auto epilogue = cublasLtEpilogue_t(key.epilogue);
  FRUGAL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  make_layout(&plan->a, type, ca.rows, ca.cols, ca.ld, key.batch, ca.batch_stride);
  make_layout(&plan->b, type, cb.rows, cb.cols, cb.ld, key.batch, cb.batch_stride);
  make_layout(&plan->c, c_type, key.m, key.n, key.ldc, key.batch, key.stride_c);

  Preference pref;
  const uint64_t workspace = uint64_t(key.workspace_bytes);
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_a, sizeof(key.align_a));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_b, sizeof(key.align_b));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_c, sizeof(key.align_c));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_c, sizeof(key.align_c));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  // Not checked on purpose: a layout no algorithm supports is an answer (use cuBLAS), not an error.
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(ctx.lt, plan->op, plan->a, plan->b, plan->c,
                                                               plan->c, pref.p, 1, &result, &found);
  plan->use_lt = status == CUBLAS_STATUS_SUCCESS && found > 0;
  plan->algo = result.algo;
  return plan;
}

// key's plan from the cache (made on a miss), with on `stream` waiting for the GEMMs of the stream that used
// the workspace last. Under ctx.mu.
const Plan& plan_on_stream(Context& ctx, const gpu::GemmPlanKey& key, const Operand& ca, const Operand& cb,
                           cudaStream_t stream) {
  if (stream != ctx.last_stream) {
    FRUGAL_CUDA_CHECK(cudaEventRecord(ctx.stream_switch, ctx.last_stream));
    FRUGAL_CUDA_CHECK(cudaStreamWaitEvent(stream, ctx.stream_switch, 0));
    ctx.last_stream = stream;
  }
  std::unique_ptr<Plan>* cached = ctx.plans.find(key);
  return cached ? **cached : *ctx.plans.insert(key, make_plan(ctx, key, ca, cb));
}

}  // namespace

namespace gpu {

bool gemm_s8(const int8_t* x, const int8_t* w, int32_t* acc, int64_t m, int64_t k, int64_t n) {
  if (m <= 0 || n <= 0 || k <= 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return false;
  gpu::LaunchOn on(acc);
  Context& ctx = context(on.device);
  // cuBLAS's A is w as stored, column-major k x n, used transposed; its B is x, column-major k x m; its C is
  // acc, column-major n x m: the "TN" layout cuBLASLt's int8 kernels take.
  const Operand ca{CUBLAS_OP_T, k, n, k, 0}, cb{CUBLAS_OP_N, k, m, k, 0};
  const GemmPlanKey key{.device = on.device,
                        .ab_type = int(CUDA_R_8I),
                        .c_type = int(CUDA_R_32I),
                        .op_a = int(ca.op),
                        .op_b = int(cb.op),
                        .m = n,
                        .n = m,
                        .k = k,
                        .lda = k,
                        .ldb = k,
                        .ldc = n,
                        .batch = 1,
                        .align_a = alignment_of(w),
                        .align_b = alignment_of(x),
                        .align_c = alignment_of(acc),
                        .epilogue = int(CUBLASLT_EPILOGUE_DEFAULT),
                        .workspace_bytes = kWorkspaceBytes};
  std::lock_guard lock(ctx.mu);
  const Plan& plan = plan_on_stream(ctx, key, ca, cb, on.stream);
  if (!plan.use_lt) return false;
  const int32_t alpha = 1, beta = 0;
  // A status other than success (a layout the chosen algorithm turns down at run time) launches nothing:
  // the caller's own kernel then computes acc.
  return cublasLtMatmul(ctx.lt, plan.op, &alpha, w, plan.a, x, plan.b, &beta, acc, plan.c, acc, plan.c,
                        &plan.algo, ctx.workspace, size_t(kWorkspaceBytes),
                        on.stream) == CUBLAS_STATUS_SUCCESS;
}

void gemm(const GemmArgs& g, DType ab_dtype, DType c_dtype) {
  if (g.batch == 0 || g.m == 0 || g.n == 0) return;
  FRUGAL_CHECK_T(DeviceError,
                 g.batch <= INT32_MAX && g.m <= INT32_MAX && g.n <= INT32_MAX && g.k <= INT32_MAX,
                 "matmul on a GPU: sizes m=", g.m, " n=", g.n, " k=", g.k, " batch=", g.batch,
                 " exceed cuBLAS's 32-bit limits");
  gpu::LaunchOn on(g.c);
  Context& ctx = context(on.device);
  // cuBLAS's A is our B^T (n x k), its B our A^T (k x m), its C our C^T (n x m, ld c_row).
  const Operand ca = transposed_view(g.k, g.n, g.b_row, g.b_col, g.b_batch);
  const Operand cb = transposed_view(g.m, g.k, g.a_row, g.a_col, g.a_batch);
  const cudaDataType_t type = data_type(ab_dtype), c_type = data_type(c_dtype);
  FRUGAL_CHECK_T(DeviceError, c_type == type || c_type == CUDA_R_32F,
                 "matmul on a GPU: ", dtype_name(ab_dtype), " operands into a ", dtype_name(c_dtype),
                 " result are not supported");
  const float alpha = g.alpha, beta = g.beta;
  const GemmPlanKey key{.device = on.device,
                        .ab_type = int(type),
                        .c_type = int(c_type),
                        .op_a = int(ca.op),
                        .op_b = int(cb.op),
                        .m = g.n,
                        .n = g.m,
                        .k = g.k,
                        .lda = ca.ld,
                        .ldb = cb.ld,
                        .ldc = g.c_row,
                        .batch = g.batch,
                        .stride_a = ca.batch_stride,
                        .stride_b = cb.batch_stride,
                        .stride_c = g.c_batch,
                        .align_a = alignment_of(g.b),
                        .align_b = alignment_of(g.a),
                        .align_c = alignment_of(g.c),
                        .beta_nonzero = beta != 0,
                        .epilogue = int(CUBLASLT_EPILOGUE_DEFAULT),
                        .workspace_bytes = kWorkspaceBytes};

  std::lock_guard lock(ctx.mu);  // the workspace and the plans are shared
  const Plan& plan = plan_on_stream(ctx, key, ca, cb, on.stream);
  if (plan.use_lt) {
    FRUGAL_CUBLAS_CHECK(cublasLtMatmul(ctx.lt, plan.op, &alpha, g.b, plan.a, g.a, plan.b, &beta, g.c, plan.c,
                                       g.c, plan.c, &plan.algo, ctx.workspace, size_t(kWorkspaceBytes),
                                       on.stream));
    return;
  }
  FRUGAL_CUBLAS_CHECK(cublasSetStream(ctx.blas, on.stream));
  FRUGAL_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      ctx.blas, ca.op, cb.op, int(g.n), int(g.m), int(g.k), &alpha, g.b, type, int(ca.ld), ca.batch_stride,
      g.a, type, int(cb.ld), cb.batch_stride, &beta, g.c, c_type, int(g.c_row), g.c_batch, int(g.batch),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace gpu

namespace {

template <typename T>
void gemm_cuda(const GemmArgs& g) {
  gpu::gemm(g, dtype_v<T>, dtype_v<T>);
}

[[maybe_unused]] const bool kRegistered = [] {
  op_gemm.set(DeviceType::CUDA, DType::F32, gemm_cuda<float>);
  op_gemm.set(DeviceType::CUDA, DType::F16, gemm_cuda<Half>);
  op_gemm.set(DeviceType::CUDA, DType::BF16, gemm_cuda<BFloat16>);
  return true;
}();

}  // namespace
}  // namespace frugal

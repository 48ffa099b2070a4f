// CPU GEMM. f32: oneDNN's dnnl_sgemm when built with it (DESIGN.md says why; some B in panels, Note [B's
// rows 2 KiB apart]), Eigen's GEMM otherwise; f64: Eigen. bf16: oneDNN's matmul primitive (AVX-512 BF16 dot
// products accumulated in f32, rounded once on store). f16, and bf16 without oneDNN or in a layout oneDNN
// declines: tiles of A and B widened to f32 and multiplied by the registered f32 GEMM, C rounded once; a few
// rows of A as dot products with B's columns, or as sums of B's rows, widened in registers (Note [few rows of
// 16-bit floats]). The naive reference the tests and benchmarks check against is kernels/cpu/reference.h.
#include <Eigen/Core>

#include <algorithm>
#include <bit>
#include <cstring>

#include <omp.h>
#if defined(__F16C__) || defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "core/op_table_linalg.h"
#include "core/parallel.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/vec.h"
#include "kernels/cpu/workspace.h"

#ifdef FRUGAL_HAVE_ONEDNN
#include <array>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <dnnl.h>

#include "kernels/cpu/onednn.h"
#endif

namespace frugal {
namespace {

template <typename T>
void gemm_eigen(const GemmArgs& g) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Strided = Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>;
  using CMap = Eigen::Map<const Mat, 0, Strided>;
  using OMap = Eigen::Map<Mat, 0, Eigen::OuterStride<>>;
  for (int64_t b = 0; b < g.batch; ++b) {
    CMap a(static_cast<const T*>(g.a) + b * g.a_batch, g.m, g.k, Strided(g.a_row, g.a_col));
    CMap bm(static_cast<const T*>(g.b) + b * g.b_batch, g.k, g.n, Strided(g.b_row, g.b_col));
    OMap c(static_cast<T*>(g.c) + b * g.c_batch, g.m, g.n, Eigen::OuterStride<>(g.c_row));
    if (g.beta == 0)
      c.noalias() = T(g.alpha) * (a * bm);
    else
      c = T(g.beta) * c + T(g.alpha) * (a * bm);
  }
}

#ifdef FRUGAL_HAVE_ONEDNN
// A matrix of one row or one column has a stride that is never used, which dnnl_sgemm still checks (its
// leading dimension must cover a row): such a stride gets the value a contiguous matrix would have (the
// weight gradient of Linear(in, 1) is a 1 x batch matrix with both strides 1).
GemmArgs tidied(const GemmArgs& args) {
  GemmArgs g = args;
  auto tidy = [](int64_t rows, int64_t cols, int64_t& row_stride, int64_t& col_stride) {
    if (cols == 1) col_stride = 1;
    if (rows == 1) row_stride = std::max<int64_t>(cols, 1);
  };
  tidy(g.m, g.k, g.a_row, g.a_col);
  tidy(g.k, g.n, g.b_row, g.b_col);
  if (g.m == 1) g.c_row = std::max<int64_t>(g.n, 1);
  return g;
}

// Note [B's rows 2 KiB apart]
// oneDNN 2.6's f32 GEMM, on a CPU without AVX-512, multiplies the operands as they lie, without packing them
// first ("no copy"), whenever one side of C is short: 1/m + 1/n >= 0.0038 (its nocopy_checker_avx2), which
// holds for every m <= 263. With B not transposed and its rows a multiple of 2 KiB apart, that kernel runs at
// half speed: d x = d y W of a Linear(1024, 1024) on 256 rows (W4's backward in 4 micro-batches) took 75-88
// GFLOP/s, against 150-165 for 512 rows, or for the same B with its rows 1040 floats apart (AMD EPYC Zen 3,
// 2 threads; the same ratio on 1 thread). The same held for B of 512, 2048 and 4096 columns and k from 64 to
// 4096, and not for 256 or 768 columns. Such a product runs here in panels of up to 256 of B's rows: each is
// copied to a workspace whose rows are 64 bytes longer, and its product added into C (beta 1 after the first
// panel). That took 126-160 GFLOP/s with the copies (the panel sizes measured: 64, 128, 256, all of B; 256
// was best), about 1 MiB of workspace (fewer rows for a wider B) from the arena, which the dry run takes too
// (gemm_f32_onednn_meta). Below 64 rows of C the copies cost about what they save (32 x 4096 x 4096: 81
// against 76), so those stay as they are. On an AVX-512 CPU oneDNN takes another checker, and nothing was
// measured there: those stay as they are too. So does a GEMM inside a parallel region (the im2col
// convolutions' per image, the widened tiles'): its caller sized the working memory, for the dry run as well.
// The panels change the order of the sums over k, so the result may differ from the unpadded product in the
// last bits; for given shapes it is the same every run. The decision is made on tidied arguments, by the CPU
// kernel and its meta twin alike.
constexpr int64_t kPanelPad = 16;  // floats: a panel's rows are 64 bytes longer than B's

bool pads_b(const GemmArgs& g) {
  static const bool avx2_checker =
      (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) != dnnl_cpu_isa_avx512_core;
  return avx2_checker && g.b_col == 1 && g.n > 1 && g.b_row % 512 == 0 && g.k > 0 && g.m >= 64 &&
         1.0 / double(g.m) + 1.0 / double(g.n) >= 0.0038 && omp_get_level() == 0;
}

// Rows of B a panel holds: 256, halved while a panel would take more than 2 MiB (to no fewer than 64).
int64_t panel_rows(const GemmArgs& g) {
  int64_t rows = 256;
  while (rows > 64 && rows * (g.n + kPanelPad) * int64_t(sizeof(float)) > (int64_t(2) << 20)) rows /= 2;
  return std::min(rows, g.k);
}

int64_t panel_bytes(const GemmArgs& g) { return panel_rows(g) * (g.n + kPanelPad) * int64_t(sizeof(float)); }

void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const detail::OneThreadProduct threads(m * n * k, detail::kPassiveF32Product);
  const dnnl_status_t st = dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  FRUGAL_ASSERT(st == dnnl_success, "dnnl_sgemm failed with status ", int(st), " for m=", m, " n=", n,
                " k=", k);
}

// C = alpha A B + beta C through panels of B (Note [B's rows 2 KiB apart]); A not transposed or transposed
// as `ta` says.
void gemm_f32_padded(const GemmArgs& g, char ta, int64_t lda) {
  const int64_t rows = panel_rows(g), ld = g.n + kPanelPad;
  const Tensor buf = cpu::workspace(panel_bytes(g));
  float* panel = static_cast<float*>(buf.raw_data());
  for (int64_t b = 0; b < g.batch; ++b) {
    const float* a = static_cast<const float*>(g.a) + b * g.a_batch;
    const float* bm = static_cast<const float*>(g.b) + b * g.b_batch;
    float* c = static_cast<float*>(g.c) + b * g.c_batch;
    for (int64_t k0 = 0; k0 < g.k; k0 += rows) {
      const int64_t kk = std::min(rows, g.k - k0);
      parallel_for(0, kk, items_per_grain(g.n), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          std::memcpy(panel + r * ld, bm + (k0 + r) * g.b_row, size_t(g.n) * sizeof(float));
      });
      // A's columns k0.. (rows of A^T when transposed).
      const float* ak = a + k0 * (ta == 'N' ? 1 : lda);
      sgemm(ta, 'N', g.m, g.n, kk, g.alpha, ak, lda, panel, ld, k0 == 0 ? g.beta : 1.0f, c, g.c_row);
    }
  }
}

void gemm_f32_onednn(const GemmArgs& args) {
  const GemmArgs g = tidied(args);
  // dnnl_sgemm is row-major: 'N' reads A as m x k with rows lda apart, 'T' reads it as its k x m transpose.
  const char ta = g.a_col == 1 ? 'N' : 'T', tb = g.b_col == 1 ? 'N' : 'T';
  const int64_t lda = ta == 'N' ? g.a_row : g.a_col, ldb = tb == 'N' ? g.b_row : g.b_col;
  if (pads_b(g)) return gemm_f32_padded(g, ta, lda);
  for (int64_t b = 0; b < g.batch; ++b)
    sgemm(ta, tb, g.m, g.n, g.k, g.alpha, static_cast<const float*>(g.a) + b * g.a_batch, lda,
          static_cast<const float*>(g.b) + b * g.b_batch, ldb, g.beta,
          static_cast<float*>(g.c) + b * g.c_batch, g.c_row);
}

// The meta kernel (core/op_table.h): the panel workspace of Note [B's rows 2 KiB apart].
void gemm_f32_onednn_meta(const GemmArgs& args) {
  const GemmArgs g = tidied(args);
  if (!pads_b(g)) return;  // pads_b holds only for m >= 64 and n > 1
  const Tensor buf = cpu::meta_workspace(panel_bytes(g));
}
#endif

// ---- 16-bit floats through f32 tiles -------------------------------------------------------------------

// Each task computes one kTileM x kTileN block of C over K in steps of kTileK. Every element of A is widened
// once per column tile of C and every element of B once per row tile, a small cost beside the 2 * kTileN
// (or kTileM) flops it then takes part in; the three f32 tiles take at most 1.25 MiB per thread.
constexpr int64_t kTileM = 256, kTileN = 256, kTileK = 512;

// The three f32 tiles of one task, no larger than the problem needs.
struct Tiles {
  int64_t m, n, k;
  explicit Tiles(const GemmArgs& g)
      : m(std::min(kTileM, g.m)), n(std::min(kTileN, g.n)), k(std::max<int64_t>(std::min(kTileK, g.k), 1)) {}
  int64_t floats() const { return m * k + k * n + m * n; }
};

// Widens the rows x cols block at src (element strides rs, cs) into dense f32 at dst in the same orientation,
// so every run converted is contiguous, and gives the dense block's strides as the f32 GEMM reads them.
template <typename T>
void widen_block(const T* src, int64_t rows, int64_t cols, int64_t rs, int64_t cs, float* dst, int64_t& drs,
                 int64_t& dcs) {
  if (cs == 1) {
    for (int64_t i = 0; i < rows; ++i) cpu::to_f32(src + i * rs, dst + i * cols, cols);
    drs = cols;
    dcs = 1;
  } else if (rs == 1) {
    for (int64_t j = 0; j < cols; ++j) cpu::to_f32(src + j * cs, dst + j * rows, rows);
    // A single column-major row is also a row-major one, and the f32 GEMM reads unit column strides as that.
    drs = rows == 1 ? cols : 1;
    dcs = rows == 1 ? 1 : rows;
  } else {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = float(src[i * rs + j * cs]);
    drs = cols;
    dcs = 1;
  }
}

// out[j] = alpha acc[j] (+ beta out[j]), j < n: a row of C from its f32 sums, rounded once (acc is
// overwritten).
template <typename T>
void store_row(const GemmArgs& g, float* acc, T* out, int64_t n) {
  if (g.beta != 0)
    for (int64_t j = 0; j < n; ++j) acc[j] = g.alpha * acc[j] + g.beta * float(out[j]);
  else if (g.alpha != 1)
    for (int64_t j = 0; j < n; ++j) acc[j] *= g.alpha;
  cpu::from_f32(acc, out, n);
}

// C's tile (i0, j0) of batch b: the f32 products summed over K tiles in `tile`, then rounded once.
template <typename T>
void gemm_widened_tile(const GemmArgs& g, GemmKernel* gemm_f32, const Tiles& tiles, int64_t b, int64_t i0,
                       int64_t j0, float* tile) {
  const int64_t mb = std::min(kTileM, g.m - i0), nb = std::min(kTileN, g.n - j0);
  float* ta = tile;
  float* tb = ta + tiles.m * tiles.k;
  float* tc = tb + tiles.k * tiles.n;
  const T* a = static_cast<const T*>(g.a) + b * g.a_batch + i0 * g.a_row;
  const T* bm = static_cast<const T*>(g.b) + b * g.b_batch + j0 * g.b_col;
  T* c = static_cast<T*>(g.c) + b * g.c_batch + i0 * g.c_row + j0;
  if (g.k == 0) std::fill_n(tc, mb * nb, 0.0f);
  for (int64_t p0 = 0; p0 < g.k; p0 += kTileK) {
    GemmArgs f;  // tc (+)= ta @ tb, all f32
    f.m = mb;
    f.n = nb;
    f.k = std::min(kTileK, g.k - p0);
    widen_block(a + p0 * g.a_col, mb, f.k, g.a_row, g.a_col, ta, f.a_row, f.a_col);
    widen_block(bm + p0 * g.b_row, f.k, nb, g.b_row, g.b_col, tb, f.b_row, f.b_col);
    f.a = ta;
    f.b = tb;
    f.c = tc;
    f.c_row = nb;
    f.beta = p0 == 0 ? 0 : 1;
    gemm_f32(f);
  }
  for (int64_t i = 0; i < mb; ++i) store_row(g, tc + i * nb, c + i * g.c_row, nb);
}

// ---- a few rows of 16-bit floats, in registers -------------------------------------------------------

// Note [few rows of 16-bit floats]: a layer's forward on a small batch, C = A B with A [m, k] holding a few
// rows and B = W^T read in place (W's rows are B's columns, each contiguous along k), is mostly B. Widened
// into f32 tiles, B took a k x n tile of f32 per thread: at least the f32 weight's own bytes for a layer of
// up to 512 x 256, so a bf16 or f16 model served a few rows at a time needed more memory than the f32 one
// (where oneDNN has no 16-bit matmul: f16 everywhere, bf16 without AVX-512 BF16). With m <= kDotRows and
// both operands contiguous along k, C is computed as dot products instead, with nothing from the arena:
// - a task is kDotGroup blocks of kDotC columns, for every row; A's rows are widened kDotR at a time, kDotK
//   of k at once, into f32 on the stack (once per task, not per block of columns);
// - a block of kDotR rows x kDotC columns is accumulated in as many f32 vectors, each step one vector of
//   A's widened rows times one of a column of B widened in a register as it is loaded (vpmovzxwd and
//   vpslld for bf16, vcvtph2ps for f16); the lanes are summed at the end (vhaddps on AVX2);
// - each row's sums across the task's columns are rounded at once (cpu::from_f32).
// bf16 on a Zen 3 (AVX2; a weight [n, k] by x [m, k]; best of 5 alternated runs, one thread / two): m 4,
// k 128, n 256: 5.2 / 4.7 us against the tiles' 9.5 / 12.1; m 16, k 512, n 2048: 509 / 290 against 631 / 384;
// m 16, k 128, n 256: 19.6 / 15.8 against 18.7 / 17.8. Beyond 16 rows the f32 GEMM's register blocking
// pays for the tiles (m 32, k 128, n 384: 57 against 48 us on one thread): hence kDotRows = 16. f16, whose
// composed layer also copied the weight transposed before: 2 to 4 times faster up to m 16.
// B's rows contiguous instead (B [k, n] as it lies: a layer's d x = d y W, or matmul(x, w) of a matrix
// w [k, n]), C's rows are sums of B's rows: kDotR rows x kPanel columns accumulate in registers, each step
// an element of A's widened row, broadcast, times a row of B widened as it is loaded (rows_block); a last,
// partial panel is widened beside zeros first. Up to 8 rows only (kSumRows): with 4 rows of C a block, B
// is widened once per 4 rows. bf16, best of 5 alternated runs, one thread / two: m 4, k 2048, n 512: 165 /
// 102 us against the tiles' 246 / 146; m 8: 344 / 198 against 368 / 221; m 8, k 512, n 2048: 338 / 208
// against 398 / 236; but m 16: 674 / 398 against 545 / 365.
constexpr int64_t kDotRows = 16;
constexpr int64_t kSumRows = 8;  // B's rows contiguous (see the Note's last paragraph)
#if defined(__AVX512F__)
constexpr int kDotR = 4, kDotC = 4;  // 16 accumulators of the 32 registers
#else
constexpr int kDotR = 4, kDotC = 3;  // 12 accumulators and a column of B of AVX2's 16 registers
#endif
constexpr int kDotLanes = cpu::kLanes<float>;

// A's rows contiguous along k, and B's columns (a weight read as its transpose: dot products) or its rows
// (B [k, n] as it lies, dX = dY W: rows of C as sums of B's rows, Note [few rows of 16-bit floats]).
bool few_rows(const GemmArgs& g) {
  return g.k > 0 && g.a_col == 1 && ((g.b_row == 1 && g.m <= kDotRows) || (g.b_col == 1 && g.m <= kSumRows));
}

// kDotLanes 16-bit values at p, widened in a register (exactly: every 16-bit float is an f32).
template <typename T>
cpu::Vec<float> widen_lanes_portable(const T* p) {
  float f[kDotLanes];
  cpu::to_f32(p, f, kDotLanes);
  cpu::Vec<float> v;
  std::memcpy(&v, f, sizeof v);
  return v;
}
inline cpu::Vec<float> widen_lanes(const BFloat16* p) {
#if defined(__AVX512F__)
  return cpu::Vec<float>(cpu::bf16x16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#elif defined(__AVX2__)
  return cpu::Vec<float>(cpu::bf16x8_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  return widen_lanes_portable(p);
#endif
}
inline cpu::Vec<float> widen_lanes(const Half* p) {
#if defined(__AVX512F__)
  return cpu::Vec<float>(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#elif defined(__F16C__) && defined(__AVX__)
  return cpu::Vec<float>(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  return widen_lanes_portable(p);
#endif
}

// out[c] += the sum of acc[c]'s lanes, for a block's kDotC columns of one row.
inline void sum_lanes(const cpu::Vec<float>* acc, float* out) {
#if defined(__AVX2__) && !defined(__AVX512F__)
  if constexpr (kDotC == 3) {  // pairs added thrice across the three (vhaddps), then the two 128-bit halves
    const __m256 h01 = _mm256_hadd_ps(__m256(acc[0]), __m256(acc[1]));
    const __m256 h22 = _mm256_hadd_ps(__m256(acc[2]), __m256(acc[2]));
    const __m256 h = _mm256_hadd_ps(h01, h22);  // in each half: acc[c]'s four lanes there summed, c < 3
    alignas(16) float sums[4];
    _mm_store_ps(sums, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    for (int c = 0; c < 3; ++c) out[c] += sums[c];
    return;
  }
#endif
  for (int c = 0; c < kDotC; ++c) {  // halving: the upper half added to the lower until one lane is left
    float h[kDotLanes];
    std::memcpy(h, &acc[c], sizeof h);
    for (int w = kDotLanes / 2; w >= 1; w /= 2)
      for (int l = 0; l < w; ++l) h[l] += h[l + w];
    out[c] += h[0];
  }
}

// The f32 overload, a plain load: the blocks below read widened rows, f32 panels and their sums with it.
inline cpu::Vec<float> widen_lanes(const float* p) {
  cpu::Vec<float> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The kDotR x kDotC block of C at rows a[] (widened, zero past k up to a whole vector), columns b[] (the rows
// of W), over k, added to out (rows out_row apart); a row or column past C's edge repeats the last one,
// computed and not stored.
template <typename T>
void dot_block(const float* const* a, const T* const* b, int64_t k, float* out, int64_t out_row) {
  cpu::Vec<float> acc[kDotR][kDotC] = {};
  auto step = [&](const T* const* bc, int64_t p, int64_t q) {  // A's lanes at p, B's at q
    cpu::Vec<float> x[kDotR];
    for (int r = 0; r < kDotR; ++r) x[r] = widen_lanes(a[r] + p);
    for (int c = 0; c < kDotC; ++c) {
      const cpu::Vec<float> y = widen_lanes(bc[c] + q);
      for (int r = 0; r < kDotR; ++r) acc[r][c] += x[r] * y;
    }
  };
  const int64_t full = k - k % kDotLanes;
  for (int64_t p = 0; p < full; p += kDotLanes) step(b, p, p);
  if (full < k) {  // B's last k % kDotLanes copied beside zeros, against A's zeros
    T tb[kDotC][kDotLanes] = {};
    const T* pb[kDotC];
    for (int c = 0; c < kDotC; ++c) {
      std::copy(b[c] + full, b[c] + k, tb[c]);
      pb[c] = tb[c];
    }
    step(pb, full, 0);
  }
  for (int r = 0; r < kDotR; ++r) sum_lanes(acc[r], out + r * out_row);
}

// The other layout: B's rows contiguous along n. kDotR rows x kPanel columns of C at out (rows out_row
// apart) += A's widened rows a[] times B's rows b + p ldb, p < k: each step one element of each row of A,
// broadcast, times one row of B widened in registers; no sums across lanes.
constexpr int64_t kPanel = 2 * kDotLanes;
template <typename TB>
void rows_block(const float* const* a, const TB* b, int64_t ldb, int64_t k, float* out, int64_t out_row) {
  cpu::Vec<float> acc[kDotR][2] = {};
  for (int64_t p = 0; p < k; ++p) {
    const cpu::Vec<float> b0 = widen_lanes(b + p * ldb), b1 = widen_lanes(b + p * ldb + kDotLanes);
    for (int r = 0; r < kDotR; ++r) {  // a scalar times a vector: broadcast from memory
      const float x = a[r][p];
      acc[r][0] += b0 * x;
      acc[r][1] += b1 * x;
    }
  }
  for (int r = 0; r < kDotR; ++r)
    for (int h = 0; h < 2; ++h) {
      float* o = out + r * out_row + h * kDotLanes;
      const cpu::Vec<float> sum = widen_lanes(o) + acc[r][h];
      std::memcpy(o, &sum, sizeof sum);
    }
}

// A task's columns (kDotGroup blocks of columns, or as many panels of B's rows) and the stack it takes: A's
// rows widened (8 KiB), their sums (<= 1 KiB) and a partial panel (32 KiB, 64 with AVX-512).
constexpr int64_t kDotK = 512;
constexpr int64_t kDotGroup = 16;
constexpr int64_t kSumsRow = kDotGroup * kDotC;  // a block of rows' sums: a row of the task's columns
static_assert(kSumsRow % kPanel == 0, "a task's columns are whole panels");

template <typename T>
void gemm_few_rows(const GemmArgs& g) {
  const bool dot = g.b_row == 1;
  const int64_t groups = (g.n + kSumsRow - 1) / kSumsRow;
  // Enough tasks to a thread to be worth a fork.
  const int64_t grain = items_per_grain(g.m * g.k * kSumsRow);
  parallel_for(0, g.batch * groups, grain, [&](int64_t t0, int64_t t1) {
    alignas(64) float widened[kDotR][kDotK];
    alignas(64) float panel[kDotK * kPanel];  // a last, partial panel of B's rows, widened beside zeros
    const float* rows[kDotR];
    for (int r = 0; r < kDotR; ++r) rows[r] = widened[r];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / groups, j0 = t % groups * kSumsRow, cols = std::min(kSumsRow, g.n - j0);
      const T* a = static_cast<const T*>(g.a) + b * g.a_batch;
      const T* bm = static_cast<const T*>(g.b) + b * g.b_batch;
      T* c = static_cast<T*>(g.c) + b * g.c_batch;
      for (int64_t i0 = 0; i0 < g.m; i0 += kDotR) {
        float sums[kDotR][kSumsRow] = {};
        for (int64_t p0 = 0; p0 < g.k; p0 += kDotK) {
          const int64_t kc = std::min(kDotK, g.k - p0);
          const int64_t padded = (kc + kDotLanes - 1) / kDotLanes * kDotLanes;
          for (int r = 0; r < kDotR; ++r) {
            cpu::to_f32(a + std::min(i0 + r, g.m - 1) * g.a_row + p0, widened[r], kc);
            std::fill(widened[r] + kc, widened[r] + padded, 0.0f);
          }
          if (dot) {
            for (int64_t u0 = 0; u0 < cols; u0 += kDotC) {
              const T* col[kDotC];
              for (int u = 0; u < kDotC; ++u) col[u] = bm + std::min(j0 + u0 + u, g.n - 1) * g.b_col + p0;
              dot_block(rows, col, kc, sums[0] + u0, kSumsRow);
            }
            continue;
          }
          for (int64_t u0 = 0; u0 < cols; u0 += kPanel) {
            const T* first = bm + p0 * g.b_row + j0 + u0;
            const int64_t width = std::min(kPanel, cols - u0);
            if (width == kPanel) {
              rows_block(rows, first, g.b_row, kc, sums[0] + u0, kSumsRow);
              continue;
            }
            for (int64_t p = 0; p < kc; ++p) {
              cpu::to_f32(first + p * g.b_row, panel + p * kPanel, width);
              std::fill(panel + p * kPanel + width, panel + (p + 1) * kPanel, 0.0f);
            }
            rows_block(rows, static_cast<const float*>(panel), kPanel, kc, sums[0] + u0, kSumsRow);
          }
        }
        for (int r = 0; r < kDotR && i0 + r < g.m; ++r)  // each row's columns rounded at once
          store_row(g, sums[r], c + (i0 + r) * g.c_row + j0, cols);
      }
    }
  });
}

// The f32 tiles gemm_widened works in: one set per thread when the tasks run in parallel.
int64_t widened_bytes(const GemmArgs& g) {
  const int64_t tasks = g.batch * ((g.m + kTileM - 1) / kTileM) * ((g.n + kTileN - 1) / kTileN);
  const int max_threads = omp_in_parallel() ? 1 : detail::pool_threads();
  const int64_t sets = max_threads > 1 && tasks >= max_threads ? max_threads : 1;
  return sets * Tiles(g).floats() * int64_t(sizeof(float));
}

template <typename T>
void gemm_widened(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  if (few_rows(g)) return gemm_few_rows<T>(g);
  GemmKernel* gemm_f32 = op_gemm.get(kCPU, DType::F32);
  const int64_t tiles_m = (g.m + kTileM - 1) / kTileM, tiles_n = (g.n + kTileN - 1) / kTileN;
  const int64_t tasks = g.batch * tiles_m * tiles_n;
  const Tiles tiles(g);
  auto run = [&](int64_t task, float* tile) {
    const int64_t b = task / (tiles_m * tiles_n), r = task % (tiles_m * tiles_n);
    gemm_widened_tile<T>(g, gemm_f32, tiles, b, r / tiles_n * kTileM, r % tiles_n * kTileN, tile);
  };
  // With a task per thread or more, the tasks run in parallel, each with a single-threaded f32 GEMM (as it
  // runs inside a parallel region); with fewer, one after another with the f32 GEMM's own threads.
  const int max_threads = omp_in_parallel() ? 1 : detail::pool_threads();
  if (max_threads > 1 && tasks >= max_threads) {
    Tensor buf = cpu::workspace(widened_bytes(g));
#pragma omp parallel num_threads(max_threads)
    {
      float* tile = static_cast<float*>(buf.raw_data()) + omp_get_thread_num() * tiles.floats();
#pragma omp for schedule(dynamic)
      for (int64_t task = 0; task < tasks; ++task) run(task, tile);
    }
  } else {
    Tensor buf = cpu::workspace(widened_bytes(g));
    for (int64_t task = 0; task < tasks; ++task) run(task, static_cast<float*>(buf.raw_data()));
  }
}

// ---- bf16 through oneDNN's matmul primitive -------------------------------------------------------------
#ifdef FRUGAL_HAVE_ONEDNN

struct MatmulPlan {
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, c, scratchpad;
};

// Everything the primitive is specialised on: sizes, strides (transposes are strides), alpha and beta.
using MatmulPlans = cpu::PlanCache<14, MatmulPlan>;

MatmulPlans::Key key_of(const GemmArgs& g) {
  const bool batched = g.batch > 1;
  return {g.batch,
          g.m,
          g.n,
          g.k,
          batched ? g.a_batch : 0,
          g.a_row,
          g.a_col,
          batched ? g.b_batch : 0,
          g.b_row,
          g.b_col,
          batched ? g.c_batch : 0,
          g.c_row,
          std::bit_cast<int32_t>(g.alpha),
          std::bit_cast<int32_t>(g.beta)};
}

// A batch operand with batch stride 0 (one matrix for every batch entry) gets oneDNN's batch broadcast: a
// batch dim of size 1, whose stride only has to clear the matrix.
dnnl::memory::desc bf16_desc(const GemmArgs& g, int64_t rows, int64_t cols, int64_t batch_stride, int64_t rs,
                             int64_t cs) {
  using dt = dnnl::memory::data_type;
  if (g.batch == 1) return dnnl::memory::desc({rows, cols}, dt::bf16, {rs, cs});
  const int64_t extent = (rows - 1) * rs + (cols - 1) * cs + 1;
  if (batch_stride == 0) return dnnl::memory::desc({1, rows, cols}, dt::bf16, {extent, rs, cs});
  return dnnl::memory::desc({g.batch, rows, cols}, dt::bf16, {batch_stride, rs, cs});
}

std::shared_ptr<const MatmulPlan> build_plan(const GemmArgs& g) {
  const detail::OneThreadProduct threads(g.batch * g.m * g.n * g.k, detail::kPassiveBf16Product);
  auto plan = std::make_shared<MatmulPlan>();
  plan->a = bf16_desc(g, g.m, g.k, g.a_batch, g.a_row, g.a_col);
  plan->b = bf16_desc(g, g.k, g.n, g.b_batch, g.b_row, g.b_col);
  plan->c = bf16_desc(g, g.m, g.n, g.c_batch, g.c_row, 1);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (g.alpha != 1) attr.set_output_scales(0, {g.alpha});
  if (g.beta != 0) {  // c = alpha * a @ b + beta * c, the sum read from bf16 and added in f32
    dnnl::post_ops ops;
    ops.append_sum(g.beta);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(plan->a, plan->b, plan->c), attr,
                                        cpu::onednn_engine());
  plan->primitive = dnnl::matmul(pd);
  plan->scratchpad = pd.scratchpad_desc();
  return plan;
}

// A null plan means oneDNN declined the layout (overlapping batches, say), and the widened path runs instead.
std::shared_ptr<const MatmulPlan> plan_for(const GemmArgs& g) {
  static MatmulPlans plans(256);
  return plans.get(key_of(g), [&] { return build_plan(g); });
}

void gemm_bf16_onednn(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  const auto plan = g.k > 0 ? plan_for(g) : nullptr;
  if (!plan) return gemm_widened<BFloat16>(g);
  auto& eng = cpu::onednn_engine();
  auto& stream = cpu::onednn_stream();
  // Inputs are only read.
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(plan->a, eng, const_cast<void*>(g.a))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(plan->b, eng, const_cast<void*>(g.b))},
      {DNNL_ARG_DST, dnnl::memory(plan->c, eng, g.c)}};
  const Tensor scratch = cpu::add_scratchpad(plan->scratchpad, args);
  const detail::OneThreadProduct threads(g.batch * g.m * g.n * g.k, detail::kPassiveBf16Product);
  plan->primitive.execute(stream, args);
  stream.wait();
}
#endif  // FRUGAL_HAVE_ONEDNN

// The meta kernels (core/op_table.h): the working memory the 16-bit paths above take, on the meta device.
void gemm_widened_meta(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0 || few_rows(g)) return;  // a few rows take no workspace
  const Tensor buf = cpu::meta_workspace(widened_bytes(g));
}
#ifdef FRUGAL_HAVE_ONEDNN
void gemm_bf16_onednn_meta(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  const auto plan = g.k > 0 ? plan_for(g) : nullptr;
  if (!plan) return gemm_widened_meta(g);
  const size_t bytes = plan->scratchpad.get_size();
  const Tensor scratch = bytes ? cpu::meta_workspace(int64_t(bytes)) : Tensor();
}
#endif

const bool kRegistered = [] {
#ifdef FRUGAL_HAVE_ONEDNN
  op_gemm.set(DeviceType::Meta, DType::F32, gemm_f32_onednn_meta);
  op_gemm.set(DeviceType::Meta, DType::BF16, gemm_bf16_onednn_meta);
#else
  op_gemm.set(DeviceType::Meta, DType::BF16, gemm_widened_meta);
#endif
  op_gemm.set(DeviceType::Meta, DType::F16, gemm_widened_meta);
#ifdef FRUGAL_HAVE_ONEDNN
  op_gemm.set(DeviceType::CPU, DType::F32, gemm_f32_onednn);
  op_gemm.set(DeviceType::CPU, DType::BF16, gemm_bf16_onednn);
#else
  op_gemm.set(DeviceType::CPU, DType::F32, gemm_eigen<float>);
  op_gemm.set(DeviceType::CPU, DType::BF16, gemm_widened<BFloat16>);
#endif
  op_gemm.set(DeviceType::CPU, DType::F16, gemm_widened<Half>);
  op_gemm.set(DeviceType::CPU, DType::F64, gemm_eigen<double>);
  return true;
}();

}  // namespace

// Exposed for the tests and benchmarks that compare both f32 paths (the Eigen one is the oracle for oneDNN).
void gemm_f32_eigen_cpu(const GemmArgs& g) { gemm_eigen<float>(g); }
// The widened 16-bit paths, callable beside the registered kernels (bf16's is the fallback without oneDNN).
void gemm_bf16_widened_cpu(const GemmArgs& g) { gemm_widened<BFloat16>(g); }
void gemm_f16_widened_cpu(const GemmArgs& g) { gemm_widened<Half>(g); }

int64_t gemm_f32_panel_bytes(const GemmArgs& args) {
#ifdef FRUGAL_HAVE_ONEDNN
  const GemmArgs g = tidied(args);
  if (pads_b(g)) return panel_bytes(g);
#else
  (void)args;
#endif
  return 0;
}

}  // namespace frugal

// CPU kernels over sparse data. A dense matrix times a sparse one (CSR), for nn::SparseLinear.
// Over the rows of a sparse (row-wise) gradient: summing duplicate rows (coalescing, see autograd/sparse.h)
// and SparseAdam's lazy update of the rows present (optim/sparse_adam.h). Both run one thread per block of
// whole rows; rows are unique, so no two threads write the same bytes. The references are the dense paths
// they replace: the embedding's dense gradient (tests/autograd/test_sparse.cpp) and PyTorch's SparseAdam
// (tests/optim/test_sparse_adam.cpp).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/op_table_sparse.h"
#include "core/parallel.h"
#include "kernels/cpu/register.h"
#include "kernels/cpu/transpose_block.h"
#include "kernels/cpu/vec.h"
#include "kernels/cpu/workspace.h"

namespace frugal {
namespace {

using cpu::for_types;

// values [n, dim], order [n], starts [segments + 1] -> out [segments, dim]; accumulates in acc_t<T>.
template <typename T>
void segment_sum_rows_cpu(const SegmentSumArgs& a) {
  using C = acc_t<T>;
  const T* values = static_cast<const T*>(a.values);
  T* out = static_cast<T*>(a.out);
  const int64_t dim = a.dim;
  parallel_for(0, a.segments, items_per_grain(dim), [&](int64_t begin, int64_t end) {
    std::vector<C> acc(static_cast<size_t>(dim));  // per-thread scratch of one row (not tensor memory)
    for (int64_t s = begin; s < end; ++s) {
      std::fill(acc.begin(), acc.end(), C(0));
      for (int64_t k = a.starts[s]; k < a.starts[s + 1]; ++k) {
        const T* row = values + a.order[k] * dim;
        for (int64_t j = 0; j < dim; ++j) acc[size_t(j)] += C(row[j]);
      }
      T* o = out + s * dim;
      for (int64_t j = 0; j < dim; ++j) o[j] = T(acc[size_t(j)]);
    }
  });
}

// param [rows, dim] (T); exp_avg, exp_avg_sq [rows, dim] (acc_t<T>); values [nnz, dim] (T) at rows indices.
// The operation order is torch.optim.SparseAdam's (PyTorch 1.13, torch/optim/_functional.py): the moments
// move by (1 - beta) * (new - old), and the step divides by sqrt(v) + eps with the corrections in step_size.
template <typename T>
void sparse_adam_step_cpu(const SparseAdamStepArgs& a) {
  using C = acc_t<T>;
  T* param = static_cast<T*>(a.param);
  C* exp_avg = static_cast<C*>(a.exp_avg);
  C* exp_avg_sq = static_cast<C*>(a.exp_avg_sq);
  const T* values = static_cast<const T*>(a.values);
  const C one_minus_beta1 = C(1 - a.beta1), one_minus_beta2 = C(1 - a.beta2), eps = C(a.eps),
          step_size = C(a.step_size);
  const int64_t dim = a.dim;
  parallel_for(0, a.nnz, items_per_grain(dim), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t offset = a.indices[r] * dim;
      T* p = param + offset;
      C* m = exp_avg + offset;
      C* v = exp_avg_sq + offset;
      const T* g_row = values + r * dim;
      for (int64_t j = 0; j < dim; ++j) {
        const C g = C(g_row[j]);
        const C m_new = m[j] + (g - m[j]) * one_minus_beta1;
        const C v_new = v[j] + (g * g - v[j]) * one_minus_beta2;
        m[j] = m_new;
        v[j] = v_new;
        const C denom = std::sqrt(v_new) + eps;
        p[j] = T(C(p[j]) + -step_size * (m_new / denom));
      }
    }
  });
}

// Note [a sparse layer's product]
// out [batch, rows] = x [batch, cols] W^T (+ bias), W [rows, cols] in compressed sparse rows:
// nn::SparseLinear's forward, with x and out as the layer has them. Each nonzero (r, c) of W scales column c
// of x into column r of out, and those columns are strided, so the kernel works on blocks of kBlockRows (32)
// batch rows:
// - it transposes the block of x into a tile xt [cols, 32] (8 x 8 blocks transposed in registers), so that
//   column c is 32 contiguous floats;
// - each row r of W sums values[k] * xt[col_indices[k]] over its nonzeros into 4 AVX2 vectors, nonzero k
//   into set k mod 2 of two sets of accumulators, so that 8 FMA chains are in flight, not 4 (a tile of 8
//   rows: 8 sets of 1 vector); the row's 32 sums go to a tile ot [rows, 32];
// - ot is transposed back into the block's rows of out, with the bias added on the way.
// The tiles are working memory from the arena, one pair a thread (cpu::workspace, so the bytes show in the
// statistics); the meta kernel takes the same bytes. With fewer blocks than threads, the rows of W are split
// too. A batch of b < 32 rows computes ceil(b / 8) vectors a nonzero, not 4.
// Why not a library: Eigen's sparse module (a row-major sparse times a row-major dense matrix) ran this
// product before, on x and out transposed by the caller (two copies of the activations), each nonzero's axpy
// reading and writing a whole row of out. Layers pruned to 90%, against the dense layer (oneDNN), 2 threads
// of a Zen 3, medians of 200: 784 -> 256 at a batch of 256 took 0.44 x the dense time through Eigen and
// 0.22 x here; 3136 -> 128, 0.65 x and 0.34 x; 784 -> 256 at a batch of 16, 1.00 x and 0.38 x. oneDNN 2.6 has
// no sparse matmul. Other dtypes (f64) and CPUs without AVX2 run the same tiles with plain loops.
constexpr int64_t kBlockRows = 32;
constexpr int64_t kCsrWorkGrain = int64_t(1) << 18;  // nonzeros x batch rows below which one thread runs

// How the product is cut into tasks (blocks of batch rows x parts of W's rows) and working memory.
struct CsrPlan {
  int64_t blocks = 0, parts = 0, part_rows = 0, slots = 0, tile_stride = 0;
};

CsrPlan csr_plan(const CsrMatmulArgs& a) {
  CsrPlan p;
  p.blocks = (a.batch + kBlockRows - 1) / kBlockRows;
  p.tile_stride = std::min<int64_t>(kBlockRows, (a.batch + 7) / 8 * 8);
  const int64_t by_work = std::max<int64_t>(1, a.nnz * a.batch / kCsrWorkGrain);
  const int64_t threads = std::min<int64_t>(detail::pool_threads(), by_work);
  // Split W's rows (in multiples of 8) only where the batch has fewer blocks than the threads.
  const int64_t most_parts = std::max<int64_t>(1, (a.rows + 7) / 8);
  p.parts = std::min(most_parts, std::max<int64_t>(1, (threads + p.blocks - 1) / p.blocks));
  p.part_rows = ((a.rows + p.parts - 1) / p.parts + 7) / 8 * 8;
  p.parts = std::max<int64_t>(1, (a.rows + p.part_rows - 1) / p.part_rows);
  p.slots = std::min(threads, p.blocks * p.parts);
  return p;
}

// Elements of working memory one slot (thread) needs: the x tile and the out tile.
int64_t csr_slot_elements(const CsrMatmulArgs& a, const CsrPlan& p) {
  return p.tile_stride * (a.cols + std::min(a.rows, p.part_rows));
}

// xt [cols, stride] = x[b0 .. b0 + nb, :]^T. Lanes nb .. stride are never stored; they hold zeros, so that
// no subnormal or NaN left in the workspace slows their FMAs down.
template <typename T>
void csr_load_tile(const T* x, int64_t cols, int64_t nb, int64_t stride, T* xt) {
  int64_t g = 0;  // the first batch row not yet moved
#if FRUGAL_TRANSPOSE_AVX
  if constexpr (std::is_same_v<T, float>) {
    for (; g + 8 <= nb; g += 8) {
      int64_t c = 0;
      for (; c + 8 <= cols; c += 8) {
        __m256 r[8];
        cpu::transpose8x8_load(x + g * cols + c, cols, r);
        for (int j = 0; j < 8; ++j) _mm256_storeu_ps(xt + (c + j) * stride + g, r[j]);
      }
      for (; c < cols; ++c)
        for (int64_t i = g; i < g + 8; ++i) xt[c * stride + i] = x[i * cols + c];
    }
  }
#endif
  for (int64_t c = 0; c < cols; ++c) {
    T* row = xt + c * stride;
    for (int64_t i = g; i < nb; ++i) row[i] = x[i * cols + c];
    for (int64_t i = nb; i < stride; ++i) row[i] = T(0);
  }
}

// ot[r - r0] = sum over row r's nonzeros of values[k] * xt[col_indices[k]], stride lanes each.
template <typename T>
void csr_rows_portable(const CsrMatmulArgs& a, const T* xt, int64_t stride, int64_t r0, int64_t r1, T* ot) {
  const T* values = static_cast<const T*>(a.values);
  for (int64_t r = r0; r < r1; ++r) {
    T* o = ot + (r - r0) * stride;
    std::fill(o, o + stride, T(0));
    for (int64_t k = a.row_offsets[r]; k < a.row_offsets[r + 1]; ++k) {
      const T w = values[k];
      const T* col = xt + int64_t(a.col_indices[k]) * stride;
#pragma omp simd
      for (int64_t i = 0; i < stride; ++i) o[i] += w * col[i];
    }
  }
}

#if FRUGAL_TRANSPOSE_AVX && defined(__AVX2__) && defined(__FMA__)
// U sets of accumulators, nonzero k going to set k mod U, so that about 8 FMA chains are in flight whatever
// the vectors a nonzero (V): one set of 4 vectors keeps only 4 FMAs of latency 4 going.
template <int V>
void csr_rows_avx2(const CsrMatmulArgs& a, const float* xt, int64_t r0, int64_t r1, float* ot) {
  constexpr int64_t kStride = 8 * V;
  constexpr int U = V == 3 ? 3 : 8 / V;
  const float* values = static_cast<const float*>(a.values);
  const int32_t* cols = a.col_indices;
  for (int64_t r = r0; r < r1; ++r) {
    __m256 acc[U][V];
    for (int u = 0; u < U; ++u)
      for (int v = 0; v < V; ++v) acc[u][v] = _mm256_setzero_ps();
    int64_t k = a.row_offsets[r];
    const int64_t end = a.row_offsets[r + 1];
    for (; k + U <= end; k += U)
      for (int u = 0; u < U; ++u) {
        const __m256 w = _mm256_broadcast_ss(values + k + u);
        const float* c = xt + int64_t(cols[k + u]) * kStride;
        for (int v = 0; v < V; ++v) acc[u][v] = _mm256_fmadd_ps(w, _mm256_loadu_ps(c + 8 * v), acc[u][v]);
      }
    for (; k < end; ++k) {  // into set 0: an index known only at run time would put the sets in memory
      const __m256 w = _mm256_broadcast_ss(values + k);
      const float* c = xt + int64_t(cols[k]) * kStride;
      for (int v = 0; v < V; ++v) acc[0][v] = _mm256_fmadd_ps(w, _mm256_loadu_ps(c + 8 * v), acc[0][v]);
    }
    for (int u = 1; u < U; ++u)
      for (int v = 0; v < V; ++v) acc[0][v] = _mm256_add_ps(acc[0][v], acc[u][v]);
    float* o = ot + (r - r0) * kStride;
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(o + 8 * v, acc[0][v]);
  }
}
#endif

template <typename T>
void csr_rows(const CsrMatmulArgs& a, const T* xt, int64_t stride, int64_t r0, int64_t r1, T* ot) {
#if FRUGAL_TRANSPOSE_AVX && defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<T, float>) {
    static_assert(kBlockRows == 32);
    switch (stride) {
      case 8:
        return csr_rows_avx2<1>(a, xt, r0, r1, ot);
      case 16:
        return csr_rows_avx2<2>(a, xt, r0, r1, ot);
      case 24:
        return csr_rows_avx2<3>(a, xt, r0, r1, ot);
      case 32:
        return csr_rows_avx2<4>(a, xt, r0, r1, ot);
      default:
        break;
    }
  }
#endif
  csr_rows_portable(a, xt, stride, r0, r1, ot);
}

// out[i, r0 + j] = ot[j, i] + bias[r0 + j] for i < nb, j < r1 - r0 (out: the block's first row).
template <typename T>
void csr_store_tile(const T* ot, int64_t stride, int64_t nb, const T* bias, int64_t rows, int64_t r0,
                    int64_t r1, T* out) {
  const int64_t n = r1 - r0;
  int64_t rows_done = 0, cols_done = 0;  // the block [0, rows_done) x [0, cols_done) went by 8 x 8 transposes
#if FRUGAL_TRANSPOSE_AVX
  if constexpr (std::is_same_v<T, float>) {
    rows_done = nb / 8 * 8;
    for (; cols_done + 8 <= n; cols_done += 8) {
      const int64_t j = cols_done;
      const __m256 b = bias ? _mm256_loadu_ps(bias + r0 + j) : _mm256_setzero_ps();
      for (int64_t g = 0; g < rows_done; g += 8) {
        __m256 r[8];
        cpu::transpose8x8_load(ot + j * stride + g, stride, r);
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(out + (g + i) * rows + r0 + j, _mm256_add_ps(r[i], b));
      }
    }
  }
#endif
  for (int64_t j = 0; j < n; ++j) {
    const T b = bias ? bias[r0 + j] : T(0);
    for (int64_t i = j < cols_done ? rows_done : 0; i < nb; ++i)
      out[i * rows + r0 + j] = ot[j * stride + i] + b;
  }
}

// Note [a sparse layer on one row]
// The tiles above give each nonzero a vector of batch rows; on one row 7 of its 8 (or 15 of 16) lanes are
// padding, and the 90%-pruned layer became 3 times slower than the dense one once that ran as dot products
// (Note [a layer's forward on a few rows], kernels/cpu/linear.cpp): 784 -> 256, 17.6 against 6.2 us. So f32
// on one row runs each row of W as a dot product with x: a vector of consecutive nonzeros' values and column
// indices loaded as they lie, x's entries gathered at those columns, fused multiply-adds, the lanes summed at
// the end, then the bias; a row's last nonzeros masked (AVX-512) or one by one (AVX2). The gathers, not the
// bytes, bound it (about 1.8 cycles a nonzero on a Zen 4), so it splits W's rows over the threads from an
// eighth of a small product's grain. 2 threads of a Zen 4, medians of 2001, against the dense layer on one
// row: 784 -> 256 at 90%, 5.5 against 5.0-5.2 us; 256 -> 256, 3.0 against 2.6; 1024 -> 1024, 23 against 27.
// On 2 to 4 rows the gathers cost more than the tiles' padding (784 -> 256 on 4 rows: 16.1 against 13.6 us),
// and from 16 rows the tiles take a third of the dense time. No working memory, and the meta kernel takes
// none.
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
bool csr_one_row(const CsrMatmulArgs& a) { return a.batch == 1; }

void csr_one_row_range(const CsrMatmulArgs& a, int64_t r0, int64_t r1) {
  const auto* values = static_cast<const float*>(a.values);
  const auto* x = static_cast<const float*>(a.x);
  const auto* bias = static_cast<const float*>(a.bias);
  auto* out = static_cast<float*>(a.out);
  const int32_t* cols = a.col_indices;
  for (int64_t r = r0; r < r1; ++r) {
    int64_t k = a.row_offsets[r];
    const int64_t end = a.row_offsets[r + 1];
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; k < end; k += 16) {
      const __mmask16 lanes = cpu::first_lanes(end - k);
      const __m512i idx = _mm512_maskz_loadu_epi32(lanes, cols + k);
      const __m512 g = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lanes, idx, x, 4);
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(lanes, values + k), g, acc);
    }
    float sum = cpu::sum_lanes(acc);
#else
    __m256 acc = _mm256_setzero_ps();
    for (; k + 8 <= end; k += 8) {
      const __m256i idx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cols + k));
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(values + k), _mm256_i32gather_ps(x, idx, 4), acc);
    }
    float sum = cpu::sum_lanes(acc);
    for (; k < end; ++k) sum = std::fma(values[k], x[cols[k]], sum);
#endif
    out[r] = bias ? sum + bias[r] : sum;
  }
}

void csr_matmul_one_row(const CsrMatmulArgs& a) {
  const int64_t per_row = std::max<int64_t>(1, a.nnz / std::max<int64_t>(a.rows, 1));
  parallel_for(0, a.rows, std::max<int64_t>(1, detail::small_product_grain() / 8 / per_row),
               [&](int64_t r0, int64_t r1) { csr_one_row_range(a, r0, r1); });
}
#else
bool csr_one_row(const CsrMatmulArgs&) { return false; }
void csr_matmul_one_row(const CsrMatmulArgs&) {}
#endif

template <typename T>
void csr_matmul_cpu(const CsrMatmulArgs& a) {
  if (a.batch == 0 || a.rows == 0) return;
  if constexpr (std::is_same_v<T, float>)
    if (csr_one_row(a)) return csr_matmul_one_row(a);
  const CsrPlan p = csr_plan(a);
  const int64_t slot = csr_slot_elements(a, p);
  const Tensor work = cpu::workspace(p.slots * slot * int64_t(sizeof(T)));
  T* const tiles = static_cast<T*>(work.raw_data());
  const T* x = static_cast<const T*>(a.x);
  const T* bias = static_cast<const T*>(a.bias);
  T* out = static_cast<T*>(a.out);
  const int64_t tasks = p.blocks * p.parts;
  // Slot s runs tasks s, s + slots, ...: a block's parts go to different slots when there are fewer blocks
  // than threads, and its x tile is loaded again in each.
  parallel_for(0, p.slots, 1, [&](int64_t s_begin, int64_t s_end) {
    for (int64_t s = s_begin; s < s_end; ++s) {
      T* xt = tiles + s * slot;
      T* ot = xt + p.tile_stride * a.cols;
      int64_t loaded = -1;
      for (int64_t t = s; t < tasks; t += p.slots) {
        const int64_t block = t / p.parts, part = t % p.parts;
        const int64_t b0 = block * kBlockRows, nb = std::min(kBlockRows, a.batch - b0);
        const int64_t stride = (nb + 7) / 8 * 8;
        const int64_t r0 = part * p.part_rows, r1 = std::min(a.rows, r0 + p.part_rows);
        if (block != loaded) csr_load_tile(x + b0 * a.cols, a.cols, nb, stride, xt);
        loaded = block;
        csr_rows(a, xt, stride, r0, r1, ot);
        csr_store_tile(ot, stride, nb, bias, a.rows, r0, r1, out + b0 * a.rows);
      }
    }
  });
}

// The dry run's twin: the same working memory, no arithmetic.
template <typename T>
void csr_matmul_meta(const CsrMatmulArgs& a) {
  if (a.batch == 0 || a.rows == 0) return;
  if constexpr (std::is_same_v<T, float>)
    if (csr_one_row(a)) return;  // no working memory (Note [a sparse layer on one row])
  const CsrPlan p = csr_plan(a);
  const Tensor work = cpu::meta_workspace(p.slots * csr_slot_elements(a, p) * int64_t(sizeof(T)));
}

const bool kRegistered = [] {
  for_types<float, double>([](auto t) {
    using T = decltype(t);
    op_csr_matmul.set(DeviceType::CPU, dtype_v<T>, csr_matmul_cpu<T>);
    op_csr_matmul.set(DeviceType::Meta, dtype_v<T>, csr_matmul_meta<T>);
  });
  for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_segment_sum_rows.set(DeviceType::CPU, dtype_v<T>, segment_sum_rows_cpu<T>);
    op_sparse_adam_step.set(DeviceType::CPU, dtype_v<T>, sparse_adam_step_cpu<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal

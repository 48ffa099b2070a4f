// Pairwise (cascade) summation for the CPU kernels: accurate float sums whose value depends only on the
// shape, never on the thread count (Note [pairwise sums]). Used by the reductions (kernels/cpu/reduce.cpp)
// and the bias gradient of the fused linear + ReLU backward (kernels/cpu/linear.cpp).
//
//   float s = cpu::run_sum<float>(p, n);                          // one contiguous run, on this thread
//   cpu::column_sums<float>(rows, cols, out, [&](int64_t r, float* acc, int64_t c0, int64_t c1) {
//     for (int64_t j = c0; j < c1; ++j) acc[j - c0] += x[r * cols + j];
//   });
//
// Note [pairwise sums]
// Floats added one by one lose accuracy in proportion to their number: 2^24 copies of 0.1f summed in chunks
// of f32 lanes came out 0.4% high, and the chunks followed the thread count, so the last bits did too. Every
// float sum of the CPU kernels is instead a fixed binary tree:
// - A run is cut into blocks of kSumBlock elements from its start. A block is summed into kSumLanes
//   interleaved accumulators (the vectorised loop; kSumBlock / kSumLanes elements each), which are then added
//   pairwise.
// - The blocks' sums are merged as a binary counter counts (PairwiseSum): the k-th block merges with the
//   partial sums below it as often as k has trailing one bits, so the stack holds at most log2(blocks)
//   partial sums and the result is the pairwise sum over blocks, built left to right. The error grows with
//   kSumBlock / kSumLanes + log2(n) rather than n; the result depends on n alone.
// - Threads take whole chunks of kSumChunk elements. A chunk is a power of two of blocks, a whole subtree of
//   the tree: its sum is the subtree's, and feeding the chunks' sums into a PairwiseSum, in order, continues
//   the very same tree. Any thread count gives the same bits.
// - Columns (sums over the outer dims of a contiguous run, such as a bias gradient over the rows of a batch)
//   use the same tree per column, over blocks of kSumBlockRows rows added row by row; threads take groups of
//   columns and, for few columns, chunks of a power of two of row blocks chosen from the shape alone.
// f16 and bf16 accumulate in f32 (blocks are widened first), f64 in f64. Integer sums are exact and need
// none of this.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"
#include "kernels/cpu/convert.h"

namespace frugal::cpu {

inline constexpr int64_t kSumLanes = 32;    // interleaved accumulators in a block: four AVX2 f32 vectors
inline constexpr int64_t kSumBlock = 1024;  // elements per block: 32 per lane
inline constexpr int64_t kSumChunk = 64 * kSumBlock;  // elements a thread takes at once: 2^6 blocks
inline constexpr int64_t kSumBlockRows = 32;          // rows per block of a column sum
inline constexpr int64_t kSumColumns = 512;           // columns a thread takes at once...
inline constexpr int64_t kSumSlice = 128;  // ...summed over a block's rows this many at a time, on the stack

// The pairwise sum of values added in order (Note [pairwise sums]): a binary counter of partial sums.
template <typename C>
class PairwiseSum {
 public:
  void add(C v) {
    for (uint64_t c = count_++; c & 1; c >>= 1) v = stack_[--depth_] + v;
    stack_[depth_++] = v;
  }
  C total() const {
    if (depth_ == 0) return C(0);
    C t = stack_[depth_ - 1];
    for (int i = depth_ - 2; i >= 0; --i) t = stack_[i] + t;
    return t;
  }

 private:
  C stack_[64];
  int depth_ = 0;
  uint64_t count_ = 0;
};

// The sum of one block of n <= kSumBlock values, in C: kSumLanes interleaved accumulators added pairwise
// (fewer than kSumLanes values: in order).
template <typename C, typename T>
C block_sum(const T* p, int64_t n) {
  if constexpr (!std::is_same_v<T, C>) {  // f16 / bf16: widen the block to f32 first
    C wide[kSumBlock];
    to_f32(p, wide, n);
    return block_sum<C>(static_cast<const C*>(wide), n);
  } else {
    if (n < kSumLanes) {
      C s = 0;
      for (int64_t i = 0; i < n; ++i) s += p[i];
      return s;
    }
    C acc[kSumLanes] = {};
    int64_t i = 0;
    for (; i + kSumLanes <= n; i += kSumLanes)
      for (int64_t j = 0; j < kSumLanes; ++j) acc[j] += p[i + j];
    for (int64_t j = 0; i + j < n; ++j) acc[j] += p[i + j];
    for (int64_t w = kSumLanes / 2; w > 0; w /= 2)
      for (int64_t j = 0; j < w; ++j) acc[j] += acc[j + w];
    return acc[0];
  }
}

// The sum of a contiguous run of n values, on the calling thread.
template <typename C, typename T>
C run_sum(const T* p, int64_t n) {
  if (n <= kSumBlock) return block_sum<C>(p, n);
  PairwiseSum<C> s;
  for (int64_t b = 0; b < n; b += kSumBlock) s.add(block_sum<C>(p + b, std::min(kSumBlock, n - b)));
  return s.total();
}

// out[o] = the sum of the run of n values at run(o), for o < n_out, across threads: whole runs when they are
// short, chunks of kSumChunk otherwise. The same bits as run_sum on one thread.
template <typename C, typename T, typename RunStart, typename Store>
void run_sums(int64_t n_out, int64_t n, RunStart&& run, Store&& store) {
  const int64_t chunks = std::max<int64_t>(1, (n + kSumChunk - 1) / kSumChunk);
  if (chunks == 1) {
    parallel_for(0, n_out, items_per_grain(n), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) store(o, run_sum<C>(run(o), n));
    });
    return;
  }
  std::vector<C> part(size_t(n_out * chunks));
  parallel_for(0, n_out * chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / chunks, lo = t % chunks * kSumChunk;
      part[size_t(t)] = run_sum<C>(run(o) + lo, std::min(kSumChunk, n - lo));
    }
  });
  for (int64_t o = 0; o < n_out; ++o) {
    PairwiseSum<C> s;
    for (int64_t c = 0; c < chunks; ++c) s.add(part[size_t(o * chunks + c)]);
    store(o, s.total());
  }
}

// The pairwise sums of columns [c0, c0 + w) over rows [r0, r1) into out[0, w) (Note [pairwise sums]): r0 a
// multiple of kSumBlockRows; add_row(r, acc, c0, c1) adds columns [c0, c1) of row r to acc[0, c1 - c0).
// A block's rows are added into a slice of kSumSlice columns on the stack (a heap buffer, which the rows may
// alias modulo 4 KiB, runs at half the speed), its sums go on the stack of partial sums, merged in place.
template <typename C, typename AddRow>
void column_block_sums(int64_t r0, int64_t r1, int64_t c0, int64_t w, C* out, AddRow& add_row) {
  const int64_t blocks = (r1 - r0 + kSumBlockRows - 1) / kSumBlockRows;
  if (blocks == 0) {
    std::fill(out, out + w, C(0));
    return;
  }
  const int levels = std::bit_width(uint64_t(blocks));
  std::vector<C> stack(size_t(levels * w));  // partial sums by level, each w wide
  int depth = 0;
  for (int64_t k = 0; k < blocks; ++k) {
    C* top = stack.data() + depth * w;
    const int64_t rb = r0 + k * kSumBlockRows, re = std::min(r1, rb + kSumBlockRows);
    for (int64_t s = 0; s < w; s += kSumSlice) {
      const int64_t sw = std::min(kSumSlice, w - s);
      C acc[kSumSlice] = {};
      for (int64_t r = rb; r < re; ++r) add_row(r, acc, c0 + s, c0 + s + sw);
      std::copy(acc, acc + sw, top + s);
    }
    for (uint64_t c = uint64_t(k); c & 1; c >>= 1) {  // the binary counter of PairwiseSum, w at a time
      C* below = top - w;
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) below[j] = below[j] + top[j];
      top = below;
      --depth;
    }
    ++depth;
  }
  std::copy(stack.data() + (depth - 1) * w, stack.data() + depth * w, out);
  for (int d = depth - 2; d >= 0; --d) {
    const C* below = stack.data() + d * w;
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) out[j] = below[j] + out[j];
  }
}

// out[j] = the sum over rows r < rows of column j < cols (Note [pairwise sums]), across threads; add_row as
// for column_block_sums. The same bits for any thread count.
template <typename C, typename AddRow>
void column_sums(int64_t rows, int64_t cols, C* out, AddRow&& add_row) {
  const int64_t groups = (cols + kSumColumns - 1) / kSumColumns;
  // Few columns: chunks of rows too, a power of two of row blocks with about kSumChunk elements, at most 64
  // of them; the shape alone decides.
  int64_t chunk_rows = std::max<int64_t>(rows, 1);
  if (cols <= 2 * kSumColumns) {
    chunk_rows = kSumBlockRows;
    while (chunk_rows * cols < kSumChunk || (rows + chunk_rows - 1) / chunk_rows > 64) chunk_rows *= 2;
  }
  const int64_t chunks = std::max<int64_t>(1, (rows + chunk_rows - 1) / chunk_rows);
  if (chunks == 1) {
    parallel_for(0, groups, 1, [&](int64_t b, int64_t e) {
      for (int64_t g = b; g < e; ++g) {
        const int64_t c0 = g * kSumColumns;
        column_block_sums<C>(0, rows, c0, std::min(kSumColumns, cols - c0), out + c0, add_row);
      }
    });
    return;
  }
  std::vector<C> part(size_t(chunks * cols));  // by chunk, then column
  parallel_for(0, groups * chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t g = t / chunks, c = t % chunks, c0 = g * kSumColumns;
      column_block_sums<C>(c * chunk_rows, std::min(rows, (c + 1) * chunk_rows), c0,
                           std::min(kSumColumns, cols - c0), part.data() + c * cols + c0, add_row);
    }
  });
  for (int64_t j = 0; j < cols; ++j) {
    PairwiseSum<C> s;
    for (int64_t c = 0; c < chunks; ++c) s.add(part[size_t(c * cols + j)]);
    out[j] = s.total();
  }
}

}  // namespace frugal::cpu

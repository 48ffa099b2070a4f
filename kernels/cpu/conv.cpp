// CPU convolution kernels: f32 through oneDNN's convolution primitives when built with it, im2col + the
// registered GEMM otherwise; f64 is the naive reference itself (kernels/cpu/reference.h), for gradcheck.
// bf16 runs oneDNN's bf16 primitives (AVX-512 BF16, f32 accumulation, one rounding on store) where oneDNN
// has a non-reference one for the shape; f16 (oneDNN 2.6 has no f16 convolution on this CPU), bf16 without
// oneDNN and the shapes it declines widen the operands to f32 around the f32 kernels and round the results
// once.
//
// Unlike most kernels these take working memory (im2col columns; oneDNN's reordered operands and its
// scratchpad), and they take it from the arena as U8 tensors, so that the bytes show in the memory
// statistics under the caller's tag and go back to the cache when the call returns. The oneDNN plans are in
// kernels/cpu/conv_onednn.cpp, both backward directions in one call (op_conv2d_backward) in
// kernels/cpu/conv_backward.cpp.
#include <algorithm>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <omp.h>

#include "core/error.h"
#include "core/op_table_conv.h"
#include "core/op_table_linalg.h"
#include "core/parallel.h"
#include "core/quant_kernels.h"
#include "core/tensor.h"
#include "kernels/cpu/conv_onednn.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/im2col.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/relu.h"
#include "kernels/cpu/workspace.h"

namespace frugal {
namespace {

using cpu::workspace;

using Direction = cpu::ConvDirection;

// ---- im2col + GEMM -------------------------------------------------------------------------------------

// The adjoint of im2col: adds each column entry back into the input position it was read from.
template <typename T>
void col2im_add(const ConvArgs& a, const T* col, T* x) {
  const int64_t ohw = a.oh * a.ow;
  for (int64_t c = 0; c < a.c; ++c)
    for (int64_t i = 0; i < a.kh; ++i)
      for (int64_t j = 0; j < a.kw; ++j) {
        const T* row = col + ((c * a.kh + i) * a.kw + j) * ohw;
        for (int64_t oh = 0; oh < a.oh; ++oh) {
          const int64_t ih = oh * a.stride_h - a.pad_h + i * a.dil_h;
          if (ih < 0 || ih >= a.h) continue;
          T* out = x + (c * a.h + ih) * a.w;
          for (int64_t ow = 0; ow < a.ow; ++ow) {
            const int64_t iw = ow * a.stride_w - a.pad_w + j * a.dil_w;
            if (iw >= 0 && iw < a.w) out[iw] += row[oh * a.ow + ow];
          }
        }
      }
}

// Per group g: weight_g [og, K] with K = cg * kh * kw, col_g [K, ohw], y_g [og, ohw].
struct GroupDims {
  int64_t cg, og, k, ohw;
  explicit GroupDims(const ConvArgs& a)
      : cg(a.c / a.groups), og(a.o / a.groups), k(a.c / a.groups * a.kh * a.kw), ohw(a.oh * a.ow) {}
};

// A size-1 dim's stride is free; the GEMM kernels read it to tell row- from column-major (as ops::matmul
// picks it), so give it the value that makes the layout unambiguous.
void run_gemm(GemmKernel* gemm, GemmArgs g) {
  auto fix = [](int64_t rows, int64_t cols, int64_t& rs, int64_t& cs) {
    if (cols == 1) cs = 1;
    if (rows == 1) rs = cols;
  };
  fix(g.m, g.k, g.a_row, g.a_col);
  fix(g.k, g.n, g.b_row, g.b_col);
  gemm(g);
}

// Images run in parallel, each thread with its own column buffer and a single-threaded GEMM (oneDNN's and
// Eigen's GEMMs run on one thread inside a parallel region): one fork/join per call instead of one per
// image and GEMM, which matters most on a busy machine.
int im2col_threads(const ConvArgs& a) {
  return omp_in_parallel() ? 1 : int(std::clamp<int64_t>(a.n, 1, detail::pool_threads()));
}

// Runs body(n, col, thread) for every image n, images spread over nt threads; each thread owns a column
// buffer of col_size elements of T in `buf`, which the caller sized (and may extend past nt * col_size for
// itself).
template <typename T, typename Body>
void for_each_image(const ConvArgs& a, int nt, int64_t col_size, const Tensor& buf, Body body) {
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    T* col = static_cast<T*>(buf.raw_data()) + t * col_size;
    for (int64_t n = t; n < a.n; n += omp_get_num_threads()) body(n, col, t);
  }
}

// The working memory of each direction's im2col path: column buffers per thread (and the weight gradient's
// partial sums), in elements of T.
int64_t im2col_elements(const ConvArgs& a, Direction dir) {
  const GroupDims d(a);
  const int64_t col_size = a.c * a.kh * a.kw * d.ohw;
  return im2col_threads(a) * (col_size + (dir == Direction::BackwardWeight ? a.o * d.k : 0));
}

template <typename T>
void conv2d_forward_im2col(const ConvArgs& a) {
  const GroupDims d(a);
  const int nt = im2col_threads(a);
  const int64_t col_size = a.c * a.kh * a.kw * d.ohw;
  Tensor col_buf = workspace(im2col_elements(a, Direction::Forward) * int64_t(sizeof(T)));
  GemmKernel* gemm = op_gemm.get(kCPU, dtype_v<T>);
  for_each_image<T>(a, nt, col_size, col_buf, [&](int64_t n, T* col, int) {
    cpu::im2col(a, static_cast<const T*>(a.x) + n * a.c * a.h * a.w, col, a.oh * a.ow, T(0));
    T* y = static_cast<T*>(a.y) + n * a.o * d.ohw;
    GemmArgs g;  // y_g = weight_g @ col_g for each group (the batch)
    g.batch = a.groups;
    g.m = d.og;
    g.n = d.ohw;
    g.k = d.k;
    g.a = a.weight;
    g.a_batch = d.og * d.k;
    g.a_row = d.k;
    g.b = col;
    g.b_batch = d.k * d.ohw;
    g.b_row = d.ohw;
    g.c = y;
    g.c_batch = d.og * d.ohw;
    g.c_row = d.ohw;
    run_gemm(gemm, g);
    if (a.bias)
      for (int64_t o = 0; o < a.o; ++o) {
        const T b = static_cast<const T*>(a.bias)[o];
        for (int64_t p = 0; p < d.ohw; ++p) y[o * d.ohw + p] += b;
      }
  });
}

template <typename T>
void conv2d_backward_data_im2col(const ConvArgs& a) {
  const GroupDims d(a);
  const int nt = im2col_threads(a);
  const int64_t col_size = a.c * a.kh * a.kw * d.ohw;
  Tensor col_buf = workspace(im2col_elements(a, Direction::BackwardData) * int64_t(sizeof(T)));
  GemmKernel* gemm = op_gemm.get(kCPU, dtype_v<T>);
  for_each_image<T>(a, nt, col_size, col_buf, [&](int64_t n, T* col, int) {
    GemmArgs g;  // col_g = weight_g^T @ dy_g
    g.batch = a.groups;
    g.m = d.k;
    g.n = d.ohw;
    g.k = d.og;
    g.a = a.weight;
    g.a_batch = d.og * d.k;
    g.a_row = 1;
    g.a_col = d.k;
    g.b = static_cast<const T*>(a.dy) + n * a.o * d.ohw;
    g.b_batch = d.og * d.ohw;
    g.b_row = d.ohw;
    g.c = col;
    g.c_batch = d.k * d.ohw;
    g.c_row = d.ohw;
    run_gemm(gemm, g);
    T* dx = static_cast<T*>(a.dx) + n * a.c * a.h * a.w;
    std::fill_n(dx, a.c * a.h * a.w, T(0));
    col2im_add(a, col, dx);
  });
}

// Each thread sums its images' weight gradients into its own buffer; the buffers are added at the end.
template <typename T>
void conv2d_backward_weight_im2col(const ConvArgs& a) {
  const GroupDims d(a);
  const int nt = im2col_threads(a);
  const int64_t col_size = a.c * a.kh * a.kw * d.ohw, dw_size = a.o * d.k;
  Tensor buf = workspace(im2col_elements(a, Direction::BackwardWeight) * int64_t(sizeof(T)));
  T* partials = static_cast<T*>(buf.raw_data()) + nt * col_size;
  GemmKernel* gemm = op_gemm.get(kCPU, dtype_v<T>);
  std::fill_n(partials, nt * dw_size, T(0));
  for_each_image<T>(a, nt, col_size, buf, [&](int64_t n, T* col, int t) {
    T* dw = partials + t * dw_size;
    cpu::im2col(a, static_cast<const T*>(a.x) + n * a.c * a.h * a.w, col, a.oh * a.ow, T(0));
    GemmArgs g;  // dweight_g += dy_g @ col_g^T
    g.batch = a.groups;
    g.m = d.og;
    g.n = d.k;
    g.k = d.ohw;
    g.a = static_cast<const T*>(a.dy) + n * a.o * d.ohw;
    g.a_batch = d.og * d.ohw;
    g.a_row = d.ohw;
    g.b = col;
    g.b_batch = d.k * d.ohw;
    g.b_row = 1;
    g.b_col = d.ohw;
    g.c = dw;
    g.c_batch = d.og * d.k;
    g.c_row = d.k;
    g.beta = 1;
    run_gemm(gemm, g);
  });
  T* dweight = static_cast<T*>(a.dweight);
  std::copy_n(partials, dw_size, dweight);
  for (int t = 1; t < nt; ++t)
    for (int64_t i = 0; i < dw_size; ++i) dweight[i] += partials[t * dw_size + i];
  if (a.dbias) {
    T* db = static_cast<T*>(a.dbias);
    parallel_for(0, a.o, 1, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        double s = 0;
        for (int64_t n = 0; n < a.n; ++n) {
          const T* dy = static_cast<const T*>(a.dy) + (n * a.o + o) * d.ohw;
          for (int64_t p = 0; p < d.ohw; ++p) s += dy[p];
        }
        db[o] = T(s);
      }
    });
  }
}

// Note [conv2d_relu keeps a NaN]
// conv2d_relu gives what relu(conv2d(...)) gives, a NaN and a -0 included, as linear_relu does (Note
// [linear_relu keeps a NaN], linear.cpp): every kernel runs the convolution alone, then relu's rule (v < 0 ?
// 0 : v) over the output in place (cpu::relu_in_place; oneDNN's: each chunk's, after its reorder into the
// user's y, while it is still in the cache). oneDNN's ReLU post-op took a NaN to 0, and so did this file's
// pass after the other kernels (v > 0 ? v : 0): a NaN image came out of nn::Sequential's Conv2d, ReLU pairs
// as zeros, and a CNN trained on with a finite loss. conv2d_relu_pool2 applies the rule to each of a window's
// taps (cpu::max_pool2x2_blocked_to_nchw's relu), so it stays max_pool2d(conv2d_relu(...)) bit for bit,
// and its int8 codes quantize_u8's of that (a NaN's code 0). The pass costs nothing measurable on W2 (a Zen
// 4, 2026-12-06, alternated with the post-op): its training step 8.5-9.9 ms against 8.2-10.0 (4 rounds,
// test accuracy and peak arena bytes identical), its CNN's inference on 1 to 64 images (conv2d_relu_pool2:
// the ReLU on each tap) 69-86 us against 68-78 on one image, 2140-2448 against 2212-2823 on 64 (6 rounds).

// A forward kernel without the ReLU inside, then, when conv2d_relu asked for it (ConvArgs::relu), relu's rule
// over y in place (Note [conv2d_relu keeps a NaN]).
template <typename T, void (*Kernel)(const ConvArgs&)>
void forward_then_relu(const ConvArgs& a) {
  Kernel(a);
  if (a.relu) cpu::relu_in_place(static_cast<T*>(a.y), a.n * a.o * a.oh * a.ow);
}

// ---- 16-bit floats around the f32 kernels -----------------------------------------------------------------

// The f32 copies conv2d_widened makes of a direction's operands.
int64_t widened_floats(const ConvArgs& a, Direction dir) {
  const int64_t nx = a.n * a.c * a.h * a.w, nw = a.o * (a.c / a.groups) * a.kh * a.kw,
                ny = a.n * a.o * a.oh * a.ow;
  if (dir == Direction::Forward) return nx + nw + (a.bias ? a.o : 0) + ny;
  if (dir == Direction::BackwardData) return ny + nw + nx;
  return nx + ny + nw + (a.dbias ? a.o : 0);
}

// Widens the inputs the direction reads to f32 (one arena buffer), runs the registered f32 kernel, and rounds
// its outputs once into the 16-bit tensors.
template <typename T, Direction dir>
void conv2d_widened(const ConvArgs& a) {
  const int64_t nx = a.n * a.c * a.h * a.w, nw = a.o * (a.c / a.groups) * a.kh * a.kw,
                ny = a.n * a.o * a.oh * a.ow;
  const bool fwd = dir == Direction::Forward, data = dir == Direction::BackwardData;
  Tensor buf = workspace(widened_floats(a, dir) * int64_t(sizeof(float)));
  float* next = static_cast<float*>(buf.raw_data());
  auto widen = [&](const void* src, int64_t count) -> const void* {
    if (!src) return nullptr;
    float* dst = next;
    next += count;
    parallel_for(0, count, parallel_grain(),
                 [&](int64_t b, int64_t e) { cpu::to_f32(static_cast<const T*>(src) + b, dst + b, e - b); });
    return dst;
  };
  auto room = [&](const void* out, int64_t count) -> float* {
    if (!out) return nullptr;
    float* dst = next;
    next += count;
    return dst;
  };
  auto narrow = [&](const float* src, void* out, int64_t count) {
    if (!out) return;
    parallel_for(0, count, parallel_grain(),
                 [&](int64_t b, int64_t e) { cpu::from_f32(src + b, static_cast<T*>(out) + b, e - b); });
  };
  ConvArgs f = a;
  if (fwd) {
    f.x = widen(a.x, nx);
    f.weight = widen(a.weight, nw);
    f.bias = widen(a.bias, a.o);
    f.y = room(a.y, ny);
    op_conv2d.get(kCPU, DType::F32)(f);
    narrow(static_cast<float*>(f.y), a.y, ny);
  } else if (data) {
    f.dy = widen(a.dy, ny);
    f.weight = widen(a.weight, nw);
    f.dx = room(a.dx, nx);
    op_conv2d_backward_data.get(kCPU, DType::F32)(f);
    narrow(static_cast<float*>(f.dx), a.dx, nx);
  } else {
    f.x = widen(a.x, nx);
    f.dy = widen(a.dy, ny);
    f.dweight = room(a.dweight, nw);
    f.dbias = room(a.dbias, a.o);
    op_conv2d_backward_weight.get(kCPU, DType::F32)(f);
    narrow(static_cast<float*>(f.dweight), a.dweight, nw);
    narrow(static_cast<float*>(f.dbias), a.dbias, a.o);
  }
}

// ---- oneDNN (kernels/cpu/conv_onednn.cpp) -------------------------------------------------------------
#ifdef FRUGAL_HAVE_ONEDNN
using DataType = dnnl::memory::data_type;

// Note [a large batch's forward in chunks]: a forward plan holds y in oneDNN's blocked layout beside the
// user's NCHW y until it reorders it back (and x, and Winograd's tiles, likewise): at W2's evaluation batch
// of 250 that is 25 MB beside the 25 MB output of the first convolution, the run's peak. Past kChunkImages
// images the forward runs over balanced chunks of at most that many (each image's result does not depend
// on the others), so those buffers are a chunk's size. The backward directions stay whole: d weight sums
// over the batch, and the fused backward (kernels/cpu/conv_backward.cpp) must give d x exactly as the
// per-direction op does.
constexpr int64_t kChunkImages = 64;

// n images in `count` chunks whose sizes differ by at most one, as (first image, count).
std::vector<std::pair<int64_t, int64_t>> balanced_chunks(int64_t n, int64_t count) {
  std::vector<std::pair<int64_t, int64_t>> chunks;
  for (int64_t i = 0, first = 0; i < count; ++i) {
    const int64_t size = n / count + (i < n % count ? 1 : 0);
    chunks.emplace_back(first, size);
    first += size;
  }
  return chunks;
}

// The chunks of images the forward of `a` runs in, as (first image, count); one chunk for the other
// directions.
std::vector<std::pair<int64_t, int64_t>> chunks_of(const ConvArgs& a, Direction dir) {
  return balanced_chunks(a.n, dir == Direction::Forward ? (a.n + kChunkImages - 1) / kChunkImages : 1);
}

// The plans of a's chunks (null where oneDNN declines one: the fallback then runs for the whole call) and
// each chunk's arguments.
std::vector<std::pair<std::shared_ptr<const cpu::ConvPlan>, ConvArgs>> chunk_plans(const ConvArgs& a,
                                                                                   Direction dir,
                                                                                   DataType type) {
  const int64_t elem = type == DataType::bf16 ? 2 : 4;
  std::vector<std::pair<std::shared_ptr<const cpu::ConvPlan>, ConvArgs>> plans;
  for (const auto& [first, size] : chunks_of(a, dir)) {
    ConvArgs c = a;
    c.n = size;
    if (first > 0 && a.x) {  // forward only: x and y move by whole images (a dry run reads no pointer)
      c.x = static_cast<const char*>(a.x) + first * a.c * a.h * a.w * elem;
      c.y = static_cast<char*>(a.y) + first * a.o * a.oh * a.ow * elem;
    }
    auto plan = cpu::conv_plan(c, dir, type);
    if (!plan) return {};
    plans.emplace_back(std::move(plan), c);
  }
  return plans;
}

// The weights of a forward's chunks reordered once (cpu::shared_weights; plan_of(chunk): its plan), or an
// undefined tensor where a chunk has no plan or the plans share no reorder; meta: the buffer of a dry run.
template <typename Chunks, typename PlanOf>
Tensor chunks_weights(const Chunks& chunks, PlanOf plan_of, const ConvArgs& a, bool meta) {
  if (chunks.size() < 2) return {};  // one chunk reorders its own: no vector on a training step's path
  std::vector<const cpu::ConvPlan*> plans;
  for (const auto& chunk : chunks) {
    if (!plan_of(chunk)) return {};
    plans.push_back(plan_of(chunk).get());
  }
  return cpu::shared_weights(plans, a, meta);
}

// relu's rule over c's NCHW output, of dtype `type` (f32 or bf16).
void relu_of_output(const ConvArgs& c, DataType type) {
  const int64_t n = c.n * c.o * c.oh * c.ow;
  if (type == DataType::bf16)
    cpu::relu_in_place(static_cast<BFloat16*>(c.y), n);
  else
    cpu::relu_in_place(static_cast<float*>(c.y), n);
}

// Every chunk runs with the weights reordered once (cpu::shared_weights); a forward's ReLU follows each
// chunk's primitive (Note [conv2d_relu keeps a NaN]).
bool run_onednn(const ConvArgs& a, Direction dir, DataType type) {
  const auto plans = chunk_plans(a, dir, type);
  if (plans.empty()) return false;
  const Tensor weights = chunks_weights(
      plans, [](const auto& p) { return p.first; }, a, false);
  for (const auto& [plan, c] : plans) {
    cpu::run_conv_plan(*plan, c, {.weights = weights.defined() ? weights.raw_data() : nullptr});
    if (dir == Direction::Forward && c.relu) relu_of_output(c, type);
  }
  return true;
}

void conv2d_forward_f32(const ConvArgs& a) {
  if (!run_onednn(a, Direction::Forward, DataType::f32))
    forward_then_relu<float, conv2d_forward_im2col<float>>(a);
}
void conv2d_backward_data_f32(const ConvArgs& a) {
  if (!run_onednn(a, Direction::BackwardData, DataType::f32)) conv2d_backward_data_im2col<float>(a);
}
void conv2d_backward_weight_f32(const ConvArgs& a) {
  if (!run_onednn(a, Direction::BackwardWeight, DataType::f32)) conv2d_backward_weight_im2col<float>(a);
}

template <Direction dir>
void conv2d_bf16(const ConvArgs& a) {
  if (!run_onednn(a, dir, DataType::bf16)) conv2d_widened<BFloat16, dir>(a);
}

// Note [a convolution pooled from its blocked output]
// ops::conv2d_relu_pool2 (nn::Sequential's inference of a Conv2d, a ReLU and a MaxPool2d(2)) in f32. oneDNN
// writes a convolution's output in its blocked layout (aBcd8b with AVX2, 16 channels a block with AVX-512),
// which conv2d_relu reorders into the user's NCHW y for max_pool2d to read. This kernel leaves each chunk's
// output in the primitive's layout and pools its 2 x 2 windows from there straight into the pooled NCHW y
// (cpu::max_pool2x2_blocked_to_nchw, under max_pool2d's rule, so bit for bit the two ops'): no reorder, no
// NCHW output, no second pass over it.
// - The chunks: where oneDNN runs conv2d_relu's chunks (Note [a large batch's forward in chunks]) with a
//   direct JIT kernel ("jit:avx2", "jit:avx512_core"), which computes each image alone, and runs smaller
//   chunks with the same kernel, chunks of at most kPoolChunkBytes of output, pooled while they are still in
//   the cache. Otherwise conv2d_relu's own chunks, so that the rounding is the same: with NCHW layouts
//   (set_conv_onednn_any_layout(false)) oneDNN runs an im2col GEMM ("gemm:jit") whose rounding moved with
//   the chunk's batch (a test caught it), and Winograd's schedules may do the same.
// - A layout the pool cannot read (another block, channels that do not fill their blocks) goes to an NCHW
//   buffer of the chunk first, and a shape oneDNN declines through the im2col kernel; max_pool2d's kernel
//   then pools it.
constexpr int64_t kPoolChunkBytes = int64_t(1) << 20;

// The channels of one block of the forward's output layout d: 8 or 16 for aBcd8b or aBcd16b that c's
// channels fill, 0 for any other layout.
int64_t pool_block(const ConvArgs& c, const dnnl::memory::desc& d) {
  using tag = dnnl::memory::format_tag;
  const dnnl::memory::dims dims{c.n, c.o, c.oh, c.ow};
  for (const auto& [layout, block] : {std::pair{tag::aBcd8b, 8}, std::pair{tag::aBcd16b, 16}})
    if (c.o % block == 0 && d == dnnl::memory::desc(dims, DataType::f32, layout)) return block;
  return 0;
}

struct PoolChunk {
  std::shared_ptr<const cpu::ConvPlan> plan;  // null where oneDNN declines the shape (the im2col kernel runs)
  ConvArgs args;                              // x and the pooled y (if any) at the chunk's first image
  int64_t first;                              // that image
  int64_t block;                              // pool_block of the plan's output; 0: pooled from NCHW
};

// The chunks of conv2d_relu_pool2's `a` (Note [a convolution pooled from its blocked output]).
std::vector<PoolChunk> pool_chunks(const ConvArgs& a) {
  auto chunks_over = [&](const std::vector<std::pair<int64_t, int64_t>>& ranges) {
    std::vector<PoolChunk> chunks;
    for (const auto& [first, size] : ranges) {
      ConvArgs c = a;
      c.n = size;
      if (first > 0 && a.x) {  // a dry run reads no pointer
        c.x = static_cast<const float*>(a.x) + first * a.c * a.h * a.w;
        if (a.y) c.y = static_cast<float*>(a.y) + first * a.o * (a.oh / 2) * (a.ow / 2);  // none for codes
      }
      auto plan = cpu::conv_plan(c, Direction::Forward, DataType::f32);
      const int64_t block = plan ? pool_block(c, cpu::conv_plan_dst_desc(*plan)) : 0;
      chunks.push_back({std::move(plan), c, first, block});
    }
    return chunks;
  };
  std::vector<PoolChunk> chunks = chunks_over(chunks_of(a, Direction::Forward));  // conv2d_relu's
  if (chunks.empty()) return chunks;
  const std::string kernel = chunks.front().plan ? chunks.front().plan->implementation : std::string();
  auto same_direct_kernel = [&](const std::vector<PoolChunk>& cs) {
    return kernel.starts_with("jit:") && std::all_of(cs.begin(), cs.end(), [&](const PoolChunk& c) {
             return c.plan && c.plan->implementation == kernel;
           });
  };
  if (!same_direct_kernel(chunks)) return chunks;
  const int64_t image_bytes = std::max<int64_t>(1, a.o * a.oh * a.ow * int64_t(sizeof(float)));
  const int64_t most = std::clamp<int64_t>(kPoolChunkBytes / image_bytes, 1, kChunkImages);
  std::vector<PoolChunk> small = chunks_over(balanced_chunks(a.n, (a.n + most - 1) / most));
  return same_direct_kernel(small) ? small : chunks;
}

// max_pool2d's kernel over 2 x 2 windows of c's NCHW output y_full into c.y.
void max_pool2_nchw(const ConvArgs& c, const float* y_full) {
  PoolArgs p;
  p.planes = c.n * c.o;
  p.h = c.oh;
  p.w = c.ow;
  p.oh = c.oh / 2;
  p.ow = c.ow / 2;
  p.kh = p.kw = p.stride_h = p.stride_w = 2;
  p.x = y_full;
  p.y = c.y;
  op_max_pool2d.get(kCPU, DType::F32)(p);
}

// Where conv2d_relu_pool2_codes puts the pooled values: as u8 codes, channels last.
struct PooledCodes {
  uint8_t* y;  // [n, oh / 2, ow / 2, o]
  float inv_scale;
  int32_t zero_point, qmax;
};

// conv2d_relu_pool2 on the CPU in f32, into a.y, or into `codes` where given; kDry: its meta kernel, which
// takes the same buffers in the same order (with `codes` standing for the codes: none is written).
template <bool kDry>
void conv2d_relu_pool2_f32(const ConvArgs& a, const PooledCodes* codes) {
  auto ws = [](int64_t bytes) { return kDry ? cpu::meta_workspace(bytes) : workspace(bytes); };
  const std::vector<PoolChunk> chunks = pool_chunks(a);
  const Tensor weights = chunks_weights(
      chunks, [](const PoolChunk& c) { return c.plan; }, a, kDry);
  const void* packed = weights.defined() ? weights.raw_data() : nullptr;
  const int64_t pooled_pixels = (a.oh / 2) * (a.ow / 2);
  for (const PoolChunk& c : chunks) {
    const int64_t n = c.args.n, o = c.args.o;
    if (c.block > 0) {  // pooled from the primitive's own layout
      const Tensor y = ws(int64_t(cpu::conv_plan_dst_desc(*c.plan).get_size()));
      if constexpr (kDry) {
        cpu::conv_plan_meta(*c.plan, {.y = y.raw_data(), .weights = packed});
      } else {
        cpu::run_conv_plan(*c.plan, c.args, {.y = y.raw_data(), .weights = packed});
        const auto* blocked = static_cast<const float*>(y.raw_data());
        if (codes)
          cpu::max_pool2x2_blocked_to_nhwc_u8(blocked, codes->y + c.first * pooled_pixels * o, n, o,
                                              c.args.oh, c.args.ow, c.block, c.args.relu, codes->inv_scale,
                                              codes->zero_point, codes->qmax);
        else
          cpu::max_pool2x2_blocked_to_nchw(blocked, static_cast<float*>(c.args.y), n * o / c.block, c.args.oh,
                                           c.args.ow, c.block, c.args.relu);
      }
      continue;
    }
    const Tensor y = ws(n * o * c.args.oh * c.args.ow * int64_t(sizeof(float)));  // NCHW
    ConvArgs f = c.args;
    f.y = y.raw_data();
    if constexpr (kDry) {
      if (c.plan)
        cpu::conv_plan_meta(*c.plan, {.weights = packed});
      else
        const Tensor col =
            cpu::meta_workspace(im2col_elements(f, Direction::Forward) * int64_t(sizeof(float)));
    } else {
      if (c.plan) {
        cpu::run_conv_plan(*c.plan, f, {.weights = packed});
        if (f.relu) relu_of_output(f, DataType::f32);
      } else {
        forward_then_relu<float, conv2d_forward_im2col<float>>(f);
      }
      if (!codes) max_pool2_nchw(c.args, static_cast<const float*>(y.raw_data()));
    }
    if (!codes) continue;
    // Codes from an NCHW pool: pooled, quantised, and each image's [o, pixels] transposed.
    const Tensor pooled = ws(n * o * pooled_pixels * int64_t(sizeof(float)));
    const Tensor nchw = ws(n * o * pooled_pixels);
    if constexpr (!kDry) {
      ConvArgs p = c.args;
      p.y = pooled.raw_data();
      max_pool2_nchw(p, static_cast<const float*>(y.raw_data()));
      cpu::quantize_u8(static_cast<const float*>(pooled.raw_data()), n * o * pooled_pixels, codes->inv_scale,
                       codes->zero_point, codes->qmax, static_cast<uint8_t*>(nchw.raw_data()));
      for (int64_t img = 0; img < n; ++img) {
        cpu::transpose_codes(static_cast<const uint8_t*>(nchw.raw_data()) + img * o * pooled_pixels,
                             codes->y + (c.first + img) * pooled_pixels * o, o, pooled_pixels);
      }
    }
  }
}

template <bool kDry>
void conv2d_relu_pool2_op(const ConvArgs& a) {
  conv2d_relu_pool2_f32<kDry>(a, nullptr);
}

#endif  // FRUGAL_HAVE_ONEDNN

// ---- the meta kernels (core/op_table.h): the working memory each path above takes, on the meta device ----

#ifdef FRUGAL_HAVE_ONEDNN
// run_onednn's buffers, each chunk's held together; false when oneDNN declined the shape (the fallback then
// runs).
bool onednn_meta(const ConvArgs& a, Direction dir, DataType type) {
  const auto plans = chunk_plans(a, dir, type);
  if (plans.empty()) return false;
  const Tensor weights = chunks_weights(
      plans, [](const auto& p) { return p.first; }, a, true);
  for (const auto& chunk : plans)
    cpu::conv_plan_meta(*chunk.first, {.weights = weights.defined() ? weights.raw_data() : nullptr});
  return true;
}
#endif

template <Direction dir>
void conv2d_f32_meta(const ConvArgs& a) {
#ifdef FRUGAL_HAVE_ONEDNN
  if (onednn_meta(a, dir, DataType::f32)) return;
#endif
  const Tensor buf = cpu::meta_workspace(im2col_elements(a, dir) * int64_t(sizeof(float)));
}

template <Direction dir>
void conv2d_widened_meta(const ConvArgs& a) {
  const Tensor buf = cpu::meta_workspace(widened_floats(a, dir) * int64_t(sizeof(float)));
  conv2d_f32_meta<dir>(a);
}

template <Direction dir>
void conv2d_bf16_meta(const ConvArgs& a) {
#ifdef FRUGAL_HAVE_ONEDNN
  if (onednn_meta(a, dir, DataType::bf16)) return;
#endif
  conv2d_widened_meta<dir>(a);
}

const bool kRegistered = [] {
  op_conv2d.set(DeviceType::Meta, DType::F32, conv2d_f32_meta<Direction::Forward>);
  op_conv2d_backward_data.set(DeviceType::Meta, DType::F32, conv2d_f32_meta<Direction::BackwardData>);
  op_conv2d_backward_weight.set(DeviceType::Meta, DType::F32, conv2d_f32_meta<Direction::BackwardWeight>);
  op_conv2d.set(DeviceType::Meta, DType::BF16, conv2d_bf16_meta<Direction::Forward>);
  op_conv2d_backward_data.set(DeviceType::Meta, DType::BF16, conv2d_bf16_meta<Direction::BackwardData>);
  op_conv2d_backward_weight.set(DeviceType::Meta, DType::BF16, conv2d_bf16_meta<Direction::BackwardWeight>);
  op_conv2d.set(DeviceType::Meta, DType::F16, conv2d_widened_meta<Direction::Forward>);
  op_conv2d_backward_data.set(DeviceType::Meta, DType::F16, conv2d_widened_meta<Direction::BackwardData>);
  op_conv2d_backward_weight.set(DeviceType::Meta, DType::F16, conv2d_widened_meta<Direction::BackwardWeight>);
#ifdef FRUGAL_HAVE_ONEDNN
  op_conv2d_relu_pool2.set(DeviceType::Meta, DType::F32, conv2d_relu_pool2_op<true>);
  op_conv2d_relu_pool2.set(DeviceType::CPU, DType::F32, conv2d_relu_pool2_op<false>);
  op_conv2d.set(DeviceType::CPU, DType::F32, conv2d_forward_f32);
  op_conv2d_backward_data.set(DeviceType::CPU, DType::F32, conv2d_backward_data_f32);
  op_conv2d_backward_weight.set(DeviceType::CPU, DType::F32, conv2d_backward_weight_f32);
  op_conv2d.set(DeviceType::CPU, DType::BF16, conv2d_bf16<Direction::Forward>);
  op_conv2d_backward_data.set(DeviceType::CPU, DType::BF16, conv2d_bf16<Direction::BackwardData>);
  op_conv2d_backward_weight.set(DeviceType::CPU, DType::BF16, conv2d_bf16<Direction::BackwardWeight>);
#else
  op_conv2d.set(DeviceType::CPU, DType::F32, forward_then_relu<float, conv2d_forward_im2col<float>>);
  op_conv2d_backward_data.set(DeviceType::CPU, DType::F32, conv2d_backward_data_im2col<float>);
  op_conv2d_backward_weight.set(DeviceType::CPU, DType::F32, conv2d_backward_weight_im2col<float>);
  op_conv2d.set(DeviceType::CPU, DType::BF16, conv2d_widened<BFloat16, Direction::Forward>);
  op_conv2d_backward_data.set(DeviceType::CPU, DType::BF16,
                              conv2d_widened<BFloat16, Direction::BackwardData>);
  op_conv2d_backward_weight.set(DeviceType::CPU, DType::BF16,
                                conv2d_widened<BFloat16, Direction::BackwardWeight>);
#endif
  op_conv2d.set(DeviceType::CPU, DType::F16, conv2d_widened<Half, Direction::Forward>);
  op_conv2d_backward_data.set(DeviceType::CPU, DType::F16, conv2d_widened<Half, Direction::BackwardData>);
  op_conv2d_backward_weight.set(DeviceType::CPU, DType::F16, conv2d_widened<Half, Direction::BackwardWeight>);
  op_conv2d.set(DeviceType::CPU, DType::F64, forward_then_relu<double, reference::conv2d_forward<double>>);
  op_conv2d_backward_data.set(DeviceType::CPU, DType::F64, reference::conv2d_backward_data<double>);
  op_conv2d_backward_weight.set(DeviceType::CPU, DType::F64, reference::conv2d_backward_weight<double>);
  return true;
}();

}  // namespace

void conv2d_forward_im2col_cpu(const ConvArgs& a) { conv2d_forward_im2col<float>(a); }
void conv2d_backward_data_im2col_cpu(const ConvArgs& a) { conv2d_backward_data_im2col<float>(a); }
void conv2d_backward_weight_im2col_cpu(const ConvArgs& a) { conv2d_backward_weight_im2col<float>(a); }

bool cpu::conv2d_relu_pool2_codes([[maybe_unused]] const ConvArgs& a, [[maybe_unused]] uint8_t* codes,
                                  [[maybe_unused]] float inv_scale, [[maybe_unused]] int32_t zero_point,
                                  [[maybe_unused]] int32_t qmax) {
#ifdef FRUGAL_HAVE_ONEDNN
  ConvArgs c = a;
  c.relu = true;
  c.y = nullptr;
  const PooledCodes out{codes, inv_scale, zero_point, qmax};
  conv2d_relu_pool2_f32<false>(c, &out);
  return true;
#else
  return false;
#endif
}

bool cpu::conv2d_relu_pool2_codes_meta([[maybe_unused]] const ConvArgs& a) {
#ifdef FRUGAL_HAVE_ONEDNN
  ConvArgs c = a;
  c.relu = true;
  c.y = nullptr;
  const PooledCodes out{};  // stands for the codes: the dry run writes none
  conv2d_relu_pool2_f32<true>(c, &out);
  return true;
#else
  return false;
#endif
}

}  // namespace frugal

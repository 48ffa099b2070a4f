// CPU convolution kernels: f32 through oneDNN's convolution primitives when built with it, im2col + the
// registered GEMM otherwise; f64 is the naive reference itself (kernels/cpu/reference.h), for gradcheck.
// bf16 runs oneDNN's bf16 primitives (AVX-512 BF16, f32 accumulation, one rounding on store) where oneDNN
// has a non-reference one for the shape; f16 (oneDNN 2.6 has no f16 convolution on this CPU), bf16 without
// oneDNN and the shapes it declines widen the operands to f32 around the f32 kernels and round the results
// once.
//
// Unlike most kernels these take working memory (im2col columns; oneDNN's reordered operands and its
// scratchpad), and they take it from the arena as U8 tensors, so that the bytes show in the memory
// statistics under the caller's tag and go back to the cache when the call returns.
#include <algorithm>
#include <atomic>
#include <type_traits>

#include <omp.h>

#include "core/error.h"
#include "core/op_table_conv.h"
#include "core/op_table_linalg.h"
#include "core/parallel.h"
#include "core/tensor.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/im2col.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/workspace.h"

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#ifdef FRUGAL_HAVE_ONEDNN
#include <array>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/onednn.h"
#endif

namespace frugal {
namespace {

using cpu::workspace;

enum class Direction { Forward, BackwardData, BackwardWeight };

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

// A forward kernel without the ReLU inside, then, when conv2d_relu asked for it (ConvArgs::relu), the ReLU
// over y in place, as linear_relu's fallback applies it.
template <typename T, void (*Kernel)(const ConvArgs&)>
void forward_then_relu(const ConvArgs& a) {
  Kernel(a);
  if (!a.relu) return;
  T* y = static_cast<T*>(a.y);
  parallel_for(0, a.n * a.o * a.oh * a.ow, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = y[i] > T(0) ? y[i] : T(0);
  });
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
    parallel_for(0, count, kGrain,
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
    parallel_for(0, count, kGrain,
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

// ---- oneDNN ---------------------------------------------------------------------------------------------
#ifdef FRUGAL_HAVE_ONEDNN

// Letting oneDNN pick its blocked layout (and reordering NCHW in and out) is the default: on the W2 shapes
// (bench/bench_conv.cpp, one thread, so that the host's other load does not count) it is 1.2-4x faster in
// every direction, e.g. conv 32->64 14x14 batch 64 forward 4.5 vs 6.4 ms, backward data 4.6 vs 9.0 ms, and
// conv 1->32 backward weight 0.55 vs 2.2 ms. On an oversubscribed host plain NCHW can win, as it runs one
// parallel region per call instead of up to four.
std::atomic<bool> g_any_layout{true};

// One oneDNN argument of a primitive: where its bytes sit in the user's NCHW tensor, the layout the primitive
// wants, and the reorder between them when they differ.
struct Operand {
  int arg = 0;  // DNNL_ARG_*
  bool output = false;
  dnnl::memory::desc user, compute;
  std::optional<dnnl::reorder> reorder;  // user -> compute for inputs, compute -> user for outputs
};

// A created primitive and what running it needs; immutable once built, so threads may share it (the
// scratchpad is user-managed: each call brings its own).
struct ConvPlan {
  dnnl::primitive primitive;
  std::vector<Operand> operands;
  dnnl::memory::desc scratchpad;
};

using ConvPlans = cpu::PlanCache<19, ConvPlan>;

using cpu::onednn_engine;
using DataType = dnnl::memory::data_type;

ConvPlans::Key key_of(const ConvArgs& a, Direction dir, bool any, DataType type) {
  const bool bias = dir == Direction::Forward ? a.bias != nullptr : a.dbias != nullptr;
  const bool relu = dir == Direction::Forward && a.relu;
  return {int64_t(dir), any,        bias,    a.n,     a.c,     a.h,     a.w,      a.o,           a.kh, a.kw,
          a.stride_h,   a.stride_w, a.pad_h, a.pad_w, a.dil_h, a.dil_w, a.groups, int64_t(type), relu};
}

// Every user tensor has the dtype `type` (f32 or bf16); oneDNN accumulates bf16 in f32.
std::shared_ptr<const ConvPlan> build_plan(const ConvArgs& a, Direction dir, bool any, DataType type) {
  using tag = dnnl::memory::format_tag;
  using md = dnnl::memory::desc;
  const dnnl::memory::dims x_dims{a.n, a.c, a.h, a.w}, y_dims{a.n, a.o, a.oh, a.ow}, b_dims{a.o};
  const dnnl::memory::dims w_dims =
      a.groups > 1 ? dnnl::memory::dims{a.groups, a.o / a.groups, a.c / a.groups, a.kh, a.kw}
                   : dnnl::memory::dims{a.o, a.c, a.kh, a.kw};
  const tag w_tag = a.groups > 1 ? tag::goihw : tag::oihw;
  const md x_user(x_dims, type, tag::nchw), y_user(y_dims, type, tag::nchw);
  const md w_user(w_dims, type, w_tag), b_user(b_dims, type, tag::x);
  const md x_want = any ? md(x_dims, type, tag::any) : x_user;
  const md y_want = any ? md(y_dims, type, tag::any) : y_user;
  const md w_want = any ? md(w_dims, type, tag::any) : w_user;
  // oneDNN counts dilation from 0; PyTorch's right padding equals the left, and oneDNN accepts an output
  // size computed with floor division from it.
  const dnnl::memory::dims strides{a.stride_h, a.stride_w}, dilates{a.dil_h - 1, a.dil_w - 1},
      pad{a.pad_h, a.pad_w};
  const auto algo = dnnl::algorithm::convolution_direct;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (dir == Direction::Forward && a.relu) {  // conv2d_relu: the ReLU as the primitive stores y
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  auto& eng = onednn_engine();

  const bool fwd_bias = dir == Direction::Forward && a.bias;
  const dnnl::convolution_forward::desc fwd_desc(dnnl::prop_kind::forward_training, algo, x_want, w_want,
                                                 fwd_bias ? b_user : md(), y_want, strides, dilates, pad,
                                                 pad);
  const dnnl::convolution_forward::primitive_desc fwd_pd(fwd_desc, attr, eng);

  auto plan = std::make_shared<ConvPlan>();
  auto add = [&](int arg, const md& user, const md& compute, bool output) {
    Operand op;
    op.arg = arg;
    op.output = output;
    op.user = user;
    op.compute = compute;
    if (user != compute)
      op.reorder = output ? dnnl::reorder(dnnl::reorder::primitive_desc(eng, compute, eng, user))
                          : dnnl::reorder(dnnl::reorder::primitive_desc(eng, user, eng, compute));
    plan->operands.push_back(std::move(op));
  };
  std::string impl;
  if (dir == Direction::Forward) {
    plan->primitive = dnnl::convolution_forward(fwd_pd);
    impl = fwd_pd.impl_info_str();
    plan->scratchpad = fwd_pd.scratchpad_desc();
    add(DNNL_ARG_SRC, x_user, fwd_pd.src_desc(), false);
    add(DNNL_ARG_WEIGHTS, w_user, fwd_pd.weights_desc(), false);
    if (a.bias) add(DNNL_ARG_BIAS, b_user, fwd_pd.bias_desc(), false);
    add(DNNL_ARG_DST, y_user, fwd_pd.dst_desc(), true);
  } else if (dir == Direction::BackwardData) {
    const dnnl::convolution_backward_data::desc desc(algo, x_want, w_want, y_want, strides, dilates, pad,
                                                     pad);
    const dnnl::convolution_backward_data::primitive_desc pd(desc, attr, eng, fwd_pd);
    plan->primitive = dnnl::convolution_backward_data(pd);
    impl = pd.impl_info_str();
    plan->scratchpad = pd.scratchpad_desc();
    add(DNNL_ARG_DIFF_DST, y_user, pd.diff_dst_desc(), false);
    add(DNNL_ARG_WEIGHTS, w_user, pd.weights_desc(), false);
    add(DNNL_ARG_DIFF_SRC, x_user, pd.diff_src_desc(), true);
  } else {
    const dnnl::convolution_backward_weights::desc desc(algo, x_want, w_want, a.dbias ? b_user : md(), y_want,
                                                        strides, dilates, pad, pad);
    const dnnl::convolution_backward_weights::primitive_desc pd(desc, attr, eng, fwd_pd);
    plan->primitive = dnnl::convolution_backward_weights(pd);
    impl = pd.impl_info_str();
    plan->scratchpad = pd.scratchpad_desc();
    add(DNNL_ARG_SRC, x_user, pd.src_desc(), false);
    add(DNNL_ARG_DIFF_DST, y_user, pd.diff_dst_desc(), false);
    add(DNNL_ARG_DIFF_WEIGHTS, w_user, pd.diff_weights_desc(), true);
    if (a.dbias) add(DNNL_ARG_DIFF_BIAS, b_user, pd.diff_bias_desc(), true);
  }
  // oneDNN's reference convolution is far slower in bf16 than widening to f32 for the f32 primitives.
  if (type == DataType::bf16 && impl.starts_with("ref")) return nullptr;
  return plan;
}

// A null plan means oneDNN declined the shape (im2col runs instead, or for bf16 the f32 kernels on widened
// operands).
std::shared_ptr<const ConvPlan> plan_for(const ConvArgs& a, Direction dir, DataType type) {
  static ConvPlans plans(128);
  const bool any = g_any_layout.load(std::memory_order_relaxed);
  return plans.get(key_of(a, dir, any, type), [&] { return build_plan(a, dir, any, type); });
}

const void* user_pointer(const ConvArgs& a, int arg) {
  switch (arg) {
    case DNNL_ARG_SRC:
      return a.x;
    case DNNL_ARG_WEIGHTS:
      return a.weight;
    case DNNL_ARG_BIAS:
      return a.bias;
    case DNNL_ARG_DST:
      return a.y;
    case DNNL_ARG_DIFF_DST:
      return a.dy;
    case DNNL_ARG_DIFF_SRC:
      return a.dx;
    case DNNL_ARG_DIFF_WEIGHTS:
      return a.dweight;
    case DNNL_ARG_DIFF_BIAS:
      return a.dbias;
    default:
      FRUGAL_ASSERT(false, "conv2d: unexpected oneDNN argument ", arg);
      return nullptr;
  }
}

// Runs the plan: reorders inputs into the primitive's layouts (arena buffers), executes, reorders outputs
// back into the user's tensors. `dy`, when given, is d y already in the primitive's layout (run_backward's).
void run_plan(const ConvPlan& plan, const ConvArgs& a, const dnnl::memory* dy = nullptr) {
  auto& eng = onednn_engine();
  auto& stream = cpu::onednn_stream();
  std::vector<Tensor> buffers;  // alive until the stream is done
  std::unordered_map<int, dnnl::memory> args;
  std::vector<std::pair<const Operand*, dnnl::memory>> outputs;  // (operand, user memory) to reorder into
  for (const Operand& op : plan.operands) {
    if (dy && op.arg == DNNL_ARG_DIFF_DST) {
      args.emplace(op.arg, *dy);
      continue;
    }
    dnnl::memory user(op.user, eng, const_cast<void*>(user_pointer(a, op.arg)));  // inputs are only read
    if (!op.reorder) {
      args.emplace(op.arg, user);
      continue;
    }
    buffers.push_back(workspace(int64_t(op.compute.get_size())));
    dnnl::memory compute(op.compute, eng, buffers.back().raw_data());
    if (op.output)
      outputs.emplace_back(&op, user);
    else
      op.reorder->execute(stream, user, compute);
    args.emplace(op.arg, compute);
  }
  buffers.push_back(cpu::add_scratchpad(plan.scratchpad, args));
  plan.primitive.execute(stream, args);
  for (auto& [op, user] : outputs) op->reorder->execute(stream, args.at(op->arg), user);
  stream.wait();
}

bool run_onednn(const ConvArgs& a, Direction dir, DataType type) {
  const auto plan = plan_for(a, dir, type);
  if (!plan) return false;
  run_plan(*plan, a);
  return true;
}

// run_plan's buffers on the meta device, held together (with_dy: d y comes prepared, no buffer for it).
void onednn_plan_meta(const ConvPlan& plan, bool with_dy) {
  std::vector<Tensor> buffers;
  for (const Operand& op : plan.operands)
    if (op.reorder && !(with_dy && op.arg == DNNL_ARG_DIFF_DST))
      buffers.push_back(cpu::meta_workspace(int64_t(op.compute.get_size())));
  if (const size_t bytes = plan.scratchpad.get_size()) buffers.push_back(cpu::meta_workspace(int64_t(bytes)));
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

// ---- both backward directions in one call (op_conv2d_backward) ----

// Note [one d y for both directions]: conv2d's rule wants d x and d weight from one d y, and conv2d_relu's
// masks it first (d z = y > 0 ? d y : 0). Composed, that is a pass writing the mask's result into a new
// tensor, then a reorder of it into oneDNN's blocked layout for each primitive: on W2 four passes over the
// second convolution's d y and two over the first's, 0.7-0.9 ms of a 10-13 ms step. Here d z is made once,
// for both primitives: written straight in their layout where it is nChw16c (f32; one pass that reads d y
// and y, masks and transposes 16 x 16 tiles), else masked into a plain buffer and reordered once. Reorders
// and the select copy values, so the results are bit for bit the composed ops'.

// out[i] = y[i] > 0 ? dy[i] : 0, i < n (relu_backward's select; NaN in y gives 0).
template <typename T>
void relu_mask(const T* dy, const T* y, T* out, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = float(y[i]) > 0.0f ? dy[i] : T(0.0f);
  });
}

#ifdef __AVX512F__
// Transposes the 16 x 16 tile r[row][column] in place (r[k] becomes column k).
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane L: pairs of rows 2i, 2i+1 at columns 4L..4L+3
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + j], lane L: column 4L + j of rows 4i..4i+3
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {  // column 4L + j: lane L of r[j], r[4 + j], r[8 + j], r[12 + j]
    const __m512 ab_lo = _mm512_shuffle_f32x4(r[j], r[4 + j], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 ab_hi = _mm512_shuffle_f32x4(r[j], r[4 + j], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 cd_lo = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 cd_hi = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], _MM_SHUFFLE(3, 2, 3, 2));
    t[j] = _mm512_shuffle_f32x4(ab_lo, cd_lo, _MM_SHUFFLE(2, 0, 2, 0));
    t[4 + j] = _mm512_shuffle_f32x4(ab_lo, cd_lo, _MM_SHUFFLE(3, 1, 3, 1));
    t[8 + j] = _mm512_shuffle_f32x4(ab_hi, cd_hi, _MM_SHUFFLE(2, 0, 2, 0));
    t[12 + j] = _mm512_shuffle_f32x4(ab_hi, cd_hi, _MM_SHUFFLE(3, 1, 3, 1));
  }
  for (int k = 0; k < 16; ++k) r[k] = t[k];
}
#endif

// out [n, c / 16, hw, 16] (oneDNN's nChw16c) = dy [n, c, hw], masked by y > 0 when y is not null; c a
// multiple of 16.
void to_nchw16c(const float* dy, const float* y, float* out, int64_t n, int64_t c, int64_t hw) {
  parallel_for(0, n * (c / 16), std::max<int64_t>(1, kGrain / (16 * hw)), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* src = dy + b * 16 * hw;
      const float* mask = y ? y + b * 16 * hw : nullptr;
      float* dst = out + b * 16 * hw;
      int64_t i = 0;
#ifdef __AVX512F__
      for (; i + 16 <= hw; i += 16) {
        __m512 r[16];
        for (int k = 0; k < 16; ++k) {
          r[k] = _mm512_loadu_ps(src + k * hw + i);
          if (mask)
            r[k] = _mm512_maskz_mov_ps(
                _mm512_cmp_ps_mask(_mm512_loadu_ps(mask + k * hw + i), _mm512_setzero_ps(), _CMP_GT_OQ),
                r[k]);
        }
        transpose16(r);
        for (int k = 0; k < 16; ++k) _mm512_storeu_ps(dst + (i + k) * 16, r[k]);
      }
#endif
      for (; i < hw; ++i)
        for (int k = 0; k < 16; ++k)
          dst[i * 16 + k] = !mask || mask[k * hw + i] > 0.0f ? src[k * hw + i] : 0.0f;
    }
  });
}

// The directions' kernels one after the other (a plan oneDNN declined, or the dry run of that), d y masked
// into a plain buffer first with relu_y.
template <typename T, bool kDry>
void backward_each(const ConvArgs& a) {
  const Device device = kDry ? kMeta : kCPU;
  ConvArgs b = a;
  b.relu_y = nullptr;
  Tensor masked;
  if (a.relu_y) {
    const int64_t count = a.n * a.o * a.oh * a.ow;
    masked = kDry ? cpu::meta_workspace(count * int64_t(sizeof(T))) : workspace(count * int64_t(sizeof(T)));
    if constexpr (!kDry) {
      relu_mask(static_cast<const T*>(a.dy), static_cast<const T*>(a.relu_y),
                static_cast<T*>(masked.raw_data()), count);
      b.dy = masked.raw_data();
    }
  }
  if (a.dx) {
    ConvArgs d = b;
    d.dbias = nullptr;
    op_conv2d_backward_data.get(device, dtype_v<T>)(d);
  }
  op_conv2d_backward_weight.get(device, dtype_v<T>)(b);
}

// op_conv2d_backward (Note [one d y for both directions]); kDry: its meta kernel, which takes the same
// working memory in the same order and runs nothing.
template <typename T, bool kDry>
void conv2d_backward_both(const ConvArgs& a) {
  constexpr DataType type = std::is_same_v<T, float> ? DataType::f32 : DataType::bf16;
  ConvArgs data_args = a;
  data_args.dbias = nullptr;  // d bias comes from the weights' primitive
  const auto data_plan = a.dx ? plan_for(data_args, Direction::BackwardData, type) : nullptr;
  const auto weight_plan = plan_for(a, Direction::BackwardWeight, type);
  if ((a.dx && !data_plan) || !weight_plan) return backward_each<T, kDry>(a);

  auto ws = [](int64_t bytes) { return kDry ? cpu::meta_workspace(bytes) : workspace(bytes); };
  const int64_t count = a.n * a.o * a.oh * a.ow;
  auto diff_dst = [](const ConvPlan& plan) -> const Operand& {
    for (const Operand& op : plan.operands)
      if (op.arg == DNNL_ARG_DIFF_DST) return op;
    FRUGAL_ASSERT(false, "conv2d_backward: a backward plan without d y");
    return plan.operands.front();
  };
  // d z in the layout of `op` (a plan's d y operand): its buffer (undefined when d y itself serves).
  auto make_dz = [&](const Operand& op, dnnl::memory& dz) {
    auto& eng = onednn_engine();
    const dnnl::memory::desc blocked16(op.user.dims(), type, dnnl::memory::format_tag::nChw16c);
    if (std::is_same_v<T, float> && a.o % 16 == 0 && op.compute == blocked16) {
      Tensor buf = ws(int64_t(op.compute.get_size()));
      if constexpr (!kDry) {
        to_nchw16c(static_cast<const float*>(a.dy), static_cast<const float*>(a.relu_y),
                   static_cast<float*>(buf.raw_data()), a.n, a.o, a.oh * a.ow);
        dz = dnnl::memory(op.compute, eng, buf.raw_data());
      }
      return buf;
    }
    Tensor plain;
    const void* user = a.dy;
    if (a.relu_y) {
      plain = ws(count * int64_t(sizeof(T)));
      if constexpr (!kDry) {
        relu_mask(static_cast<const T*>(a.dy), static_cast<const T*>(a.relu_y),
                  static_cast<T*>(plain.raw_data()), count);
        user = plain.raw_data();
      }
    }
    if (!op.reorder) {
      if constexpr (!kDry) dz = dnnl::memory(op.user, eng, const_cast<void*>(user));
      return plain;
    }
    Tensor buf = ws(int64_t(op.compute.get_size()));
    if constexpr (!kDry) {
      dz = dnnl::memory(op.compute, eng, buf.raw_data());
      dnnl::memory src(op.user, eng, const_cast<void*>(user));
      op.reorder->execute(cpu::onednn_stream(), src, dz);
      cpu::onednn_stream().wait();
    }
    return buf;  // the plain buffer, if any, goes back first
  };
  auto run = [&](const ConvPlan& plan, const ConvArgs& args, const dnnl::memory& dz) {
    if constexpr (kDry) {
      onednn_plan_meta(plan, true);
    } else {
      run_plan(plan, args, &dz);
    }
  };
  dnnl::memory dz;
  const Operand& weight_dy = diff_dst(*weight_plan);
  if (data_plan && diff_dst(*data_plan).compute != weight_dy.compute) {  // two layouts: one d z each
    {
      const Tensor buf = make_dz(diff_dst(*data_plan), dz);
      run(*data_plan, data_args, dz);
    }
    const Tensor buf = make_dz(weight_dy, dz);
    run(*weight_plan, a, dz);
    return;
  }
  const Tensor buf = make_dz(weight_dy, dz);
  if (data_plan) run(*data_plan, data_args, dz);
  run(*weight_plan, a, dz);
}

#endif  // FRUGAL_HAVE_ONEDNN

// ---- the meta kernels (core/op_table.h): the working memory each path above takes, on the meta device ----

#ifdef FRUGAL_HAVE_ONEDNN
// run_onednn's buffers, held together; false when oneDNN declined the shape (the fallback then runs).
bool onednn_meta(const ConvArgs& a, Direction dir, DataType type) {
  const auto plan = plan_for(a, dir, type);
  if (!plan) return false;
  onednn_plan_meta(*plan, false);
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
  // Only with oneDNN, and then on the meta device as well: the ops compose where there is none.
  op_conv2d_backward.set(DeviceType::Meta, DType::F32, conv2d_backward_both<float, true>);
  op_conv2d_backward.set(DeviceType::Meta, DType::BF16, conv2d_backward_both<BFloat16, true>);
  op_conv2d_backward.set(DeviceType::CPU, DType::F32, conv2d_backward_both<float, false>);
  op_conv2d_backward.set(DeviceType::CPU, DType::BF16, conv2d_backward_both<BFloat16, false>);
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

void set_conv_onednn_any_layout([[maybe_unused]] bool any) {
#ifdef FRUGAL_HAVE_ONEDNN
  g_any_layout.store(any, std::memory_order_relaxed);
#endif
}
void conv2d_forward_im2col_cpu(const ConvArgs& a) { conv2d_forward_im2col<float>(a); }
void conv2d_backward_data_im2col_cpu(const ConvArgs& a) { conv2d_backward_data_im2col<float>(a); }
void conv2d_backward_weight_im2col_cpu(const ConvArgs& a) { conv2d_backward_weight_im2col<float>(a); }

}  // namespace frugal

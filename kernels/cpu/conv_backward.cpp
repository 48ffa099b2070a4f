// op_conv2d_backward on the CPU: both backward directions of a convolution (d x and d weight, with d bias)
// from one d y, masked by the ReLU's output for conv2d_relu, through the oneDNN plans of
// kernels/cpu/conv_onednn.h; f32 and bf16, only in a build with oneDNN (ops::conv2d_backward composes the
// per-direction ops otherwise).
#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "core/op_table_conv.h"
#include "core/parallel.h"
#include "core/tensor.h"
#include "kernels/cpu/conv_onednn.h"
#include "kernels/cpu/workspace.h"

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace frugal::cpu {
namespace {

#ifdef FRUGAL_HAVE_ONEDNN
using Direction = ConvDirection;
using DataType = dnnl::memory::data_type;

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
  parallel_for(0, n, parallel_grain(), [&](int64_t begin, int64_t end) {
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
  parallel_for(0, n * (c / 16), items_per_grain(16 * hw), [&](int64_t b0, int64_t b1) {
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
  const auto data_plan = a.dx ? conv_plan(data_args, Direction::BackwardData, type) : nullptr;
  const auto weight_plan = conv_plan(a, Direction::BackwardWeight, type);
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
      conv_plan_meta(plan, {.dy = &dz});
    } else {
      run_conv_plan(plan, args, {.dy = &dz});
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

const bool kRegistered = [] {
  // Only with oneDNN, and then on the meta device as well: the ops compose where there is none.
  op_conv2d_backward.set(DeviceType::Meta, DType::F32, conv2d_backward_both<float, true>);
  op_conv2d_backward.set(DeviceType::Meta, DType::BF16, conv2d_backward_both<BFloat16, true>);
  op_conv2d_backward.set(DeviceType::CPU, DType::F32, conv2d_backward_both<float, false>);
  op_conv2d_backward.set(DeviceType::CPU, DType::BF16, conv2d_backward_both<BFloat16, false>);
  return true;
}();
#endif  // FRUGAL_HAVE_ONEDNN

}  // namespace
}  // namespace frugal::cpu

// CUDA Adam8bit update (op_adam8bit_step): one block of 256 threads per quantisation block (grid-stride over
// the blocks), each thread holding its up to 16 elements' new moments in registers; the block's scales by a
// block-wide max, then the codes: the dynamic code's by binary search in a copy of both code tables in shared
// memory, the float8 codes by arithmetic. The per-element math and the rounding rules are
// kernels/dynamic_code.h's and kernels/float8_code.h's, as the CPU kernel's (kernels/cpu/optim8bit.cpp), so
// the results are the CPU's.
#include "core/op_table_optim.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/types.cuh"
#include "kernels/dynamic_code.h"
#include "kernels/float8_code.h"

namespace frugal {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = int(kAdam8bitMaxBlock) / kThreads;

// Both code tables, a kernel argument (6 KiB; CUDA 12.1 and sm_70 allow 32 KiB of arguments).
struct Codes {
  dynamic_code::Code exp_avg, exp_avg_sq;
};

template <typename C>
struct BlockMax {
  C m, v;
};

// param, grad [n] (T); codes [n] (u8) and absmax [ceil(n / block_size)] (f32) of each moment.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    adam8bit_step_kernel(const Adam8bitStepArgs a, const Codes codes, const math::Adam8bitHyper<acc_t<T>> h) {
  using C = acc_t<T>;
  __shared__ dynamic_code::Code code1, code2;
  __shared__ BlockMax<C> scratch[32];
  {
    constexpr int kWords = int(sizeof(dynamic_code::Code) / 4);
    const uint32_t* src1 = reinterpret_cast<const uint32_t*>(&codes.exp_avg);
    const uint32_t* src2 = reinterpret_cast<const uint32_t*>(&codes.exp_avg_sq);
    uint32_t* dst1 = reinterpret_cast<uint32_t*>(&code1);
    uint32_t* dst2 = reinterpret_cast<uint32_t*>(&code2);
    for (int i = threadIdx.x; i < kWords; i += blockDim.x) dst1[i] = src1[i], dst2[i] = src2[i];
  }
  __syncthreads();
  T* param = static_cast<T*>(a.param);
  const T* grad = static_cast<const T*>(a.grad);
  const int64_t blocks = (a.n + a.block_size - 1) / a.block_size;
  const auto max_of = [](BlockMax<C> x, BlockMax<C> y) {
    return BlockMax<C>{x.m < y.m ? y.m : x.m, x.v < y.v ? y.v : x.v};
  };
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t begin = b * a.block_size;
    const int64_t len = a.n - begin < a.block_size ? a.n - begin : a.block_size;
    const C scale1 = C(a.exp_avg_absmax[b]), scale2 = C(a.exp_avg_sq_absmax[b]);
    const float8_code::BlockFactors<C> old =
        float8_code::factors_of<C>(a.exp_avg_absmax[b], a.exp_avg_sq_absmax[b]);
    C m[kPerThread], v[kPerThread];
    BlockMax<C> mine{C(0), C(0)};
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t i = threadIdx.x + int64_t(j) * kThreads;
      if (i < len) {
        const int64_t k = begin + i;
        C m_old, v_old;
        if (a.float8) {
          m_old = C(float8_code::decode_signed(a.exp_avg_codes[k])) * old.exp_avg;
          const C root = C(float8_code::decode_unsigned(a.exp_avg_sq_codes[k])) * old.root;
          v_old = root * root;
        } else {
          m_old = C(code1.value[a.exp_avg_codes[k]]) * scale1;
          v_old = C(code2.value[a.exp_avg_sq_codes[k]]) * scale2;
        }
        const math::Adam8bitElement<C> e =
            math::adam8bit_step(gpu::load(param[k]), gpu::load(grad[k]), m_old, v_old, h);
        param[k] = gpu::store<T>(e.p);
        m[j] = e.m;
        v[j] = a.float8 ? math::sqrt_(e.v) : e.v;  // float8 keeps exp_avg_sq's root, and its scale
        mine = max_of(mine, BlockMax<C>{math::finite_abs(e.m), math::finite_abs(v[j])});
      }
    }
    // Every thread has read the old scales before the merge's first barrier; thread 0 writes after it.
    const BlockMax<C> top = gpu::block_merge(mine, max_of, scratch);
    const float absmax1 = float(top.m), absmax2 = float(top.v);
    if (threadIdx.x == 0) {
      a.exp_avg_absmax[b] = absmax1;
      a.exp_avg_sq_absmax[b] = absmax2;
    }
    // A moment times its block's inverse scale, as the CPU kernel's (a zero scale gives 0: every code 0's).
    const C inv1 = absmax1 > 0 ? C(1) / C(absmax1) : C(0), inv2 = absmax2 > 0 ? C(1) / C(absmax2) : C(0);
    const float8_code::BlockFactors<C> now = float8_code::factors_of<C>(absmax1, absmax2);
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t i = threadIdx.x + int64_t(j) * kThreads;
      if (i >= len) continue;
      if (a.float8) {
        a.exp_avg_codes[begin + i] = float8_code::encode_signed(float(m[j] * now.inv_exp_avg));
        a.exp_avg_sq_codes[begin + i] = float8_code::encode_unsigned(float(v[j] * now.inv_root));
      } else {
        a.exp_avg_codes[begin + i] = dynamic_code::quantize(code1, float(m[j] * inv1));
        a.exp_avg_sq_codes[begin + i] = dynamic_code::quantize(code2, float(v[j] * inv2));
      }
    }
  }
}

template <typename T>
void adam8bit_step_cuda(const Adam8bitStepArgs& a) {
  using C = acc_t<T>;
  if (a.n == 0) return;
  FRUGAL_ASSERT(a.block_size > 0 && a.block_size <= kAdam8bitMaxBlock, "adam8bit_step: block_size ",
                a.block_size, " got past the options' check");
  static const Codes codes{dynamic_code::signed_code(), dynamic_code::unsigned_code()};
  const math::Adam8bitHyper<C> h = math::adam8bit_hyper<C>(a);
  gpu::LaunchOn on(a.param);
  const int64_t blocks = (a.n + a.block_size - 1) / a.block_size;
  adam8bit_step_kernel<T>
      <<<gpu::grid_for(blocks * kThreads, kThreads, on.device), kThreads, 0, on.stream>>>(a, codes, h);
  FRUGAL_CUDA_CHECK_LAUNCH("adam8bit_step_kernel");
}

const bool kRegistered = [] {
  gpu::for_types(gpu::Floating{}, [](auto t) {
    using T = decltype(t);
    op_adam8bit_step.set(DeviceType::CUDA, dtype_v<T>, adam8bit_step_cuda<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal

// CPU pooling kernels (max and average, forward and backward) as plain loops, threads over planes. They are
// simple enough to be their own reference; the tests check them against loops written from PyTorch's
// definition. f16/bf16 forward runs natively (max is exact, sums accumulate in f32); their backward goes
// through f32 in the op layer, so that overlapping windows do not round at every addition.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/op_table.h"
#include "core/parallel.h"
#include "kernels/cpu/register.h"

namespace frugal {
namespace {

using cpu::for_types;

// Planes per thread chunk: about kGrain window elements of work each.
int64_t plane_grain(const PoolArgs& a) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, a.oh * a.ow * a.kh * a.kw));
}

// The first in-range tap of a window starting at `start` (possibly in the padding), stepping by dilation.
int64_t first_tap(int64_t start, int64_t dilation) {
  while (start < 0) start += dilation;
  return start;
}

template <typename T>
void max_pool2d_forward_cpu(const PoolArgs& a) {
  using A = acc_t<T>;
  parallel_for(0, a.planes, plane_grain(a), [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      const T* x = static_cast<const T*>(a.x) + p * a.h * a.w;
      T* y = static_cast<T*>(a.y) + p * a.oh * a.ow;
      int64_t* idx = a.indices + p * a.oh * a.ow;
      for (int64_t oh = 0; oh < a.oh; ++oh) {
        const int64_t h0 = oh * a.stride_h - a.pad_h;
        const int64_t h1 = std::min(h0 + (a.kh - 1) * a.dil_h + 1, a.h), hs = first_tap(h0, a.dil_h);
        for (int64_t ow = 0; ow < a.ow; ++ow) {
          const int64_t w0 = ow * a.stride_w - a.pad_w;
          const int64_t w1 = std::min(w0 + (a.kw - 1) * a.dil_w + 1, a.w), ws = first_tap(w0, a.dil_w);
          // As PyTorch: strictly greater wins, so ties keep the first; a NaN wins and propagates.
          A best = -std::numeric_limits<A>::infinity();
          int64_t best_at = hs * a.w + ws;
          for (int64_t ih = hs; ih < h1; ih += a.dil_h)
            for (int64_t iw = ws; iw < w1; iw += a.dil_w) {
              const A v = A(x[ih * a.w + iw]);
              if (v > best || std::isnan(v)) {
                best = v;
                best_at = ih * a.w + iw;
              }
            }
          y[oh * a.ow + ow] = T(best);
          idx[oh * a.ow + ow] = best_at;
        }
      }
    }
  });
}

template <typename T>
void max_pool2d_backward_cpu(const PoolArgs& a) {
  parallel_for(0, a.planes, plane_grain(a), [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      const T* dy = static_cast<const T*>(a.dy) + p * a.oh * a.ow;
      const int64_t* idx = a.indices_in + p * a.oh * a.ow;
      T* dx = static_cast<T*>(a.dx) + p * a.h * a.w;
      std::fill_n(dx, a.h * a.w, T(0));
      for (int64_t i = 0; i < a.oh * a.ow; ++i) dx[idx[i]] += dy[i];
    }
  });
}

// A window's rows [h0, h1) clipped to the input, and its divisor. As PyTorch: the full window is clipped to
// the padded input first (its size is the divisor with count_include_pad), then to the input itself.
struct AvgWindow {
  int64_t h0, h1, w0, w1, divisor;
  AvgWindow(const PoolArgs& a, int64_t oh, int64_t ow) {
    h0 = oh * a.stride_h - a.pad_h;
    w0 = ow * a.stride_w - a.pad_w;
    h1 = std::min(h0 + a.kh, a.h + a.pad_h);
    w1 = std::min(w0 + a.kw, a.w + a.pad_w);
    const int64_t padded = (h1 - h0) * (w1 - w0);
    h0 = std::max<int64_t>(h0, 0);
    w0 = std::max<int64_t>(w0, 0);
    h1 = std::min(h1, a.h);
    w1 = std::min(w1, a.w);
    divisor = a.count_include_pad ? padded : (h1 - h0) * (w1 - w0);
  }
};

template <typename T>
void avg_pool2d_forward_cpu(const PoolArgs& a) {
  using A = acc_t<T>;
  parallel_for(0, a.planes, plane_grain(a), [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      const T* x = static_cast<const T*>(a.x) + p * a.h * a.w;
      T* y = static_cast<T*>(a.y) + p * a.oh * a.ow;
      for (int64_t oh = 0; oh < a.oh; ++oh)
        for (int64_t ow = 0; ow < a.ow; ++ow) {
          const AvgWindow win(a, oh, ow);
          A s = 0;
          for (int64_t ih = win.h0; ih < win.h1; ++ih)
            for (int64_t iw = win.w0; iw < win.w1; ++iw) s += A(x[ih * a.w + iw]);
          y[oh * a.ow + ow] = win.divisor > 0 ? T(s / A(win.divisor)) : T(0);
        }
    }
  });
}

template <typename T>
void avg_pool2d_backward_cpu(const PoolArgs& a) {
  parallel_for(0, a.planes, plane_grain(a), [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      const T* dy = static_cast<const T*>(a.dy) + p * a.oh * a.ow;
      T* dx = static_cast<T*>(a.dx) + p * a.h * a.w;
      std::fill_n(dx, a.h * a.w, T(0));
      for (int64_t oh = 0; oh < a.oh; ++oh)
        for (int64_t ow = 0; ow < a.ow; ++ow) {
          const AvgWindow win(a, oh, ow);
          if (win.divisor <= 0) continue;
          const T g = dy[oh * a.ow + ow] / T(win.divisor);
          for (int64_t ih = win.h0; ih < win.h1; ++ih)
            for (int64_t iw = win.w0; iw < win.w1; ++iw) dx[ih * a.w + iw] += g;
        }
    }
  });
}

const bool kRegistered = [] {
  for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_max_pool2d.set(DeviceType::CPU, dtype_v<T>, max_pool2d_forward_cpu<T>);
    op_avg_pool2d.set(DeviceType::CPU, dtype_v<T>, avg_pool2d_forward_cpu<T>);
  });
  for_types<float, double>([](auto t) {
    using T = decltype(t);
    op_max_pool2d_backward.set(DeviceType::CPU, dtype_v<T>, max_pool2d_backward_cpu<T>);
    op_avg_pool2d_backward.set(DeviceType::CPU, dtype_v<T>, avg_pool2d_backward_cpu<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal

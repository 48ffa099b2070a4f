// The index math of the CUDA convolution and pooling kernels (kernels/cuda/conv_math.h) on the host, against
// the CPU ops: im2col columns times the weight give the convolution, the col2im gather is the adjoint of
// im2col and gives the data gradient, the max and average windows and the average gradient give the pooling
// ops' results. Runs on every machine; tests/cuda/test_conv.cpp checks the kernels themselves on a GPU.
#include "kernels/cuda/conv_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/ops.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_close;
using testing::uniform;

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw;
  Size2 stride = 1, pad = 0, dil = 1;
  int64_t groups = 1;
  ConvArgs args() const {
    ConvArgs a;
    a.n = n, a.c = c, a.h = h, a.w = w, a.o = o, a.kh = kh, a.kw = kw;
    a.stride_h = stride.h, a.stride_w = stride.w, a.pad_h = pad.h, a.pad_w = pad.w;
    a.dil_h = dil.h, a.dil_w = dil.w, a.groups = groups;
    a.oh = (h + 2 * pad.h - dil.h * (kh - 1) - 1) / stride.h + 1;
    a.ow = (w + 2 * pad.w - dil.w * (kw - 1) - 1) / stride.w + 1;
    return a;
  }
  std::string str() const {
    return detail::str_cat("x [", n, ", ", c, ", ", h, ", ", w, "] o ", o, " k ", kh, "x", kw, " stride (",
                           stride.h, ", ", stride.w, ") pad (", pad.h, ", ", pad.w, ") dil (", dil.h, ", ",
                           dil.w, ") groups ", groups);
  }
};

const std::vector<ConvCase> kConvCases = {
    {2, 3, 7, 9, 4, 3, 3},
    {1, 4, 8, 8, 6, 3, 3, 2, 1, 1, 2},
    {2, 4, 10, 7, 4, 3, 2, {2, 1}, {1, 0}, {2, 1}, 4},
    {3, 2, 5, 5, 3, 1, 1},
    {1, 6, 9, 11, 6, 3, 3, 3, 2, 2, 3},
    {1, 2, 4, 4, 3, 2, 2, 1, 3, 1, 1},
    {2, 3, 5, 5, 2, 5, 5},
    {1, 5, 6, 13, 7, 2, 4, {1, 3}, {0, 2}, {3, 1}, 1},
};

// The column buffer of all n images (one chunk) as the im2col kernel fills it.
std::vector<double> columns(const ConvArgs& a, const std::vector<double>& x) {
  const int64_t rows = a.c * a.kh * a.kw, cols = a.n * a.oh * a.ow;
  std::vector<double> col(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t q = 0; q < cols; ++q) {
      const int64_t src = math::im2col_source(a, r, q);
      col[size_t(r * cols + q)] = src >= 0 ? x[size_t(src)] : 0.0;
    }
  return col;
}

TEST(CudaConvMath, Im2colColumnsTimesTheWeightGiveTheConvolution) {
  for (const ConvCase& cc : kConvCases) {
    const ConvArgs a = cc.args();
    const Tensor x = uniform({a.n, a.c, a.h, a.w}, -1, 1, DType::F64, 1);
    const Tensor wt = uniform({a.o, a.c / a.groups, a.kh, a.kw}, -1, 1, DType::F64, 2);
    const std::vector<double> col = columns(a, x.to_vector<double>()), wv = wt.to_vector<double>();
    const int64_t cols = a.n * a.oh * a.ow, ohw = a.oh * a.ow, og = a.o / a.groups,
                  kk = a.c / a.groups * a.kh * a.kw;
    std::vector<double> y(size_t(a.n * a.o * ohw));
    for (int64_t img = 0; img < a.n; ++img)
      for (int64_t o = 0; o < a.o; ++o)
        for (int64_t p = 0; p < ohw; ++p) {
          double s = 0;
          const int64_t g = o / og;
          for (int64_t k = 0; k < kk; ++k)
            s += wv[size_t(o * kk + k)] * col[size_t((g * kk + k) * cols + img * ohw + p)];
          y[size_t((img * a.o + o) * ohw + p)] = s;
        }
    const Tensor want = ops::conv2d(x, wt, {}, cc.stride, cc.pad, cc.dil, cc.groups);
    expect_close(y, want.to_vector<double>(), {1e-12, 1e-12}, "im2col " + cc.str());
  }
}

// The gather the col2im kernel does: each input element sums the column entries that read it
// (math::for_each_reader), for columns of all a.n images.
std::vector<double> gather(const ConvArgs& a, const std::vector<double>& col) {
  std::vector<double> out(size_t(a.n * a.c * a.h * a.w));
  for (int64_t img = 0; img < a.n; ++img)
    for (int64_t c = 0; c < a.c; ++c)
      for (int64_t ih = 0; ih < a.h; ++ih)
        for (int64_t iw = 0; iw < a.w; ++iw) {
          double s = 0;
          math::for_each_reader(a, ih, iw, [&](int64_t i, int64_t j, int64_t oh, int64_t ow) {
            s += col[size_t(math::col_offset(a, a.n, img, c, i, j, oh, ow))];
          });
          out[size_t(((img * a.c + c) * a.h + ih) * a.w + iw)] = s;
        }
  return out;
}

TEST(CudaConvMath, Col2imGatherIsTheAdjointOfIm2colAndGivesTheDataGradient) {
  for (const ConvCase& cc : kConvCases) {
    const ConvArgs a = cc.args();
    const int64_t rows = a.c * a.kh * a.kw, cols = a.n * a.oh * a.ow, ohw = a.oh * a.ow;
    const std::vector<double> col = uniform({rows, cols}, -1, 1, DType::F64, 3).to_vector<double>();
    // The scatter (what col2im_add on the CPU does) ...
    std::vector<double> scattered(size_t(a.n * a.c * a.h * a.w), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t q = 0; q < cols; ++q) {
        const int64_t src = math::im2col_source(a, r, q);
        if (src >= 0) scattered[size_t(src)] += col[size_t(r * cols + q)];
      }
    // ... and the gather the kernel does.
    const std::vector<double> gathered = gather(a, col);
    expect_close(gathered, scattered, {1e-12, 1e-12}, "col2im " + cc.str());

    // W_g^T dy gathered is the data gradient.
    const Tensor wt = uniform({a.o, a.c / a.groups, a.kh, a.kw}, -1, 1, DType::F64, 4);
    const Tensor dy = uniform({a.n, a.o, a.oh, a.ow}, -1, 1, DType::F64, 5);
    const std::vector<double> wv = wt.to_vector<double>(), dyv = dy.to_vector<double>();
    const int64_t og = a.o / a.groups, kk = a.c / a.groups * a.kh * a.kw;
    std::vector<double> dcol(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t q = 0; q < cols; ++q) {
        const int64_t g = r / kk, k = r - g * kk, img = q / ohw, p = q - img * ohw;
        double s = 0;
        for (int64_t oc = g * og; oc < (g + 1) * og; ++oc)
          s += wv[size_t(oc * kk + k)] * dyv[size_t((img * a.o + oc) * ohw + p)];
        dcol[size_t(r * cols + q)] = s;
      }
    const std::vector<double> dx = gather(a, dcol);
    const Tensor want =
        ops::conv2d_backward_data(dy, wt, {a.n, a.c, a.h, a.w}, cc.stride, cc.pad, cc.dil, cc.groups);
    expect_close(dx, want.to_vector<double>(), {1e-12, 1e-12}, "backward data " + cc.str());
  }
}

TEST(CudaConvMath, FloorAndCeilDivisionOfNegativeNumbers) {
  EXPECT_EQ(math::floor_div(-1, 2), -1);
  EXPECT_EQ(math::floor_div(-4, 2), -2);
  EXPECT_EQ(math::floor_div(5, 2), 2);
  EXPECT_EQ(math::ceil_div(-1, 2), 0);
  EXPECT_EQ(math::ceil_div(-5, 2), -2);
  EXPECT_EQ(math::ceil_div(5, 2), 3);
  EXPECT_EQ(math::ceil_div(4, 2), 2);
}

struct PoolCase {
  int64_t h, w, kh, kw;
  Size2 stride, pad, dil = 1;
  PoolArgs args(int64_t planes) const {
    PoolArgs a;
    a.planes = planes, a.h = h, a.w = w, a.kh = kh, a.kw = kw;
    a.stride_h = stride.h, a.stride_w = stride.w, a.pad_h = pad.h, a.pad_w = pad.w;
    a.dil_h = dil.h, a.dil_w = dil.w;
    a.oh = (h + 2 * pad.h - dil.h * (kh - 1) - 1) / stride.h + 1;
    a.ow = (w + 2 * pad.w - dil.w * (kw - 1) - 1) / stride.w + 1;
    return a;
  }
  std::string str() const {
    return detail::str_cat(h, "x", w, " k ", kh, "x", kw, " stride (", stride.h, ", ", stride.w, ") pad (",
                           pad.h, ", ", pad.w, ") dil (", dil.h, ", ", dil.w, ")");
  }
};

const std::vector<PoolCase> kPoolCases = {
    {7, 9, 2, 2, 2, 0},          {8, 8, 3, 3, 2, 1},          {9, 7, 3, 2, {1, 2}, {1, 1}},
    {5, 11, 2, 3, 1, {1, 1}, 2}, {13, 6, 3, 3, 3, 1, {2, 1}}, {4, 4, 4, 4, 4, 2},
};

TEST(CudaConvMath, MaxWindowsMatchTheCpuMaxPoolIncludingTiesAndNan) {
  for (const PoolCase& pc : kPoolCases) {
    // max_pool2d allows padding up to half the dilated kernel.
    if (pc.pad.h * 2 > (pc.kh - 1) * pc.dil.h + 1 || pc.pad.w * 2 > (pc.kw - 1) * pc.dil.w + 1) continue;
    // Small integers make ties; a NaN or two in plane 1.
    std::vector<float> xv = uniform({2, 3, pc.h, pc.w}, 0, 4, DType::F32, 6).to_vector<float>();
    for (float& v : xv) v = std::floor(v);
    xv[size_t(pc.h * pc.w + 1)] = std::numeric_limits<float>::quiet_NaN();
    xv[size_t(pc.h * pc.w + pc.w + 2)] = std::numeric_limits<float>::quiet_NaN();
    const Tensor x = tensor(xv, {2, 3, pc.h, pc.w});
    const PoolArgs a = pc.args(6);
    const auto [want_y, want_i] = ops::max_pool2d_with_indices(x, {pc.kh, pc.kw}, pc.stride, pc.pad, pc.dil);
    std::vector<double> y, idx;
    for (int64_t p = 0; p < a.planes; ++p)
      for (int64_t oh = 0; oh < a.oh; ++oh)
        for (int64_t ow = 0; ow < a.ow; ++ow) {
          float best;
          int64_t at;
          math::max_window<float>(
              a, oh, ow, [&](int64_t k) { return xv[size_t(p * a.h * a.w + k)]; }, best, at);
          y.push_back(best);
          idx.push_back(double(at));
        }
    expect_close(y, want_y.to_vector<double>(), {0, 0}, "max " + pc.str());
    expect_close(idx, want_i.to_vector<double>(), {0, 0}, "argmax " + pc.str());
  }
}

TEST(CudaConvMath, AverageWindowsAndTheirGradientMatchTheCpuAvgPool) {
  for (const PoolCase& pc : kPoolCases) {
    if (pc.dil.h != 1 || pc.dil.w != 1 || pc.pad.h * 2 > pc.kh || pc.pad.w * 2 > pc.kw) continue;
    for (bool include_pad : {true, false}) {
      PoolArgs a = pc.args(3);
      a.count_include_pad = include_pad;
      const std::string what = pc.str() + (include_pad ? " counting padding" : "");
      const Tensor x = uniform({3, pc.h, pc.w}, -1, 1, DType::F64, 8);
      const std::vector<double> xv = x.to_vector<double>();
      std::vector<double> y;
      for (int64_t p = 0; p < a.planes; ++p)
        for (int64_t oh = 0; oh < a.oh; ++oh)
          for (int64_t ow = 0; ow < a.ow; ++ow) {
            const math::AvgWindow win(a, oh, ow);
            double s = 0;
            for (int64_t ih = win.h0; ih < win.h1; ++ih)
              for (int64_t iw = win.w0; iw < win.w1; ++iw) s += xv[size_t((p * a.h + ih) * a.w + iw)];
            y.push_back(s / double(win.divisor));
          }
      expect_close(y, ops::avg_pool2d(x, {pc.kh, pc.kw}, pc.stride, pc.pad, include_pad).to_vector<double>(),
                   {1e-14, 1e-12}, "avg " + what);

      const Tensor dy = uniform({3, a.oh, a.ow}, -1, 1, DType::F64, 9);
      const std::vector<double> dyv = dy.to_vector<double>();
      std::vector<double> dx;
      for (int64_t p = 0; p < a.planes; ++p)
        for (int64_t ih = 0; ih < a.h; ++ih)
          for (int64_t iw = 0; iw < a.w; ++iw)
            dx.push_back(math::avg_pool_input_grad<double>(
                a, ih, iw, [&](int64_t k) { return dyv[size_t(p * a.oh * a.ow + k)]; }));
      const Tensor want =
          ops::avg_pool2d_backward(dy, {3, pc.h, pc.w}, {pc.kh, pc.kw}, pc.stride, pc.pad, include_pad);
      expect_close(dx, want.to_vector<double>(), {1e-14, 1e-12}, "avg backward " + what);
    }
  }
}

}  // namespace
}  // namespace frugal

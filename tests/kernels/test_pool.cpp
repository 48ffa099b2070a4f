// max_pool2d and avg_pool2d, forward and backward, against loops written from PyTorch's definition (ties,
// NaN, padding, dilation, count_include_pad), in every dtype; gradcheck in f64 on every layout; bad inputs.
// The 2 x 2 pool from oneDNN's blocked layout (cpu::max_pool2x2_blocked_to_nchw) against max_pool2d.
#include <bit>
#include <cmath>
#include <limits>
#include <set>

#include "autograd/functions.h"
#include "core/quant_kernels.h"
#include "kernels/cpu/pool.h"
#include "tests/autograd/gradcheck_helpers.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::Layout;
using testing::uniform;

struct PoolCase {
  Shape x;  // [N, C, H, W] or [C, H, W]
  Size2 kernel, stride, pad = 0, dil = 1;
  std::string str() const {
    return detail::str_cat("x ", x, " kernel (", kernel.h, ", ", kernel.w, ") stride (", stride.h, ", ",
                           stride.w, ") pad (", pad.h, ", ", pad.w, ") dil (", dil.h, ", ", dil.w, ")");
  }
};

const std::vector<PoolCase> kCases = {
    {{2, 3, 8, 8}, 2, 2},                    // W2's pool
    {{1, 2, 7, 9}, 3, 2, 1},                 // overlapping, padded
    {{2, 2, 9, 7}, {3, 2}, {1, 2}, {1, 0}},  // non-square everything
    {{3, 5, 6}, 2, 1},                       // unbatched, stride 1
    {{1, 1, 10, 11}, 3, {2, 3}, 1, {2, 1}},  // dilation (max only)
    {{2, 4, 5, 5}, 5, 1, 2},                 // window as large as the input
    {{1, 3, 1, 1}, 1, 1},                    // 1 x 1
    // Windows with no tap in the input (max only; Note [a window with no tap]): -inf at index -1.
    {{2, 2, 2, 1}, 2, {3, 2}, 1, {1, 2}},
    {{1, 2, 1, 1}, 2, 1, 1, 2},
};

// Naive max pool in f64: per window the first largest element (strictly greater wins) or a NaN; also the
// flat index within the plane.
void reference_max(const Tensor& x_in, const PoolCase& c, std::vector<double>& y, std::vector<int64_t>& idx) {
  const Tensor x = x_in.dim() == 3 ? x_in.unsqueeze(0) : x_in;
  const auto v = x.to_vector<double>();
  const int64_t planes = x.size(0) * x.size(1), h = x.size(2), w = x.size(3);
  const int64_t oh = (h + 2 * c.pad.h - c.dil.h * (c.kernel.h - 1) - 1) / c.stride.h + 1;
  const int64_t ow = (w + 2 * c.pad.w - c.dil.w * (c.kernel.w - 1) - 1) / c.stride.w + 1;
  y.clear();
  idx.clear();
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        double best = -INFINITY;
        int64_t at = -1;
        for (int64_t a = 0; a < c.kernel.h; ++a)
          for (int64_t b = 0; b < c.kernel.w; ++b) {
            const int64_t ih = i * c.stride.h - c.pad.h + a * c.dil.h,
                          iw = j * c.stride.w - c.pad.w + b * c.dil.w;
            if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
            const double e = v[size_t((p * h + ih) * w + iw)];
            if (at < 0 || e > best || std::isnan(e)) {
              at = ih * w + iw;
              best = e;
            }
          }
        y.push_back(best);
        idx.push_back(at);
      }
}

// Naive average pool in f64: the divisor counts the window's taps inside the padded input
// (count_include_pad) or inside the input.
std::vector<double> reference_avg(const Tensor& x_in, const PoolCase& c, bool include_pad) {
  const Tensor x = x_in.dim() == 3 ? x_in.unsqueeze(0) : x_in;
  const auto v = x.to_vector<double>();
  const int64_t planes = x.size(0) * x.size(1), h = x.size(2), w = x.size(3);
  const int64_t oh = (h + 2 * c.pad.h - c.kernel.h) / c.stride.h + 1;
  const int64_t ow = (w + 2 * c.pad.w - c.kernel.w) / c.stride.w + 1;
  std::vector<double> y;
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        double s = 0;
        int64_t inside = 0, padded = 0;
        for (int64_t a = 0; a < c.kernel.h; ++a)
          for (int64_t b = 0; b < c.kernel.w; ++b) {
            const int64_t ih = i * c.stride.h - c.pad.h + a, iw = j * c.stride.w - c.pad.w + b;
            if (ih >= -c.pad.h && ih < h + c.pad.h && iw >= -c.pad.w && iw < w + c.pad.w) ++padded;
            if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
            s += v[size_t((p * h + ih) * w + iw)];
            ++inside;
          }
        y.push_back(s / double(include_pad ? padded : inside));
      }
  return y;
}

TEST(MaxPool2d, MatchesReferenceInEveryDtype) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16})
    for (const PoolCase& c : kCases) {
      const Tensor x = uniform(c.x, -2, 2, t, 3);
      std::vector<double> want;
      std::vector<int64_t> want_idx;
      reference_max(x, c, want, want_idx);
      auto [y, idx] = ops::max_pool2d_with_indices(x, c.kernel, c.stride, c.pad, c.dil);
      EXPECT_EQ(y.dtype(), t);
      EXPECT_EQ(idx.dtype(), DType::I64);
      EXPECT_EQ(y.dim(), x.dim());
      expect_close(y, want, {0, 0}, std::string(dtype_name(t)) + " " + c.str());  // max is exact
      EXPECT_EQ(idx.to_vector<int64_t>(), want_idx) << c.str();
      // The kernels without the indices (what inference and evaluation run) give the same values.
      expect_close(ops::max_pool2d(x, c.kernel, c.stride, c.pad, c.dil), want, {0, 0},
                   std::string(dtype_name(t)) + " without indices " + c.str());
    }
}

// The differentiable max_pool2d keeps its i64 indices only where a backward will read them: without grad it
// allocates the output alone (the indices would be twice an f32 output's bytes).
TEST(MaxPool2d, KeepsIndicesOnlyForABackward) {
  auto bytes_of_call = [](const Tensor& x) {
    const int64_t before = memory::stats(kCPU).allocated.current;
    memory::reset_peak(kCPU);
    const Tensor y = max_pool2d(x, 2);
    return std::pair{memory::stats(kCPU).allocated.peak - before, y.nbytes()};
  };
  const Tensor x = uniform({4, 8, 32, 32}, -1, 1, DType::F32, 7);
  const auto [plain, y_bytes] = bytes_of_call(x);
  EXPECT_LT(plain, 2 * y_bytes) << "no indices without grad";
  {
    NoGradGuard no_grad;
    EXPECT_LT(bytes_of_call(x.clone().requires_grad_()).first, 2 * y_bytes) << "no indices under NoGradGuard";
  }
  EXPECT_GE(bytes_of_call(x.clone().requires_grad_()).first, 3 * y_bytes) << "y and its i64 indices";
}

TEST(MaxPool2d, TiesTakeTheFirstAndNanPropagates) {
  // Every window of a constant input ties: PyTorch's index is the window's first in-range element.
  const PoolCase c{{1, 1, 4, 5}, 3, 2, 1};
  const Tensor x = full({1, 1, 4, 5}, 0.5);
  auto [y, idx] = ops::max_pool2d_with_indices(x, c.kernel, c.stride, c.pad);
  std::vector<double> want;
  std::vector<int64_t> want_idx;
  reference_max(x, c, want, want_idx);
  EXPECT_EQ(idx.to_vector<int64_t>(), want_idx);
  EXPECT_EQ(idx.to_vector<int64_t>()[0], 0);
  // -inf everywhere still names an element of the window, so backward has somewhere to go.
  auto [yi, ii] = ops::max_pool2d_with_indices(full({1, 1, 2, 2}, -INFINITY), 2);
  EXPECT_EQ(ii.to_vector<int64_t>()[0], 0);
  EXPECT_EQ(yi.to_vector<double>()[0], -INFINITY);
  Tensor n = uniform({1, 1, 4, 4}, 0, 1);
  n.data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  const auto yn = ops::max_pool2d(n, 2).to_vector<double>();
  EXPECT_TRUE(std::isnan(yn[0]));
  EXPECT_FALSE(std::isnan(yn[1]));
}

// The 2x2, stride-2 path (kernels/cpu/pool.cpp: max_pool2d_2x2_plane) against the reference where ties are
// everywhere (values from {0, 1, 2}), with NaNs (a later NaN in a window takes the index), -inf, odd sizes
// whose last row and column no window reads, and wide planes, in every dtype.
TEST(MaxPool2d, TwoByTwoStrideTwoMatchesTheReferenceWithTiesAndNans) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16})
    for (const Shape& shape : {Shape{2, 3, 8, 8}, Shape{1, 2, 5, 7}, Shape{1, 1, 2, 2}, Shape{2, 2, 6, 70},
                               Shape{1, 2, 4, 28}, Shape{1, 1, 3, 15}}) {
      Tensor x = uniform(shape, 0, 3, DType::F64, 7);
      double* v = x.data<double>();
      for (int64_t i = 0; i < x.numel(); ++i) v[i] = std::floor(v[i]);
      for (int64_t i = 0; i < x.numel(); i += 7) v[i] = std::numeric_limits<double>::quiet_NaN();
      for (int64_t i = 3; i < x.numel(); i += 11) v[i] = -INFINITY;
      x = x.to(t);
      const PoolCase c{shape, 2, 2};
      std::vector<double> want;
      std::vector<int64_t> want_idx;
      reference_max(x, c, want, want_idx);
      auto [y, idx] = ops::max_pool2d_with_indices(x, c.kernel, c.stride, c.pad, c.dil);
      const auto got = y.to_vector<double>();
      ASSERT_EQ(got.size(), want.size()) << c.str();
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])))
            << dtype_name(t) << " " << c.str() << " at " << i << ": " << got[i] << " against " << want[i];
      EXPECT_EQ(idx.to_vector<int64_t>(), want_idx) << dtype_name(t) << " " << c.str();
    }
}

// x NCHW laid out in blocks of `block` channels, as oneDNN's aBcd8b / aBcd16b: [n][o / block][h][w][block].
std::vector<float> blocked_of(const Tensor& x, int64_t block) {
  const int64_t n = x.size(0), o = x.size(1), hw = x.size(2) * x.size(3);
  const float* v = x.data<float>();
  std::vector<float> blocked(size_t(x.numel()));
  for (int64_t img = 0; img < n; ++img)
    for (int64_t c = 0; c < o; ++c)
      for (int64_t p = 0; p < hw; ++p)
        blocked[size_t(((img * (o / block) + c / block) * hw + p) * block + c % block)] =
            v[(img * o + c) * hw + p];
  return blocked;
}

// cpu::max_pool2x2_blocked_to_nchw on x laid out in blocks of 8 and 16 channels is max_pool2d of x bit for
// bit (with relu, of relu(x)): ties everywhere (values from {0, 1, 2}), +0 and -0 in one window, NaNs with
// distinct payloads (the later one wins), negative values and -inf, odd sizes, and rows of more pooled
// pixels than the kernel's row buffer holds.
TEST(MaxPool2d, TwoByTwoFromBlockedChannelsMatchesNchwBitForBit) {
  for (const bool relu : {false, true})
    for (const int64_t block : {8, 16})
      for (const Shape& shape :
           {Shape{2, 16, 8, 8}, Shape{1, 16, 5, 7}, Shape{3, 32, 14, 14}, Shape{1, 16, 2, 2},
            Shape{1, 16, 3, 150}, Shape{1, 16, 2, 600}, Shape{1, 16, 41, 30}}) {
        const int64_t n = shape[0], o = shape[1], h = shape[2], w = shape[3];
        ASSERT_EQ(o % block, 0) << "the test lays out whole blocks";
        Tensor x = uniform(shape, 0, 3, DType::F32, 8);
        float* v = x.data<float>();
        for (int64_t i = 0; i < x.numel(); ++i)
          v[i] = std::floor(v[i]) == 0 && i % 2 ? -0.0f : std::floor(v[i]);
        for (int64_t i = 0; i < x.numel(); i += 7) v[i] = std::bit_cast<float>(uint32_t(0x7fc00000u + i));
        for (int64_t i = 3; i < x.numel(); i += 11) v[i] = -INFINITY;
        for (int64_t i = 5; i < x.numel(); i += 13) v[i] = -1.5f;
        const std::vector<float> blocked = blocked_of(x, block);
        Tensor y = empty({n, o, h / 2, w / 2}, DType::F32);
        cpu::max_pool2x2_blocked_to_nchw(blocked.data(), y.data<float>(), n * o / block, h, w, block, relu);
        const Tensor want = ops::max_pool2d(relu ? ops::relu(x) : x, 2);
        std::vector<uint32_t> got_bits, want_bits;
        for (float e : y.to_vector<float>()) got_bits.push_back(std::bit_cast<uint32_t>(e));
        for (float e : want.to_vector<float>()) want_bits.push_back(std::bit_cast<uint32_t>(e));
        EXPECT_EQ(got_bits, want_bits) << "blocks of " << block << ", x " << shape << (relu ? ", relu" : "");
      }
}

// cpu::max_pool2x2_blocked_to_nhwc_u8 writes the codes cpu::quantize_u8 gives max_pool2d(x, 2) (with relu,
// max_pool2d(relu(x), 2)), channels last: values across the whole range and beyond both ends of it, values
// halfway between two codes (rounded to the even one), NaNs (code 0, whichever tap holds them), +-inf, odd
// sizes, blocks of 8 and 16 channels.
TEST(MaxPool2d, TwoByTwoFromBlockedChannelsToCodesMatchesQuantisingTheNchwPool) {
  const float scale = 0.03f, inv = 1.0f / scale;
  const int32_t zp = 40, qmax = 127;
  for (const bool relu : {false, true})
    for (const int64_t block : {8, 16})
      for (const Shape& shape :
           {Shape{2, 16, 8, 8}, Shape{1, 32, 5, 7}, Shape{3, 32, 14, 14}, Shape{1, 16, 3, 41}}) {
        const int64_t n = shape[0], o = shape[1], h = shape[2], w = shape[3], pp = (h / 2) * (w / 2);
        Tensor x = uniform(shape, -3, 2.2, DType::F32, 9);
        float* v = x.data<float>();
        for (int64_t i = 0; i < x.numel(); i += 5) v[i] = (std::floor(v[i] * inv) + 0.5f) * scale;  // ties
        for (int64_t i = 2; i < x.numel(); i += 13) v[i] = NAN;
        for (int64_t i = 4; i < x.numel(); i += 17) v[i] = i % 2 ? INFINITY : -INFINITY;
        const std::vector<float> blocked = blocked_of(x, block);
        std::vector<uint8_t> got(size_t(n * pp * o), 0xff);
        cpu::max_pool2x2_blocked_to_nhwc_u8(blocked.data(), got.data(), n, o, h, w, block, relu, inv, zp,
                                            qmax);
        const Tensor pooled = ops::max_pool2d(relu ? ops::relu(x) : x, 2);
        std::vector<uint8_t> codes(size_t(pooled.numel()));
        cpu::quantize_u8(pooled.data<float>(), pooled.numel(), inv, zp, qmax, codes.data());
        std::vector<uint8_t> want(codes.size());
        for (int64_t img = 0; img < n; ++img)
          for (int64_t c = 0; c < o; ++c)
            for (int64_t p = 0; p < pp; ++p)
              want[size_t((img * pp + p) * o + c)] = codes[size_t((img * o + c) * pp + p)];
        EXPECT_EQ(got, want) << "blocks of " << block << ", x " << shape << (relu ? ", relu" : "");
        const std::set<uint8_t> seen(got.begin(), got.end());
        EXPECT_TRUE(seen.count(0) && seen.count(qmax) && seen.size() > 40) << seen.size() << " codes";
        // With relu, only NaN windows take code 0; the others are at least the zero point's.
        if (relu) {
          EXPECT_EQ(*std::next(seen.begin()), zp) << "blocks of " << block << ", x " << shape;
        }
      }
}

TEST(AvgPool2d, MatchesReferenceInEveryDtype) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16})
    for (bool include_pad : {true, false})
      for (const PoolCase& c : kCases) {
        if (c.dil.h != 1 || c.dil.w != 1) continue;  // avg_pool2d has no dilation
        const Tensor x = uniform(c.x, -2, 2, t, 4);
        const Tensor y = ops::avg_pool2d(x, c.kernel, c.stride, c.pad, include_pad);
        EXPECT_EQ(y.dtype(), t);
        const testing::Tol tol = t == DType::F32 ? testing::Tol{1e-6, 1e-6} : testing::tol_for(t);
        expect_close(y, reference_avg(x, c, include_pad), tol,
                     std::string(dtype_name(t)) + " " + c.str() + (include_pad ? " incl pad" : " excl pad"));
      }
}

TEST(Pool2d, StrideDefaultsToKernelAndNonContiguousInputs) {
  const Tensor x = uniform({2, 3, 8, 6}, -1, 1);
  expect_close(ops::max_pool2d(x, 2), ops::max_pool2d(x, 2, Size2(2)).to_vector<double>(), {0, 0}, "max");
  expect_close(ops::avg_pool2d(x, {2, 3}), ops::avg_pool2d(x, {2, 3}, Size2{2, 3}).to_vector<double>(),
               {0, 0}, "avg");
  const Tensor nhwc = x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
  ASSERT_FALSE(nhwc.is_contiguous());
  expect_close(ops::max_pool2d(nhwc, 3, 2, 1), ops::max_pool2d(x, 3, 2, 1).to_vector<double>(), {0, 0},
               "strided max");
  expect_close(ops::avg_pool2d(nhwc, 3, 2, 1), ops::avg_pool2d(x, 3, 2, 1).to_vector<double>(), {0, 0},
               "strided avg");
  EXPECT_EQ(ops::max_pool2d(zeros({0, 3, 8, 6}), 2).shape(), (Shape{0, 3, 4, 3}));
}

TEST(Pool2d, BackwardMatchesReference) {
  for (const PoolCase& c : kCases) {
    const Tensor x = uniform(c.x, -2, 2, DType::F32, 5);
    auto [y, idx] = ops::max_pool2d_with_indices(x, c.kernel, c.stride, c.pad, c.dil);
    const Tensor dy = uniform(y.shape(), -1, 1, DType::F32, 6);
    // max: dy scattered to the winners; overlapping windows add; a window with no tap (index -1) adds
    // nothing.
    std::vector<double> want(size_t(x.numel()), 0.0);
    const int64_t hw = x.size(-1) * x.size(-2), ohw = y.size(-1) * y.size(-2);
    const auto iv = idx.to_vector<int64_t>();
    const auto gv = dy.to_vector<double>();
    for (size_t i = 0; i < iv.size(); ++i)
      if (iv[i] >= 0) want[size_t(int64_t(i) / ohw * hw + iv[i])] += gv[i];
    expect_close(ops::max_pool2d_backward(dy, idx, x.shape()), want, {1e-6, 1e-6}, "max backward " + c.str());
    if (c.dil.h != 1 || c.dil.w != 1) continue;
    // avg: backward is the transpose of forward, so <dy, avg(x)> = <avg_backward(dy), x> for every x.
    for (bool include_pad : {true, false}) {
      const Tensor ya = ops::avg_pool2d(x, c.kernel, c.stride, c.pad, include_pad);
      const Tensor dxa = ops::avg_pool2d_backward(dy, x.shape(), c.kernel, c.stride, c.pad, include_pad);
      EXPECT_NEAR(ops::sum(ops::mul(ya, dy)).item<double>(), ops::sum(ops::mul(dxa, x)).item<double>(), 1e-4)
          << "avg backward " << c.str();
    }
  }
}

// The f16/bf16 backward kernels sum overlapping windows in f32 and round once: within half an ulp of the f32
// kernels' result on the same rounded values. (Summing in the 16-bit type would be off by several ulps on the
// windows that overlap most.)
TEST(Pool2d, HalfPrecisionBackwardMatchesF32) {
  for (DType t : {DType::F16, DType::BF16})
    for (const PoolCase& c : kCases) {
      const std::string what = std::string(dtype_name(t)) + " " + c.str();
      const testing::Tol once = {1e-6, t == DType::BF16 ? 0x1p-8 : 0x1p-11};
      const Tensor x = uniform(c.x, -2, 2, t, 7);
      auto [y, idx] = ops::max_pool2d_with_indices(x, c.kernel, c.stride, c.pad, c.dil);
      const Tensor dy = uniform(y.shape(), -1, 1, t, 8), dy32 = dy.to(DType::F32);
      const Tensor dx = ops::max_pool2d_backward(dy, idx, x.shape());
      EXPECT_EQ(dx.dtype(), t);
      expect_close(dx, ops::max_pool2d_backward(dy32, idx, x.shape()).to_vector<double>(), once,
                   "max backward " + what);
      if (c.dil.h != 1 || c.dil.w != 1) continue;
      for (bool include_pad : {true, false}) {
        const Tensor dxa = ops::avg_pool2d_backward(dy, x.shape(), c.kernel, c.stride, c.pad, include_pad);
        EXPECT_EQ(dxa.dtype(), t);
        expect_close(dxa,
                     ops::avg_pool2d_backward(dy32, x.shape(), c.kernel, c.stride, c.pad, include_pad)
                         .to_vector<double>(),
                     once, "avg backward " + what);
      }
    }
}

TEST(Pool2dGrad, GradcheckEveryCaseAndLayout) {
  for (const PoolCase& c : kCases)
    for (Layout layout : testing::kLayouts) {
      const std::string what = c.str() + " " + testing::layout_name(layout);
      // Distinct values (uniform draws) keep every max away from a tie under the finite difference.
      const Tensor x = testing::leaf(c.x, -1, 1, 31, layout);
      // A window with no tap is -inf whatever x is: clamped, so that its finite difference is 0, not NaN.
      testing::expect_grads_ok(
          [&](const std::vector<Tensor>& v) {
            return max_pool2d(v[0], c.kernel, c.stride, c.pad, c.dil).clamp_min(-1e30);
          },
          {x}, "max " + what);
      if (c.dil.h != 1 || c.dil.w != 1) continue;
      for (bool include_pad : {true, false})
        testing::expect_grads_ok(
            [&](const std::vector<Tensor>& v) {
              return avg_pool2d(v[0], c.kernel, c.stride, c.pad, include_pad);
            },
            {x}, "avg " + what);
    }
}

TEST(Pool2dGrad, LowPrecisionGradientsMatchF64) {
  const PoolCase c = kCases[1];
  const std::vector<Tensor> in = {testing::leaf(c.x, -1, 1, 41)};
  auto max_fn = [&](const std::vector<Tensor>& v) { return max_pool2d(v[0], c.kernel, c.stride, c.pad); };
  auto avg_fn = [&](const std::vector<Tensor>& v) {
    return avg_pool2d(v[0], c.kernel, c.stride, c.pad, false);
  };
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    testing::expect_grads_match_f64(max_fn, in, t, testing::tol_for(t), "max_pool2d");
    testing::expect_grads_match_f64(avg_fn, in, t, testing::tol_for(t), "avg_pool2d");
  }
}

TEST(Pool2d, BadInputs) {
  const Tensor x = ones({2, 3, 8, 8});
  expect_error<ShapeError>([&] { ops::max_pool2d(ones({8, 8}), 2); }, {"max_pool2d", "3-D", "4-D", "[8, 8]"});
  expect_error<Error>([&] { ops::max_pool2d(x, 0); },
                      {"max_pool2d", "kernel size must be positive", "(0, 0)"});
  expect_error<Error>([&] { ops::max_pool2d(x, 2, Size2{0, 1}); }, {"max_pool2d", "stride", "(0, 1)"});
  expect_error<Error>([&] { ops::avg_pool2d(x, 2, 2, -1); }, {"avg_pool2d", "padding", "(-1, -1)"});
  expect_error<Error>([&] { ops::max_pool2d(x, 2, 2, 0, 0); }, {"max_pool2d", "dilation", "(0, 0)"});
  expect_error<Error>([&] { ops::max_pool2d(x, 3, 1, 2); },
                      {"max_pool2d", "padding (2, 2)", "at most half", "(1, 1)"});
  expect_error<Error>([&] { ops::avg_pool2d(x, 2, 1, 2); },
                      {"avg_pool2d", "padding (2, 2)", "at most (1, 1)"});
  expect_error<ShapeError>(
      [&] {
        ops::max_pool2d(ones({1, 1, 2, 8}), 3);
      },
      {"max_pool2d", "[1, 1, 2, 8]", "output size is too small"});
  expect_error<ShapeError>(
      [&] {
        ops::avg_pool2d(ones({1, 0, 4, 4}), 2);
      },
      {"avg_pool2d", "non-empty", "[1, 0, 4, 4]"});
  expect_error<DTypeError>(
      [&] {
        ops::max_pool2d(ones({1, 1, 4, 4}, DType::I64), 2);
      },
      {"max_pool2d", "i64"});
  expect_error<ShapeError>(
      [&] {
        ops::max_pool2d_backward(ones({1, 1, 2, 2}), zeros({1, 1, 3, 3}, DType::I64), {1, 1, 4, 4});
      },
      {"max_pool2d_backward", "[1, 1, 2, 2]", "[1, 1, 3, 3]"});
  // Indices outside [-1, H W): an IndexError, nothing written past the planes; -1 adds nothing.
  for (int64_t bad : {int64_t(4), int64_t(-2), int64_t(1) << 40})
    expect_error<IndexError>(
        [&] {
          ops::max_pool2d_backward(ones({2, 1, 1, 1}), full({2, 1, 1, 1}, bad, DType::I64), {2, 1, 2, 2});
        },
        {"max_pool2d_backward", std::to_string(bad), "2 x 2"});
  EXPECT_EQ(ops::max_pool2d_backward(ones({1, 1, 1, 2}), tensor<int64_t>({-1, 3}, {1, 1, 1, 2}), {1, 1, 2, 2})
                .to_vector<float>(),
            std::vector<float>({0, 0, 0, 1}));
  expect_error<ShapeError>(
      [&] {
        ops::avg_pool2d_backward(ones({1, 1, 3, 3}), {1, 1, 4, 4}, 2, 2, 0, true);
      },
      {"avg_pool2d_backward", "[1, 1, 3, 3]", "[1, 1, 2, 2]"});
  expect_error<Error>([&] { max_pool2d(x.detach().requires_grad_(), 3, 1, 2); },
                      {"max_pool2d", "at most half"});
}

}  // namespace
}  // namespace frugal

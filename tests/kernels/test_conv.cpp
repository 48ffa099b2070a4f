// conv2d forward, backward data and backward weight/bias: the registered f32 kernels (oneDNN in both layout
// policies, or im2col) and the im2col fallback against the naive f64 reference over a grid of shapes and
// arguments; f16/bf16 against f32; gradcheck in f64 for every argument combination and layout; bad inputs.
#include <cstring>
#include <thread>

#include "autograd/functions.h"
#include "core/op_table_conv.h"
#include "kernels/cpu/reference.h"
#include "tests/autograd/gradcheck_helpers.h"
#include "tests/kernels/conv_case.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using Case = testing::ConvCase;

using testing::expect_close;
using testing::expect_error;
using testing::Layout;
using testing::uniform;

// Groups, dilation, strides, padding (also wider than the kernel), batch 1, non-square everything, 1x1, a
// kernel as large as the input, depthwise, and the W2 layers at a small batch.
const std::vector<Case> kCases = {
    {2, 3, 7, 9, 4, 3, 3},
    {1, 4, 8, 8, 6, 3, 3, 2, 1, 1, 2},
    {2, 4, 10, 7, 4, 3, 2, {2, 1}, {1, 0}, {2, 1}, 4, false},
    {3, 2, 5, 5, 3, 1, 1},
    {1, 6, 9, 11, 6, 3, 3, 3, 2, 2, 3},
    {1, 3, 6, 6, 5, 5, 5, 1, 2, 1, 1, false},
    {1, 2, 4, 4, 3, 2, 2, 1, 3, 1, 1},
    {2, 3, 5, 5, 2, 5, 5},
    {1, 5, 6, 13, 7, 2, 4, {1, 3}, {0, 2}, {3, 1}, 1},
    {2, 1, 28, 28, 8, 3, 3, 1, 1},
    {2, 32, 14, 14, 16, 3, 3, 1, 1},
};

// f32 vs f64 tolerance for sums of k products of values in [-1, 1].
testing::Tol conv_tol(int64_t k) { return {2e-6 * double(k), 1e-4}; }

struct Tensors {
  Tensor x, w, b, dy;
};
Tensors inputs(const Case& c, DType t, uint64_t seed = 1) {
  return {uniform(c.x_shape(), -1, 1, t, seed), uniform(c.w_shape(), -1, 1, t, seed + 1),
          c.bias ? uniform({c.o}, -1, 1, t, seed + 2) : Tensor(), uniform(c.y_shape(), -1, 1, t, seed + 3)};
}

// The three directions through the naive f64 reference, from the (any dtype) inputs.
struct Results {
  Tensor y, dx, dw, db;
};
Results reference_results(const Case& c, const Tensors& in) {
  const Tensor x = in.x.to(DType::F64).contiguous(), w = in.w.to(DType::F64).contiguous(),
               dy = in.dy.to(DType::F64).contiguous();
  const Tensor b = c.bias ? in.b.to(DType::F64).contiguous() : Tensor();
  Results r{empty(c.y_shape(), DType::F64), empty(c.x_shape(), DType::F64), empty(c.w_shape(), DType::F64),
            c.bias ? empty({c.o}, DType::F64) : Tensor()};
  ConvArgs a = c.args();
  a.x = x.raw_data(), a.weight = w.raw_data(), a.bias = c.bias ? b.raw_data() : nullptr, a.dy = dy.raw_data();
  a.y = r.y.raw_data(), a.dx = r.dx.raw_data(), a.dweight = r.dw.raw_data();
  a.dbias = c.bias ? r.db.raw_data() : nullptr;
  reference::conv2d_forward<double>(a);
  reference::conv2d_backward_data<double>(a);
  reference::conv2d_backward_weight<double>(a);
  return r;
}

Results op_results(const Case& c, const Tensors& in) {
  Results r;
  r.y = ops::conv2d(in.x, in.w, in.b, c.stride, c.pad, c.dil, c.groups);
  r.dx = ops::conv2d_backward_data(in.dy, in.w, c.x_shape(), c.stride, c.pad, c.dil, c.groups);
  std::tie(r.dw, r.db) =
      ops::conv2d_backward_weight(in.dy, in.x, c.w_shape(), c.stride, c.pad, c.dil, c.groups, c.bias);
  return r;
}

void expect_results(const Results& got, const Results& ref, const Case& c, testing::Tol fwd,
                    testing::Tol bwd_w, const std::string& what) {
  EXPECT_EQ(got.y.shape(), c.y_shape()) << what;
  expect_close(got.y, ref.y.to_vector<double>(), fwd, what + " forward, " + c.str());
  expect_close(got.dx, ref.dx.to_vector<double>(), fwd, what + " backward data, " + c.str());
  expect_close(got.dw, ref.dw.to_vector<double>(), bwd_w, what + " backward weight, " + c.str());
  if (c.bias) expect_close(got.db, ref.db.to_vector<double>(), bwd_w, what + " backward bias, " + c.str());
  EXPECT_EQ(got.db.defined(), c.bias) << what;
}

TEST(Conv2d, RegisteredF32MatchesReferenceInBothLayouts) {
  for (bool any : {false, true}) {
    set_conv_onednn_any_layout(any);
    for (const Case& c : kCases) {
      const Tensors in = inputs(c, DType::F32);
      const int64_t k_fwd = c.c / c.groups * c.kh * c.kw + c.o / c.groups * c.kh * c.kw;
      expect_results(op_results(c, in), reference_results(c, in), c, conv_tol(k_fwd),
                     conv_tol(c.n * c.oh() * c.ow()), any ? "f32 (any layout)" : "f32 (nchw)");
    }
  }
  set_conv_onednn_any_layout(true);  // the default
}

// Note [Winograd convolutions]: W2's second layer at its training batch runs oneDNN's Winograd kernel in
// every direction with Winograd switched on, and with it off (the default) the direct one. Both within the
// direct kernel's tolerance: measured, Winograd's largest error relative to the largest value was 1.2e-6
// (y), 2.0e-6 (dx), 0.7e-6 (dw), direct's 0.5e-6, 0.4e-6, 1.8e-6.
TEST(Conv2d, WinogradMatchesReference) {
  const Case c{64, 32, 14, 14, 64, 3, 3, 1, 1};
  ConvArgs a = c.args();
  float dummy = 0;
  a.bias = a.dbias = &dummy;  // the plans with a bias, as ops::conv2d's
  const auto names = conv2d_onednn_implementations(a, DType::F32);
  if (names[0].find("avx512") == std::string::npos)
    GTEST_SKIP() << "oneDNN's Winograd kernel needs AVX-512 (and oneDNN); this build runs " << names[0];
  const Tensors in = inputs(c, DType::F32);
  const Results ref = reference_results(c, in);
  for (bool winograd : {true, false}) {
    set_conv_onednn_winograd(winograd);
    for (const std::string& name : conv2d_onednn_implementations(a, DType::F32))
      EXPECT_EQ(name.find("wino") != std::string::npos, winograd) << name;
    const int64_t k_fwd = c.c * c.kh * c.kw + c.o * c.kh * c.kw;
    expect_results(op_results(c, in), ref, c, conv_tol(k_fwd), conv_tol(c.n * c.oh() * c.ow()),
                   winograd ? "winograd" : "direct");
  }
  set_conv_onednn_winograd(false);  // the default
}

// Note [a large batch's forward in chunks]: past 64 images the forward runs over chunks of images, so its
// working memory (oneDNN's blocked x and y) is a chunk's; the values are the reference's. The direct kernel
// (the default): a Winograd scratchpad is sized by oneDNN's schedule, from the machine's caches, not by the
// images (7.2 MiB for a chunk of this shape on a Xeon with 2 MiB of L2 a core, where oneDNN takes Winograd).
TEST(Conv2d, ALargeBatchsForwardRunsInChunksOfImages) {
  const Case c{130, 16, 8, 8, 32, 3, 3, 1, 1};  // chunks of 44, 43, 43 images
  const Tensors in = inputs(c, DType::F32);
  const Results ref = reference_results(c, in);
  const int64_t before = memory::stats(kCPU).allocated.current;
  memory::reset_peak(kCPU);
  const Tensor y = ops::conv2d(in.x, in.w, in.b, c.stride, c.pad, c.dil, c.groups);
  const int64_t working = memory::stats(kCPU).allocated.peak - before - y.nbytes();
  const int64_t k_fwd = c.c * c.kh * c.kw + c.o * c.kh * c.kw;
  expect_close(y, ref.y.to_vector<double>(), conv_tol(k_fwd), "chunked forward " + c.str());
#ifdef FRUGAL_HAVE_ONEDNN
  // A whole batch's blocked x and y would be x's and y's bytes; a chunk's are about a third.
  EXPECT_LT(working, (in.x.nbytes() + y.nbytes()) / 2) << "working memory of the forward";
#endif
}

TEST(Conv2d, Im2colFallbackMatchesReference) {
  for (const Case& c : kCases) {
    const Tensors in = inputs(c, DType::F32);
    Results got{empty(c.y_shape()), empty(c.x_shape()), empty(c.w_shape()), c.bias ? empty({c.o}) : Tensor()};
    ConvArgs a = c.args();
    a.x = in.x.raw_data(), a.weight = in.w.raw_data(), a.bias = c.bias ? in.b.raw_data() : nullptr;
    a.dy = in.dy.raw_data(), a.y = got.y.raw_data(), a.dx = got.dx.raw_data(), a.dweight = got.dw.raw_data();
    a.dbias = c.bias ? got.db.raw_data() : nullptr;
    conv2d_forward_im2col_cpu(a);
    conv2d_backward_data_im2col_cpu(a);
    conv2d_backward_weight_im2col_cpu(a);
    const int64_t k_fwd = c.c / c.groups * c.kh * c.kw + c.o / c.groups * c.kh * c.kw;
    expect_results(got, reference_results(c, in), c, conv_tol(k_fwd), conv_tol(c.n * c.oh() * c.ow()),
                   "im2col");
  }
}

TEST(Conv2d, F64IsTheReference) {
  for (const Case& c : {kCases[1], kCases[4]}) {
    const Tensors in = inputs(c, DType::F64);
    expect_results(op_results(c, in), reference_results(c, in), c, {1e-12, 1e-10}, {1e-11, 1e-10}, "f64");
  }
}

// The 16-bit kernels (bf16: oneDNN's bf16 primitives in both layout policies, or f32 around them where oneDNN
// declines; f16: f32 around the f32 kernels) against the f32 kernels on the same rounded values: only the
// result's one rounding (half an ulp) and the f32 summation order may differ.
TEST(Conv2d, HalfPrecisionMatchesF32) {
  for (bool any : {false, true}) {
    set_conv_onednn_any_layout(any);
    for (DType t : {DType::F16, DType::BF16})
      for (const Case& c : kCases) {
        const Tensors in = inputs(c, t);
        const Results got = op_results(c, in);
        EXPECT_EQ(got.y.dtype(), t);
        EXPECT_EQ(got.dx.dtype(), t);
        EXPECT_EQ(got.dw.dtype(), t);
        const Tensors in32{in.x.to(DType::F32), in.w.to(DType::F32), c.bias ? in.b.to(DType::F32) : Tensor(),
                           in.dy.to(DType::F32)};
        const Results want = op_results(c, in32);
        const double unit_roundoff = t == DType::BF16 ? 0x1p-8 : 0x1p-11;
        const int64_t k_fwd = c.c / c.groups * c.kh * c.kw + c.o / c.groups * c.kh * c.kw;
        expect_results(got, want, c, {1e-5 * double(k_fwd), unit_roundoff},
                       {1e-5 * double(c.n * c.oh() * c.ow()), unit_roundoff},
                       std::string(dtype_name(t)) + (any ? " (any layout)" : " (nchw)"));
      }
  }
  set_conv_onednn_any_layout(true);  // the default
}

TEST(Conv2d, NonContiguousInputsUnbatchedAndEmptyBatch) {
  const Case c = kCases[1];
  const Tensors in = inputs(c, DType::F32);
  // The same values behind permuted strides.
  const Tensor x_nhwc = in.x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
  const Tensor w_strided =
      uniform({c.o, c.c / c.groups, c.kh, 2 * c.kw}, -1, 1, DType::F32, 9).slice(3, 0, 2 * c.kw, 2);
  ASSERT_FALSE(x_nhwc.is_contiguous());
  ASSERT_FALSE(w_strided.is_contiguous());
  const Tensor want = ops::conv2d(in.x, w_strided.contiguous(), in.b, c.stride, c.pad, c.dil, c.groups);
  expect_close(ops::conv2d(x_nhwc, w_strided, in.b, c.stride, c.pad, c.dil, c.groups),
               want.to_vector<double>(), {1e-6, 1e-6}, "strided x and w");
  // [C, H, W] is a batch of one.
  const Tensor one = ops::conv2d(in.x.select(0, 0), in.w, in.b, c.stride, c.pad, c.dil, c.groups);
  EXPECT_EQ(one.shape(), (Shape{c.o, c.oh(), c.ow()}));
  expect_close(
      one,
      ops::conv2d(in.x.narrow(0, 0, 1), in.w, in.b, c.stride, c.pad, c.dil, c.groups).to_vector<double>(),
      {1e-6, 1e-6}, "unbatched");
  const Tensor none = ops::conv2d(zeros({0, c.c, c.h, c.w}), in.w, in.b, c.stride, c.pad, c.dil, c.groups);
  EXPECT_EQ(none.shape(), (Shape{0, c.o, c.oh(), c.ow()}));
  auto [dw, db] = ops::conv2d_backward_weight(zeros({0, c.o, c.oh(), c.ow()}), zeros({0, c.c, c.h, c.w}),
                                              c.w_shape(), c.stride, c.pad, c.dil, c.groups, true);
  EXPECT_EQ(sum(abs(dw)).item<double>() + sum(abs(db)).item<double>(), 0.0);
}

TEST(Conv2d, CachedPrimitivesAreSharedAcrossThreads) {
  const Case c = kCases[9];
  const Tensors in = inputs(c, DType::F32);
  const std::vector<double> want = reference_results(c, in).y.to_vector<double>();
  std::vector<std::thread> threads;
  std::vector<std::vector<double>> got(4);
  for (size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i)
        got[t] = ops::conv2d(in.x, in.w, in.b, c.stride, c.pad, c.dil, c.groups).to_vector<double>();
    });
  for (auto& th : threads) th.join();
  for (const auto& g : got) expect_close(g, want, conv_tol(20), "threaded");
}

// ---- gradients -------------------------------------------------------------------------------------------

// Small f64 cases covering each argument on its own and together.
const std::vector<Case> kGradCases = {
    {2, 2, 5, 6, 3, 3, 3},
    {1, 4, 6, 5, 4, 3, 2, {2, 1}, {1, 0}, 1, 2},
    {2, 3, 7, 7, 3, 3, 3, 2, 2, 2, 3, false},
    {1, 2, 5, 5, 4, 2, 2, 1, 3, 1, 1},
    {2, 4, 6, 6, 2, 3, 3, {1, 2}, 1, {2, 1}, 2},
};

TEST(Conv2dGrad, GradcheckEveryCombinationAndLayout) {
  for (const Case& c : kGradCases)
    for (Layout layout : testing::kLayouts) {
      std::vector<Tensor> in = {testing::leaf(c.x_shape(), -1, 1, 11, layout),
                                testing::leaf(c.w_shape(), -1, 1, 12, layout)};
      if (c.bias) in.push_back(testing::leaf({c.o}, -1, 1, 13));
      testing::expect_grads_ok(
          [&](const std::vector<Tensor>& v) {
            return conv2d(v[0], v[1], c.bias ? v[2] : Tensor(), c.stride, c.pad, c.dil, c.groups);
          },
          in, c.str() + " " + testing::layout_name(layout));
    }
}

TEST(Conv2dGrad, OnlySomeInputsNeedGradAndUnbatched) {
  const Case c = kGradCases[1];
  const Tensor x = uniform(c.x_shape(), -1, 1, DType::F64, 3), w = uniform(c.w_shape(), -1, 1, DType::F64, 4);
  const Tensor b = uniform({c.o}, -1, 1, DType::F64, 5);
  auto fn = [&](const std::vector<Tensor>& v) {
    return conv2d(v[0], v[1], v[2], c.stride, c.pad, c.dil, c.groups);
  };
  // Each of x, weight, bias alone requiring grad: the rule computes only what is needed.
  for (int which = 0; which < 3; ++which) {
    std::vector<Tensor> in = {x.detach(), w.detach(), b.detach()};
    in[size_t(which)].requires_grad_();
    testing::expect_grads_ok(fn, in, "only input " + std::to_string(which));
  }
  testing::expect_grads_ok(
      [&](const std::vector<Tensor>& v) { return conv2d(v[0], v[1], {}, c.stride, c.pad, c.dil, c.groups); },
      {testing::leaf({c.c, c.h, c.w}, -1, 1, 6), testing::leaf(c.w_shape(), -1, 1, 7)}, "unbatched");
}

TEST(Conv2dGrad, LowPrecisionGradientsMatchF64) {
  const Case c = kGradCases[1];
  const std::vector<Tensor> in = {testing::leaf(c.x_shape(), -1, 1, 21),
                                  testing::leaf(c.w_shape(), -1, 1, 22), testing::leaf({c.o}, -1, 1, 23)};
  auto fn = [&](const std::vector<Tensor>& v) {
    return conv2d(v[0], v[1], v[2], c.stride, c.pad, c.dil, c.groups);
  };
  testing::expect_grads_match_f64(fn, in, DType::F32, {1e-5, 1e-5}, "conv2d");
  testing::expect_grads_match_f64(fn, in, DType::BF16, {0.1, 2e-2}, "conv2d");
  testing::expect_grads_match_f64(fn, in, DType::F16, {1e-2, 4e-3}, "conv2d");
}

// ---- both directions in one call (Note [one d y for both directions]) --------------------------------

// Bit for bit the composed ops (relu_backward, then each direction's op), in f32 and bf16, both layout
// policies, with and without the ReLU's mask (y with zeros, negatives and NaN), each subset of gradients:
// 16 output channels or a multiple (nChw16c, which the fused kernel writes itself where oneDNN takes it,
// with and without a tail of fewer than 16 positions), and others (a plain buffer reordered once).
TEST(Conv2dBackward, OneCallIsBitIdenticalToTheComposedOps) {
  const std::vector<Case> cases = {
      {2, 8, 14, 14, 32, 3, 3, 1, 1},     // 196 positions: 12 tiles and a tail of 4
      {2, 4, 16, 16, 16, 3, 3, 1, 1},     // 256: tiles only
      {3, 1, 9, 9, 16, 3, 3},             // 49 positions: 3 tiles and a tail of 1
      {1, 3, 5, 5, 16, 3, 3},             // 9 positions, all tail
      {2, 6, 7, 9, 20, 3, 3, 2, 1},       // 20 channels: not nChw16c
      {2, 4, 8, 8, 8, 3, 3, 1, 1, 1, 2},  // groups
      {1, 3, 5, 5, 4, 2, 2, 1, 0, 1, 1, false},
      {64, 32, 14, 14, 64, 3, 3, 1, 1},  // W2's second layer: Winograd in f32 (Note [Winograd convolutions])
  };
#ifdef FRUGAL_HAVE_ONEDNN
  EXPECT_TRUE(op_conv2d_backward.has(kCPU, DType::F32));  // the fused kernel runs below
#endif
  auto as_bits = [](const Tensor& t) {  // the bytes: -0 is not 0, and NaN equals itself
    if (!t.defined()) return std::vector<uint8_t>{};
    const Tensor c = t.contiguous();
    const auto* p = static_cast<const uint8_t*>(c.raw_data());
    return std::vector<uint8_t>(p, p + c.nbytes());
  };
  for (bool any : {true, false}) {
    set_conv_onednn_any_layout(any);
    for (const Case& c : cases)
      for (DType t : {DType::F32, DType::BF16})
        for (bool relu : {true, false})
          for (int need : {1, 2, 3}) {  // bit 0: d x; bit 1: d weight (and d bias)
            const bool need_dx = need & 1, need_dw = need & 2;
            const std::string name = c.str() + " " + dtype_name(t) + (relu ? " relu" : "") +
                                     (any ? " any" : " plain") + " need " + std::to_string(need);
            const Tensor x = uniform(c.x_shape(), -1, 1, t, 31), w = uniform(c.w_shape(), -1, 1, t, 32);
            const Tensor dy = uniform(c.y_shape(), -1, 1, t, 33);
            // y: zeros, positives, some negatives and NaN (relu_backward's select gives 0 for those).
            std::vector<double> v = uniform(c.y_shape(), -1, 1, DType::F64, 34).to_vector<double>();
            for (size_t i = 0; i < v.size(); ++i)
              v[i] = i % 11 == 3 ? std::nan("") : i % 13 == 5 ? -0.25 : std::max(v[i], 0.0);
            const Tensor y = tensor(v, c.y_shape()).to(t);
            const Tensor ry = relu ? y : Tensor();
            const ops::ConvGrads fused =
                ops::conv2d_backward(dy, need_dw ? x : Tensor(), need_dx ? w : Tensor(), ry, c.x_shape(),
                                     c.w_shape(), c.stride, c.pad, c.dil, c.groups, need_dx, need_dw, c.bias);
            const Tensor g = relu ? ops::relu_backward(dy, y) : dy;
            if (need_dx) {
              const Tensor dx =
                  ops::conv2d_backward_data(g, w, c.x_shape(), c.stride, c.pad, c.dil, c.groups);
              EXPECT_EQ(as_bits(fused.dx), as_bits(dx)) << name;
            } else {
              EXPECT_FALSE(fused.dx.defined()) << name;
            }
            if (need_dw) {
              auto [dw, db] =
                  ops::conv2d_backward_weight(g, x, c.w_shape(), c.stride, c.pad, c.dil, c.groups, c.bias);
              EXPECT_EQ(as_bits(fused.dweight), as_bits(dw)) << name;
              EXPECT_EQ(as_bits(fused.dbias), as_bits(db)) << name;
            } else if (c.bias) {
              EXPECT_EQ(as_bits(fused.dbias), as_bits(ops::sum(g, {0, 2, 3}))) << name;
            }
          }
  }
  set_conv_onednn_any_layout(true);  // the default
}

// Strided views (the op makes them contiguous) give the contiguous tensors' gradients, bytes and all.
TEST(Conv2dBackward, NonContiguousInputs) {
  const Case c{2, 4, 8, 8, 16, 3, 3, 1, 1};
  const Tensors in = inputs(c, DType::F32);
  const Tensor y = uniform(c.y_shape(), -1, 1, DType::F32, 8);
  auto nhwc = [](const Tensor& t) { return t.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2}); };
  const Tensor x_s = nhwc(in.x), dy_s = nhwc(in.dy), y_s = nhwc(y);
  const Tensor w_s = in.w.permute({1, 0, 2, 3}).contiguous().permute({1, 0, 2, 3});
  ASSERT_FALSE(x_s.is_contiguous() || dy_s.is_contiguous() || y_s.is_contiguous() || w_s.is_contiguous());
  auto grads = [&](const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& ry) {
    return ops::conv2d_backward(dy, x, w, ry, c.x_shape(), c.w_shape(), c.stride, c.pad, c.dil, c.groups,
                                true, true, true);
  };
  const ops::ConvGrads want = grads(in.dy, in.x, in.w, y), got = grads(dy_s, x_s, w_s, y_s);
  for (auto [g, w] : {std::pair{got.dx, want.dx}, {got.dweight, want.dweight}, {got.dbias, want.dbias}}) {
    ASSERT_TRUE(g.defined());
    EXPECT_EQ(0, std::memcmp(g.raw_data(), w.raw_data(), size_t(w.nbytes())));
  }
}

TEST(Conv2dBackward, BadInputs) {
  const Tensor x = uniform({2, 3, 6, 6}, -1, 1, DType::F32, 1),
               w = uniform({4, 3, 3, 3}, -1, 1, DType::F32, 2);
  const Tensor dy = uniform({2, 4, 4, 4}, -1, 1, DType::F32, 3);
  auto call = [&](const Tensor& g, const Tensor& xx, const Tensor& ww, const Tensor& ry) {
    return ops::conv2d_backward(g, xx, ww, ry, {2, 3, 6, 6}, {4, 3, 3, 3}, 1, 0, 1, 1, true, true, true);
  };
  expect_error<Error>([&] { call(Tensor(), x, w, {}); },
                      {"conv2d_backward", "the output gradient is undefined"});
  expect_error<Error>([&] { call(dy, Tensor(), w, {}); }, {"conv2d_backward", "d weight needs the input"});
  expect_error<Error>([&] { call(dy, x, Tensor(), {}); }, {"conv2d_backward", "d x needs the weight"});
  expect_error<ShapeError>(
      [&] {
        call(dy, x, w, uniform({2, 4, 4, 5}, -1, 1, DType::F32, 4));
      },
      {"the ReLU's output has shape [2, 4, 4, 5]", "the output gradient has shape [2, 4, 4, 4]"});
  expect_error<ShapeError>(
      [&] {
        call(dy, x, uniform({2, 3, 3, 3}, -1, 1, DType::F32, 7), {});
      },
      {"conv2d_backward", "the weight has shape [2, 3, 3, 3]", "expected [4, 3, 3, 3]"});
  expect_error<DTypeError>([&] { call(dy, x, w, dy.to(DType::F64)); },
                           {"conv2d_backward", "the ReLU's output is f64", "the output gradient f32"});
  expect_error<DeviceError>([&] { call(dy, x, w, dy.to(kMeta)); },
                            {"the ReLU's output is on meta", "the output gradient is on cpu"});
  expect_error<ShapeError>(
      [&] {
        call(uniform({2, 4, 4, 3}, -1, 1, DType::F32, 5), x, w, {});
      },
      {"the output gradient has shape [2, 4, 4, 3]", "output has shape [2, 4, 4, 4]"});
  expect_error<DTypeError>([&] { call(dy, x.to(DType::F64), w, {}); }, {"dtypes differ"});
  expect_error<ShapeError>(
      [&] {
        call(dy, uniform({2, 3, 6, 7}, -1, 1, DType::F32, 6), w, {});
      },
      {"conv2d_backward", "[2, 3, 6, 7]"});
}

// ---- bad inputs ------------------------------------------------------------------------------------------

TEST(Conv2d, BadInputs) {
  const Tensor x = ones({2, 4, 8, 8}), w = ones({6, 2, 3, 3});
  expect_error<ShapeError>([&] { ops::conv2d(ones({4, 8}), w); }, {"conv2d", "4-D input", "[4, 8]"});
  expect_error<ShapeError>([&] { ops::conv2d(x, ones({6, 4, 3})); }, {"conv2d", "4-D weight", "[6, 4, 3]"});
  expect_error<ShapeError>([&] { ops::conv2d(x, w); },
                           {"conv2d", "[2, 4, 8, 8]", "4 channels", "[6, 2, 3, 3]", "expects 2"});
  expect_error<ShapeError>(
      [&] {
        ops::conv2d(ones({2, 3, 8, 8}), ones({4, 1, 3, 3}), {}, 1, 0, 1, 3);
      },
      {"conv2d", "out_channels (4", "divisible by groups (3)"});
  expect_error<Error>([&] { ops::conv2d(x, w, {}, 1, 0, 1, 0); }, {"conv2d", "groups must be positive", "0"});
  expect_error<Error>([&] { ops::conv2d(x, w, {}, {1, 0}, 0, 1, 2); }, {"conv2d", "stride", "(1, 0)"});
  expect_error<Error>([&] { ops::conv2d(x, w, {}, 1, -1, 1, 2); }, {"conv2d", "padding", "(-1, -1)"});
  expect_error<Error>([&] { ops::conv2d(x, w, {}, 1, 0, 0, 2); }, {"conv2d", "dilation", "(0, 0)"});
  expect_error<ShapeError>(
      [&] {
        ops::conv2d(ones({1, 4, 2, 8}), w, {}, 1, 0, 1, 2);
      },
      {"conv2d", "padded input (2 x 8", "dilated kernel (3 x 3", "empty"});
  expect_error<ShapeError>([&] { ops::conv2d(x, w, {}, 1, 0, 4, 2); }, {"conv2d", "dilated kernel (9 x 9"});
  expect_error<ShapeError>([&] { ops::conv2d(x, w, ones({5}), 1, 0, 1, 2); },
                           {"conv2d", "bias of shape [6]", "[5]"});
  expect_error<DTypeError>([&] { ops::conv2d(x.to(DType::F64), w, {}, 1, 0, 1, 2); },
                           {"conv2d", "dtypes differ", "f64", "f32"});
  expect_error<DTypeError>([&] { ops::conv2d(x, w, ones({6}, DType::F64), 1, 0, 1, 2); },
                           {"conv2d", "bias", "f64"});
  expect_error<DTypeError>(
      [&] {
        ops::conv2d(ones({2, 4, 8, 8}, DType::I64), ones({6, 2, 3, 3}, DType::I64));
      },
      {"conv2d", "floating dtype", "i64"});
  expect_error<ShapeError>(
      [&] {
        ops::conv2d_backward_data(ones({2, 6, 5, 5}), w, x.shape(), 1, 0, 1, 2);
      },
      {"conv2d_backward_data", "[2, 6, 5, 5]", "[2, 6, 6, 6]"});
  expect_error<ShapeError>(
      [&] {
        ops::conv2d_backward_weight(ones({2, 6, 6, 6}), x, {6, 4, 3, 3}, 1, 0, 1, 2, true);
      },
      {"conv2d_backward_weight", "expects 8"});
  // Through autograd, the same messages.
  expect_error<ShapeError>([&] { conv2d(x, w.detach().requires_grad_()); }, {"conv2d", "expects 2"});
}

}  // namespace
}  // namespace frugal

// The fused convolution + ReLU op (frugal::conv2d_relu, behind nn::Sequential's Conv2d, ReLU pairs) against
// relu(conv2d): forward in every floating dtype (relu's rule in a pass over y after every kernel), a NaN
// bit for bit, strides, padding, dilation, groups, no bias, an unbatched input; gradients
// against the composite and by finite differences in f64; Sequential's fusion, with recompute segments; one
// tensor fewer in the arena; a Conv2d, ReLU and MaxPool2d without a tape over chunks of images (Note [a
// convolution, ReLU and pool in chunks]); ops::conv2d_relu_pool2 against max_pool2d(conv2d_relu) bit for bit,
// its memory and its dry run (Note [a convolution pooled from its blocked output]); bad inputs.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "core/estimate.h"
#include "kernels/cpu/reference.h"
#include "nn/containers.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "tests/autograd/gradcheck_helpers.h"
#include "tests/nn/sequential_grads.h"

namespace frugal {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::uniform;

struct ConvCase {
  Shape x, w;
  Size2 stride = 1, padding = 0, dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

const std::vector<ConvCase> kCases = {
    {{2, 3, 9, 8}, {4, 3, 3, 3}},
    {{2, 3, 9, 8}, {4, 3, 3, 3}, 2, 1, 1, 1, false},
    {{1, 4, 10, 10}, {6, 2, 3, 2}, 1, {1, 2}, 2, 2, true},
    {{3, 1, 28, 28}, {8, 1, 3, 3}, 1, 1},     // W2's first layer, fewer channels
    {{4, 32, 14, 14}, {64, 32, 3, 3}, 1, 1},  // W2's second layer
    {{3, 16, 7, 7}, {16, 16, 1, 1}, 1, 0, 1, 1, false},
};

std::string name_of(const ConvCase& c, DType t) {
  std::ostringstream s;
  s << "x " << c.x << " w " << c.w << " stride " << c.stride.h << " groups " << c.groups
    << (c.bias ? "" : " no bias") << " " << dtype_name(t);
  return s.str();
}

// The tolerance of one convolution output in dtype t against another way of computing it.
testing::Tol tol_of(DType t) {
  if (t == DType::BF16) return {1.0 / 64, 1.0 / 64};
  if (t == DType::F16) return {1e-3, 1e-3};
  if (t == DType::F64) return {1e-12, 1e-12};
  return {1e-5, 1e-5};
}

TEST(ConvRelu, ForwardMatchesConvThenRelu) {
  for (const ConvCase& c : kCases)
    for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
      const Tensor x = uniform(c.x, -1, 1, t, 1), w = uniform(c.w, -0.5, 0.5, t, 2);
      const Tensor b = c.bias ? uniform({c.w[0]}, -0.3, 0.3, t, 3) : Tensor();
      const Tensor y = ops::conv2d_relu(x, w, b, c.stride, c.padding, c.dilation, c.groups);
      const Tensor ref = ops::relu(ops::conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups));
      ASSERT_EQ(y.shape(), ref.shape()) << name_of(c, t);
      ASSERT_EQ(y.dtype(), t);
      expect_close(y, ref.to_vector<double>(), tol_of(t), name_of(c, t));
      // Both signs occur before the ReLU, so the mask is tested, and no output is negative.
      const auto v = y.to_vector<double>();
      EXPECT_TRUE(std::count(v.begin(), v.end(), 0.0) > 0) << name_of(c, t);
      EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](double e) { return e >= 0; })) << name_of(c, t);
    }
  // An unbatched input [C, H, W] is a batch of one.
  const Tensor x = uniform({3, 9, 8}, -1, 1, DType::F32, 4),
               w = uniform({4, 3, 3, 3}, -0.5, 0.5, DType::F32, 5);
  const Tensor y = ops::conv2d_relu(x, w, {}, 1, 1);
  ASSERT_EQ(y.shape(), (Shape{4, 9, 8}));
  expect_close(y, ops::relu(ops::conv2d(x, w, {}, 1, 1)).to_vector<double>(), tol_of(DType::F32),
               "unbatched");
}

TEST(ConvRelu, GradientsMatchTheComposite) {
  for (const ConvCase& c : kCases) {
    auto fused = [&](const std::vector<Tensor>& in) {
      return conv2d_relu(in[0], in[1], c.bias ? in[2] : Tensor(), c.stride, c.padding, c.dilation, c.groups);
    };
    auto composite = [&](const std::vector<Tensor>& in) {
      return relu(conv2d(in[0], in[1], c.bias ? in[2] : Tensor(), c.stride, c.padding, c.dilation, c.groups));
    };
    const std::vector<Tensor> in = {uniform(c.x, -1, 1, DType::F32, 6).requires_grad_(),
                                    uniform(c.w, -0.5, 0.5, DType::F32, 7).requires_grad_(),
                                    uniform({c.w[0]}, -0.3, 0.3, DType::F32, 8).requires_grad_()};
    EXPECT_EQ(std::string(fused(in).grad_fn_name()), "conv2d_relu");
    const auto g_fused = testing::grads_of(fused, in), g_ref = testing::grads_of(composite, in);
    for (size_t i = 0; i < (c.bias ? 3u : 2u); ++i)
      expect_close(g_fused[i], g_ref[i].to_vector<double>(), testing::Tol{1e-4, 1e-4},
                   name_of(c, DType::F32) + " gradient " + std::to_string(i));
  }
}

TEST(ConvRelu, Gradcheck) {
  // Finite differences in f64; these seeds keep every pre-activation clear of the ReLU's kink.
  testing::expect_grads_ok(
      [](const std::vector<Tensor>& in) { return conv2d_relu(in[0], in[1], in[2], 1, 1); },
      {testing::leaf({2, 2, 5, 4}, -1, 1, 11), testing::leaf({3, 2, 3, 3}, -1, 1, 12),
       testing::leaf({3}, -1, 1, 13)},
      "conv2d_relu padding 1");
  testing::expect_grads_ok(
      [](const std::vector<Tensor>& in) { return conv2d_relu(in[0], in[1], {}, 2, 0, 1, 2); },
      {testing::leaf({1, 4, 6, 6}, -1, 1, 14), testing::leaf({2, 2, 2, 2}, -1, 1, 15)},
      "conv2d_relu stride 2 groups 2 no bias");
}

// Sequential runs a Conv2d, ReLU pair as one op, with the values and gradients of the modules run one by one
// (through a ReLU subclass, which the fusion leaves alone); recompute segments change no gradient bit.
struct OtherReLU : nn::ReLUImpl {};

nn::Sequential make_cnn(bool other_relu) {
  manual_seed(9);
  auto relu = [&]() -> std::shared_ptr<nn::Module> {
    if (other_relu) return std::make_shared<OtherReLU>();
    return nn::ReLU().ptr();
  };
  nn::Sequential net;
  net->push_back(nn::Conv2d(nn::Conv2dOptions(1, 8, 3).padding(1)));
  net->push_back(relu());
  net->push_back(nn::MaxPool2d(2));
  net->push_back(nn::Conv2d(nn::Conv2dOptions(8, 16, 3).padding(1)));
  net->push_back(relu());
  net->push_back(nn::MaxPool2d(2));
  net->push_back(nn::Flatten());
  net->push_back(nn::Linear(16 * 3 * 3, 5));
  return net;
}

TEST(ConvRelu, SequentialFusesConvReluPairs) {
  const Tensor x = uniform({6, 1, 12, 12}, -1, 1, DType::F32, 30);
  nn::Sequential pair{nn::Conv2d(nn::Conv2dOptions(1, 4, 3)), nn::ReLU()};
  EXPECT_EQ(std::string(pair->forward(x).grad_fn_name()), "conv2d_relu");
  nn::Sequential other{nn::Conv2d(nn::Conv2dOptions(1, 4, 3)), std::make_shared<OtherReLU>()};
  EXPECT_EQ(std::string(other->forward(x).grad_fn_name()), "relu");
  auto fused = make_cnn(false), plain = make_cnn(true);
  const auto g_fused = testing::expect_nets_agree(*fused, *plain, x, testing::Tol{1e-4, 1e-4});
  // Segments of 3 modules keep each pair together (Conv2d, ReLU, MaxPool2d): bit-identical gradients.
  auto rec = make_cnn(false);
  rec->recompute_every(3);
  const auto g_rec = testing::sequential_grads(*rec, x);
  for (size_t i = 0; i < g_fused.size(); ++i) {
    const auto a = g_rec[i].to_vector<double>(), b = g_fused[i].to_vector<double>();
    EXPECT_EQ(a, b) << "recompute_every(3) parameter " << i;
  }
}

// No tensor holds the values before the ReLU: the fused forward allocates one output fewer than conv2d and
// relu in turn, as the arena's count of allocations shows.
TEST(ConvRelu, AllocatesOneTensorFewer) {
  const Tensor x = uniform({4, 8, 14, 14}, -1, 1, DType::F32, 40),
               w = uniform({16, 8, 3, 3}, -0.5, 0.5, DType::F32, 41);
  memory::Allocator& arena = memory::allocator(kCPU);
  auto allocs = [&](const std::function<Tensor()>& f) {
    f();  // oneDNN's primitive and the cached blocks first
    const int64_t before = arena.stats().num_allocs;
    const Tensor y = f();
    return arena.stats().num_allocs - before;
  };
  const int64_t fused = allocs([&] { return ops::conv2d_relu(x, w, {}, 1, 1); });
  const int64_t unfused = allocs([&] { return ops::relu(ops::conv2d(x, w, {}, 1, 1)); });
  EXPECT_EQ(fused + 1, unfused);
}

// Without a tape, a Conv2d, a ReLU and a MaxPool2d run over chunks of images: bit for bit the three layers
// apart, for a batch that is not a whole number of chunks and pools of either shape; the convolution's
// whole output never exists; the dry run agrees. With a tape, the three run apart (backward needs them).
// 16 channels fill oneDNN's blocks of 8 (AVX2) and of 16 (AVX-512), so the pool reads the blocked chunks on
// either (8 channels would be padded to 16 with AVX-512, and pooled from an NCHW copy of each chunk).
nn::Sequential conv_relu_pool(const nn::MaxPool2d& pool) {
  return nn::Sequential{nn::Conv2d(nn::Conv2dOptions(3, 16, 3).padding(1)), nn::ReLU(), pool};
}

TEST(ConvRelu, WithoutATapeSequentialPoolsEachChunkOfImages) {
  const int64_t batch = 100;
  const int64_t conv_bytes = batch * 16 * 12 * 12 * 4;
  const Tensor x = uniform({batch, 3, 12, 12}, -1, 1, DType::F32, 50);
  for (const nn::MaxPool2d& pool : {nn::MaxPool2d(2), nn::MaxPool2d(Size2(3), Size2(2), Size2(1))}) {
    manual_seed(51);
    nn::Sequential net = conv_relu_pool(pool);
    NoGradGuard no_tape;
    const Tensor apart = (*net)[2]->forward((*net)[1]->forward((*net)[0]->forward(x)));
    memory::reset_peak(kCPU);
    const int64_t before = memory::stats(kCPU).allocated.current;
    const Tensor y = net->forward(x);
    const int64_t peak = memory::stats(kCPU).allocated.peak - before;
    EXPECT_EQ(y.shape(), apart.shape());
    EXPECT_EQ(y.to_vector<float>(), apart.to_vector<float>());
    EXPECT_LT(peak, conv_bytes) << "the convolution's output for the whole batch was made";
    int64_t base = 0;
    const memory::Estimate e = memory::estimate([&](Device d) {
      manual_seed(51);
      nn::Sequential m = conv_relu_pool(pool);
      const Tensor xm = empty({batch, 3, 12, 12}, TensorOptions().device(d));
      base = memory::stats(d).allocated.current;
      memory::reset_peak(d);
      const Tensor ym = m->forward(xm);
    });
    EXPECT_EQ(e.peak_allocated - base, peak) << "the dry run";
  }
  nn::Sequential net = conv_relu_pool(nn::MaxPool2d(2));
  EXPECT_STREQ(net->forward(x).grad_fn_name(), "max_pool2d") << "with a tape the three run apart";
  // A view that is not contiguous (channels last, seen as NCHW) gives what the layers apart give.
  const Tensor view = uniform({batch, 12, 12, 3}, -1, 1, DType::F32, 52).permute({0, 3, 1, 2});
  ASSERT_FALSE(view.is_contiguous());
  NoGradGuard no_tape;
  EXPECT_EQ(net->forward(view).to_vector<float>(),
            (*net)[2]->forward((*net)[1]->forward((*net)[0]->forward(view))).to_vector<float>());
}

// conv2d_relu_pool2 is max_pool2d(conv2d_relu(...), 2) bit for bit (NaN and -0 included) in f32, f64 and
// bf16, with oneDNN's blocked layout and with NCHW, for outputs of odd sizes (the pool floors), channels that
// do not fill a block (the kernel's fallback), groups, strides, dilation, no bias, an unbatched input,
// views that are not contiguous, and batches of one chunk and of several.
const std::vector<ConvCase> kPoolCases = {
    {{3, 1, 28, 28}, {32, 1, 3, 3}, 1, 1},     // W2's first layer
    {{70, 32, 14, 14}, {64, 32, 3, 3}, 1, 1},  // W2's second: 4 chunks, conv2d_relu 2
    {{5, 3, 15, 13}, {16, 3, 3, 3}, 1, 0},     // 13 x 11 outputs: the last row and column are left out
    {{4, 3, 12, 12}, {12, 3, 3, 3}, 1, 1},     // 12 channels: 8-channel blocks are not filled
    {{2, 4, 16, 16}, {16, 2, 3, 3}, 2, 1, 1, 2, false},
    {{2, 8, 17, 17}, {8, 8, 3, 3}, 1, 2, 2},
};

// The bits of t's elements as f64 (NaN payloads and the sign of zero kept): what must match.
std::vector<uint64_t> bits_of(const Tensor& t) {
  std::vector<uint64_t> out;
  for (double v : t.to_vector<double>()) out.push_back(std::bit_cast<uint64_t>(v));
  return out;
}

TEST(ConvReluPool2, MatchesConvReluThenMaxPoolBitForBit) {
  for (const bool any : {true, false}) {
    set_conv_onednn_any_layout(any);
    for (const ConvCase& c : kPoolCases)
      for (DType t : {DType::F32, DType::F64, DType::BF16}) {
        const std::string name = (std::ostringstream() << "x " << c.x << " w " << c.w << " " << dtype_name(t)
                                                       << (any ? " blocked" : " nchw"))
                                     .str();
        Tensor x = uniform(c.x, -1, 1, t, 60);
        const Tensor w = uniform(c.w, -0.5, 0.5, t, 61);
        const Tensor b = c.bias ? uniform({c.w[0]}, -0.3, 0.3, t, 62) : Tensor();
        // A NaN input, which the ReLU keeps (ConvRelu.ANanComesThroughAsRelusDoes); the pool's NaN rule
        // itself is tested in test_pool.cpp.
        if (x.numel() > 40) {
          x = x.contiguous();
          Tensor first = x.reshape({-1}).narrow(0, 38, 1);
          first.fill_(std::numeric_limits<double>::quiet_NaN());
        }
        const Tensor y = ops::conv2d_relu_pool2(x, w, b, c.stride, c.padding, c.dilation, c.groups);
        const Tensor ref =
            ops::max_pool2d(ops::conv2d_relu(x, w, b, c.stride, c.padding, c.dilation, c.groups), 2);
        ASSERT_EQ(y.shape(), ref.shape()) << name;
        EXPECT_EQ(y.dtype(), t) << name;
        EXPECT_EQ(bits_of(y), bits_of(ref)) << name;
      }
  }
  set_conv_onednn_any_layout(true);  // the default
  // An unbatched input [C, H, W] is a batch of one.
  const Tensor x = uniform({3, 9, 8}, -1, 1, DType::F32, 63),
               w = uniform({8, 3, 3, 3}, -0.5, 0.5, DType::F32, 64);
  const Tensor y = ops::conv2d_relu_pool2(x, w, {}, 1, 1);
  ASSERT_EQ(y.shape(), (Shape{8, 4, 4}));
  EXPECT_EQ(bits_of(y), bits_of(ops::max_pool2d(ops::conv2d_relu(x, w, {}, 1, 1), 2)));
  // Views that are not contiguous: an input in channels last seen as NCHW, and a transposed weight.
  const Tensor view = uniform({40, 14, 14, 8}, -1, 1, DType::F32, 68).permute({0, 3, 1, 2});
  const Tensor wt = uniform({8, 16, 3, 3}, -0.5, 0.5, DType::F32, 69).transpose(0, 1);
  ASSERT_FALSE(view.is_contiguous());
  ASSERT_FALSE(wt.is_contiguous());
  EXPECT_EQ(bits_of(ops::conv2d_relu_pool2(view, wt, {}, 1, 1)),
            bits_of(ops::max_pool2d(ops::conv2d_relu(view.contiguous(), wt.contiguous(), {}, 1, 1), 2)));
}

// A NaN comes out of conv2d_relu as it comes out of relu(conv2d(...)), bit for bit (Note [conv2d_relu keeps
// a NaN], kernels/cpu/conv.cpp): a NaN pixel of one image (NaN wherever its window reaches) and a NaN weight
// (a NaN output channel), in every dtype, with oneDNN's blocked layout and with NCHW, for a shape in one
// chunk and W2's second layer over two; and out of nn::Sequential's Conv2d, ReLU pair (with a tape) and its
// Conv2d, ReLU, MaxPool2d (without: conv2d_relu_pool2), against the modules run one by one. oneDNN's ReLU
// post-op took such NaNs to 0.
TEST(ConvRelu, ANanComesThroughAsRelusDoes) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto nans_in = [](const Tensor& t) {
    const std::vector<double> v = t.to_vector<double>();
    return std::count_if(v.begin(), v.end(), [](double e) { return std::isnan(e); });
  };
  const std::vector<ConvCase> cases = {{{3, 8, 10, 10}, {16, 8, 3, 3}, 1, 1},
                                       {{70, 32, 14, 14}, {64, 32, 3, 3}, 1, 1}};
  for (const bool any : {true, false}) {
    set_conv_onednn_any_layout(any);
    for (const ConvCase& c : cases)
      for (DType t : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
        if (c.x[0] > 8 && (t == DType::F16 || t == DType::F64)) continue;  // chunks are oneDNN's: f32, bf16
        const std::string name = name_of(c, t) + (any ? " blocked" : " nchw");
        const Tensor x = uniform(c.x, -1, 1, t, 70).contiguous();
        const Tensor w = uniform(c.w, -0.5, 0.5, t, 71).contiguous();
        const Tensor b = uniform({c.w[0]}, -0.3, 0.3, t, 72);
        x.reshape({-1}).narrow(0, c.x[1] * c.x[2] * c.x[3] + 5 * c.x[3] + 4, 1).fill_(nan);  // image 1
        w.reshape({-1}).narrow(0, 5 * c.w[1] * c.w[2] * c.w[3] + 4, 1).fill_(nan);  // channel 5's centre
        const Tensor y = ops::conv2d_relu(x, w, b, c.stride, c.padding);
        const Tensor ref = ops::relu(ops::conv2d(x, w, b, c.stride, c.padding));
        EXPECT_EQ(bits_of(y), bits_of(ref)) << name;
        // Channel 5 of every image, and image 1's 3 x 3 pixels around the NaN in the other channels at
        // least (Winograd's tiles spread a NaN input over a whole tile of outputs).
        const int64_t plane = c.x[2] * c.x[3];
        EXPECT_GE(nans_in(y), c.x[0] * plane + (c.w[0] - 1) * 9) << name;
      }
  }
  set_conv_onednn_any_layout(true);  // the default
  manual_seed(73);
  nn::Sequential net = conv_relu_pool(nn::MaxPool2d(2));
  std::vector<double> xv = uniform({4, 3, 12, 12}, -1, 1, DType::F64, 74).to_vector<double>();
  xv[2 * 3 * 144 + 6 * 12 + 6] = nan;
  const Tensor x = tensor(xv, {4, 3, 12, 12}).to(DType::F32);
  nn::Sequential pair{(*net)[0], (*net)[1]};
  const Tensor conv = (*net)[0]->forward(x);
  const Tensor fused = pair->forward(x);
  EXPECT_STREQ(fused.grad_fn_name(), "conv2d_relu");
  EXPECT_EQ(bits_of(fused), bits_of(ops::relu(conv)));
  EXPECT_EQ(nans_in(fused), 16 * 9);
  NoGradGuard no_tape;
  const Tensor pooled = net->forward(x);
  EXPECT_EQ(bits_of(pooled), bits_of(ops::max_pool2d(ops::relu(conv), 2)));
  EXPECT_EQ(nans_in(pooled), 16 * 4);  // the 3 x 3 NaNs at rows and columns 5-7 meet 2 x 2 windows
}

// The fused kernel never holds the convolution's whole output (only a chunk's), and the dry run predicts its
// peak exactly, through the blocked path and through the fallback.
// How much less than conv2d_relu it holds depends on oneDNN's kernel: a direct one runs in chunks of at most
// 1 MiB of output (with AVX2, all three cases), Winograd (when switched on, AVX-512's choice for 32 -> 64) in
// conv2d_relu's own chunks of 64 images with their scratch beside them. Either way it saves at least the
// whole output less the pooled one, against conv2d_relu alone. The bytes compared are those requested: the
// blocks that serve them depend on what the arena held before (a block is split only if more than
// kLargeSplitRemainder would be left, core/allocator_base.h), and the dry run starts from an empty arena.
TEST(ConvReluPool2, HoldsAChunkOfTheOutputAndTheDryRunAgrees) {
  if (!ops::has_conv2d_relu_pool2(kCPU, DType::F32)) GTEST_SKIP() << "built without oneDNN";
  for (const ConvCase& c : {kPoolCases[0], kPoolCases[1], kPoolCases[3]}) {
    const Shape big_x{256, c.x[1], c.x[2], c.x[3]};
    const Tensor x = uniform(big_x, -1, 1, DType::F32, 65), w = uniform(c.w, -0.5, 0.5, DType::F32, 66),
                 b = uniform({c.w[0]}, -0.3, 0.3, DType::F32, 67);
    auto peak_of = [&](const std::function<Tensor()>& f) {
      const Tensor warm = f();  // oneDNN's plans first
      memory::reset_peak(kCPU);
      const int64_t before = memory::stats(kCPU).requested.current;
      const Tensor y = f();
      return memory::stats(kCPU).requested.peak - before;
    };
    const int64_t peak = peak_of([&] { return ops::conv2d_relu_pool2(x, w, b, c.stride, c.padding); });
    const int64_t unfused = peak_of([&] { return ops::conv2d_relu(x, w, b, c.stride, c.padding); });
    const int64_t conv_bytes = 256 * c.w[0] * c.x[2] * c.x[3] * 4;  // stride 1, "same" padding
    const int64_t pooled_bytes = conv_bytes / 4;
    if (c.w[0] % 8 == 0) {
      EXPECT_GE(unfused - peak, conv_bytes - pooled_bytes)
          << c.w << ": the convolution's output for the whole batch was made";
    }
    if (c.w[1] == 1) {  // W2's first layer: a direct kernel with AVX2 and with AVX-512, so chunks of <= 1 MiB
      EXPECT_LT(peak, conv_bytes / 2) << c.w << ": chunks of 64 images";
    }
    int64_t base = 0;
    const memory::Estimate e = memory::estimate([&](Device d) {
      const auto on = TensorOptions().device(d);
      const Tensor xm = empty(big_x, on), wm = empty(c.w, on), bm = empty({c.w[0]}, on);
      base = memory::stats(d).requested.current;
      memory::reset_peak(d);
      const Tensor ym = ops::conv2d_relu_pool2(xm, wm, bm, c.stride, c.padding);
    });
    EXPECT_EQ(e.peak_requested - base, peak) << c.w << ": the dry run";
  }
}

TEST(ConvRelu, BadInputs) {
  const Tensor x = uniform({2, 3, 8, 8}, -1, 1), w = uniform({4, 3, 3, 3}, -1, 1);
  expect_error<ShapeError>(
      [&] {
        ops::conv2d_relu(x, uniform({4, 2, 3, 3}, -1, 1));
      },
      {"conv2d_relu", "3 channels", "[4, 2, 3, 3]"});
  expect_error<ShapeError>([&] { ops::conv2d_relu(x, w, uniform({3}, -1, 1)); },
                           {"conv2d_relu", "bias", "[4]"});
  expect_error<DTypeError>([&] { ops::conv2d_relu(x, w.to(DType::F64)); }, {"conv2d_relu", "f32", "f64"});
  expect_error<ShapeError>([&] { conv2d_relu(uniform({3, 8}, -1, 1), w); }, {"conv2d_relu", "4-D"});
  expect_error<Error>([&] { ops::conv2d_relu(x, w, {}, 0); }, {"conv2d_relu", "stride"});
  expect_error<ShapeError>(
      [&] {
        ops::conv2d_relu_pool2(x, uniform({4, 2, 3, 3}, -1, 1));
      },
      {"conv2d_relu_pool2", "3 channels", "[4, 2, 3, 3]"});
  expect_error<DTypeError>([&] { ops::conv2d_relu_pool2(x, w.to(DType::F64)); },
                           {"conv2d_relu_pool2", "f32", "f64"});
  expect_error<Error>([&] { ops::conv2d_relu_pool2(x, w, {}, 0); }, {"conv2d_relu_pool2", "stride"});
  // An output of one row has no 2 x 2 window: max_pool2d's error.
  expect_error<ShapeError>(
      [&] {
        ops::conv2d_relu_pool2(uniform({2, 3, 3, 8}, -1, 1), w);
      },
      {"max_pool2d", "too small"});
  // Nothing was written into the inputs.
  expect_close(x, uniform({2, 3, 8, 8}, -1, 1).to_vector<double>(), testing::Tol{0, 0}, "x untouched");
}

}  // namespace
}  // namespace frugal

// nn::QuantizedConv2d: against the convolution of the dequantised input and weight written out here (in
// f64, through ops::conv2d), for strides, paddings, dilations, non-square kernels, no bias and batches that
// span several of its chunks; close to the f32 Conv2d; the fused ReLU, and ReLU + MaxPool2d(2); static
// quantisation of a CNN (prepare, calibrate, convert) with its bytes and a safetensors round trip; QAT of
// convolutions; dry runs of int8 CNNs; bad inputs.
#include <algorithm>
#include <cmath>
#include <set>

#include "autograd/functions.h"
#include "autograd/graph.h"
#include "core/estimate.h"
#include "core/memory.h"
#include "core/memory_history.h"
#include "core/ops.h"
#include "core/quant_kernels.h"
#include "io/safetensors.h"
#include "nn/containers.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/quant.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::uniform;

// dequant(quant(x)) conv dequant(quant(W)) + b in f64, the quantisation written out here: x per tensor to
// 0..127 with a zero point (over min(x, 0) .. max(x, 0)) unless `fixed` gives it, W per output channel
// symmetric to -127..127.
std::vector<double> reference(const Tensor& x, const nn::Conv2dImpl& conv,
                              const nn::quant::InputQuant* fixed) {
  const std::vector<float> xv = x.to_vector<float>(), wv = conv.weight.to_vector<float>();
  float xs, zp;
  if (fixed) {
    xs = fixed->scale, zp = float(fixed->zero_point);
  } else {
    float lo = 0, hi = 0;
    for (float v : xv) lo = std::min(lo, v), hi = std::max(hi, v);
    xs = (hi - lo) / 127.0f;
    zp = std::nearbyint(-lo / xs);
  }
  std::vector<double> xd(xv.size()), wd(wv.size());
  for (size_t i = 0; i < xv.size(); ++i)
    xd[i] = (double(std::clamp(std::nearbyint(xv[i] / xs) + zp, 0.0f, 127.0f)) - zp) * xs;
  const int64_t rows = conv.weight.size(0), cols = conv.weight.numel() / rows;
  for (int64_t o = 0; o < rows; ++o) {
    float amax = 0;
    for (int64_t i = 0; i < cols; ++i) amax = std::max(amax, std::fabs(wv[size_t(o * cols + i)]));
    const float ws = amax / 127.0f;
    for (int64_t i = 0; i < cols; ++i)
      wd[size_t(o * cols + i)] = double(std::nearbyint(wv[size_t(o * cols + i)] / ws)) * ws;
  }
  const nn::Conv2dOptions& o = conv.options();
  const Tensor b = conv.bias.defined() ? tensor<double>(
                                             [&] {
                                               std::vector<double> v;
                                               for (float f : conv.bias.to_vector<float>()) v.push_back(f);
                                               return v;
                                             }(),
                                             conv.bias.shape())
                                       : Tensor();
  return ops::conv2d(tensor<double>(xd, x.shape()), tensor<double>(wd, conv.weight.shape()), b, o.stride(),
                     o.padding(), o.dilation(), 1)
      .to_vector<double>();
}

struct Case {
  nn::Conv2dOptions options;
  Shape input;
};

TEST(QuantizedConv2d, MatchesQuantiseThenConvolveAndIsCloseToF32) {
  manual_seed(11);
  const std::vector<Case> cases = {
      {nn::Conv2dOptions(3, 8, 3).padding(1), Shape({2, 3, 9, 9})},
      {nn::Conv2dOptions(4, 6, 3).stride(2), Shape({3, 4, 11, 10})},
      {nn::Conv2dOptions(2, 5, {3, 2}).padding({2, 1}).dilation({2, 1}).bias(false), Shape({2, 2, 8, 7})},
      // 28 x 28 outputs: chunks of 5 images, so 12 images run as 5 + 5 + 2.
      {nn::Conv2dOptions(1, 4, 3).padding(1), Shape({12, 1, 28, 28})},
      // 12 channels and 42 pixels: the output's 8 x 8 blocks and its edges on both sides.
      {nn::Conv2dOptions(16, 12, 3).padding(1), Shape({3, 16, 6, 7})},
  };
  NoGradGuard ng;
  for (const Case& c : cases)
    for (bool onednn : {true, false}) {  // oneDNN's int8 convolution where it has one, and the im2col path
      cpu::set_int8_conv_onednn(onednn);
      nn::Conv2d conv(c.options);
      const Tensor x = uniform(c.input, -1, 2);
      const nn::quant::InputQuant fixed{0.02f, 40};
      for (bool dynamic : {true, false}) {
        nn::QuantizedConv2d q(conv->options(), conv->weight, conv->bias, dynamic ? nullptr : &fixed);
        const std::vector<float> got = q->forward(x).to_vector<float>();
        const std::vector<double> want = reference(x, *conv, dynamic ? nullptr : &fixed);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i])))
              << i << (dynamic ? " dynamic" : " static") << (onednn ? " oneDNN" : " im2col");
        if (!dynamic) continue;
        const Tensor f32 = conv->forward(x);
        EXPECT_EQ(q->forward(x).shape(), f32.shape());
        const std::vector<float> fv = f32.to_vector<float>();
        double err = 0, scale = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          err = std::max(err, std::fabs(double(got[i]) - fv[i]));
          scale = std::max(scale, std::fabs(double(fv[i])));
        }
        EXPECT_GT(err, 0.0);
        EXPECT_LT(err, 0.05 * scale);  // int8 is close to, not equal to, f32
      }
    }
  cpu::set_int8_conv_onednn(true);  // the default
}

// The codes are made a chunk of images at a time: quantised and then transposed channels last on oneDNN's
// path, NCHW on the im2col path. Both give every value the code quantize_input gives it, including where the
// input holds NaN and infinities (a NaN takes code 0, the bottom of the range, an infinity the end it points
// to): each path's output equals, bit for bit, its output for the values of those codes, and the two paths'
// outputs agree to the last bits (their sums are the same integers; the scale and bias may be fused into
// one rounding on one path and not the other, as clang builds contract them), where one code apart would
// move an output by about 1e-3.
TEST(QuantizedConv2d, BothPathsQuantiseTheInputAlikeNaNAndInfinitiesIncluded) {
  manual_seed(12);
  const nn::quant::InputQuant fixed{0.02f, 40};
  for (const Case& c : {Case{nn::Conv2dOptions(16, 8, 3).padding(1), Shape({3, 16, 6, 7})},
                        Case{nn::Conv2dOptions(3, 8, 3), Shape({2, 3, 9, 9})}}) {
    nn::Conv2d conv(c.options);
    NoGradGuard ng;
    nn::QuantizedConv2d q(conv->options(), conv->weight, conv->bias, &fixed);
    Tensor x = uniform(c.input, -1, 2);
    Tensor same = x.clone();  // x with each special value replaced by one of the same code
    const int64_t n = x.numel();
    const float lo = -40 * 0.02f, hi = 87 * 0.02f;
    for (auto [i, v, code_value] : {std::tuple{int64_t(0), NAN, lo},
                                    {n / 3, INFINITY, hi},
                                    {n / 2, -INFINITY, lo},
                                    {n - 1, NAN, lo},
                                    {n / 5 + 3, 1e30f, hi},
                                    {n / 7 + 1, -1e30f, lo}}) {
      x.data<float>()[i] = v;
      same.data<float>()[i] = code_value;
    }
    std::vector<std::vector<float>> got;
    for (bool onednn : {true, false}) {
      cpu::set_int8_conv_onednn(onednn);
      got.push_back(q->forward(x).to_vector<float>());
      EXPECT_EQ(got.back(), q->forward(same).to_vector<float>()) << (onednn ? "oneDNN" : "im2col");
    }
    cpu::set_int8_conv_onednn(true);  // the default
    ASSERT_EQ(got[0].size(), got[1].size());
    for (size_t i = 0; i < got[0].size(); ++i)
      ASSERT_NEAR(got[0][i], got[1][i], 1e-6 * (1 + std::fabs(got[1][i]))) << i << " of " << c.input;
  }
}

TEST(QuantizedConv2d, ReluRunsInTheSamePassAndSequentialUsesIt) {
  // 12 channels of 36 pixels: 8 x 8 blocks and edges.
  nn::Conv2d conv(nn::Conv2dOptions(2, 12, 3).padding(1));
  const Tensor x = uniform({2, 2, 6, 6}, -1, 1);
  NoGradGuard ng;
  nn::QuantizedConv2d q(conv->options(), conv->weight, conv->bias);
  const std::vector<float> plain = q->forward(x).to_vector<float>();
  const std::vector<float> fused = q->forward_relu(x).to_vector<float>();
  nn::Sequential seq{q, nn::ReLU()};
  const std::vector<float> in_seq = seq->forward(x).to_vector<float>();
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(fused[i], std::max(plain[i], 0.0f)) << i;
    EXPECT_EQ(in_seq[i], fused[i]) << i;
  }
  EXPECT_TRUE(std::any_of(plain.begin(), plain.end(), [](float v) { return v < 0; }));
}

// A QuantizedConv2d, a ReLU and a MaxPool2d(2) in a Sequential run as one pass (forward_relu_pool2) that
// writes only the pooled output: bit for bit the three run apart, on both int8 paths, with and without bias,
// static and dynamic, over odd output sizes (the pool drops the last row and column) and channels that fill
// the 8 x 8 blocks and their edges. Other pools after the ReLU run apart; an output smaller than a window
// gets max_pool2d's refusal.
TEST(QuantizedConv2d, ReluAndMaxPoolRunInTheSamePass) {
  manual_seed(12);
  NoGradGuard ng;
  const nn::quant::InputQuant fixed{0.03f, 30};
  for (bool onednn : {true, false}) {
    cpu::set_int8_conv_onednn(onednn);
    for (bool bias : {true, false})
      for (bool dynamic : {true, false}) {
        nn::Conv2d conv(nn::Conv2dOptions(16, 12, 3).padding(1).bias(bias));
        nn::QuantizedConv2d q(conv->options(), conv->weight, conv->bias, dynamic ? nullptr : &fixed);
        const Tensor x = uniform({3, 16, 9, 11}, -1, 2);
        const Tensor apart = max_pool2d(q->forward_relu(x), 2);
        ASSERT_EQ(apart.shape(), Shape({3, 12, 4, 5}));
        const std::string where = std::string(onednn ? "oneDNN" : "im2col") + (bias ? " bias" : "") +
                                  (dynamic ? " dynamic" : " static");
        EXPECT_EQ(q->forward_relu_pool2(x).to_vector<float>(), apart.to_vector<float>()) << where;
        nn::Sequential seq{q, nn::ReLU(), nn::MaxPool2d(2)};
        EXPECT_EQ(seq->forward(x).to_vector<float>(), apart.to_vector<float>()) << where;
        const std::vector<float> v = apart.to_vector<float>();
        EXPECT_TRUE(std::any_of(v.begin(), v.end(), [](float e) { return e > 0; })) << where;
        // A window of 3, and a stride of 1, are not fused; the result is still the three layers'.
        nn::Sequential three{q, nn::ReLU(), nn::MaxPool2d(3)};
        EXPECT_EQ(three->forward(x).to_vector<float>(), max_pool2d(q->forward_relu(x), 3).to_vector<float>());
        nn::Sequential overlapping{q, nn::ReLU(), nn::MaxPool2d(2, 1)};
        EXPECT_EQ(overlapping->forward(x).to_vector<float>(),
                  max_pool2d(q->forward_relu(x), 2, 1).to_vector<float>());
      }
  }
  cpu::set_int8_conv_onednn(true);  // the default
  nn::Conv2d conv(nn::Conv2dOptions(2, 4, 3));
  nn::QuantizedConv2d q(conv->options(), conv->weight, conv->bias);
  const Tensor tiny = uniform({1, 2, 3, 3}, -1, 1);  // a 1 x 1 output
  expect_error<ShapeError>([&] { max_pool2d(q->forward_relu(tiny), 2); },
                           {"max_pool2d: input [1, 4, 1, 1]", "output size is too small"});
  expect_error<ShapeError>([&] { q->forward_relu_pool2(tiny); },
                           {"max_pool2d: input [1, 4, 1, 1]", "output size is too small"});
  // A non-contiguous input (a transposed one) gives its copy's result.
  const Tensor view = uniform({2, 2, 6, 7}, -1, 1).transpose(2, 3);
  ASSERT_FALSE(view.is_contiguous());
  EXPECT_EQ(q->forward_relu_pool2(view).to_vector<float>(),
            q->forward_relu_pool2(view.contiguous()).to_vector<float>());
}

nn::Sequential small_cnn() {
  return nn::Sequential{nn::Conv2d(nn::Conv2dOptions(2, 6, 3).padding(1)),
                        nn::ReLU(),
                        nn::MaxPool2d(2),
                        nn::Conv2d(nn::Conv2dOptions(6, 8, 3).padding(1)),
                        nn::ReLU(),
                        nn::Flatten(),
                        nn::Linear(8 * 7 * 7, 10)};
}

// Note [an int8 convolution's input as codes]: a Conv2d, a ReLU and a MaxPool2d(2) in f32, then a static
// QuantizedConv2d, in a Sequential: the f32 block writes the int8 layer's codes and no f32 output. The result
// is the modules' run one by one, bit for bit: on both int8 paths, with the int8 layer alone, with its ReLU,
// and with its ReLU and pool; 16 channels (pooled from oneDNN's blocked layout) and 12 (oneDNN's layout does
// not fill its blocks: pooled in NCHW, then quantised and transposed); odd sizes; a NaN and an infinity in
// the input. A dynamic layer takes its f32 input as before (no codes), and so do mismatched channels (whose
// error is the one the layer gives). After the int8 layer's ReLU and MaxPool2d(2), a Flatten and a static
// QuantizedLinear take its pooled output as their codes too (forward_staged's codes_out).
TEST(QuantizedConv2d, AfterAnF32ConvolutionBlockItTakesCodesAndMatchesTheModulesOneByOne) {
  manual_seed(13);
  NoGradGuard ng;
  const nn::quant::InputQuant fixed{0.02f, 35};
  for (const int64_t mid : {16, 12})
    for (bool onednn : {true, false})
      for (int tail :
           {0, 1, 2, 3, 4}) {  // after the int8 layer: nothing, a ReLU, a ReLU and a MaxPool2d(2),
                               // and then a Flatten and a static (3) or dynamic (4) QuantizedLinear
        cpu::set_int8_conv_onednn(onednn);
        nn::Conv2d conv(nn::Conv2dOptions(3, mid, 3).padding(1));
        nn::Conv2d conv2(nn::Conv2dOptions(mid, 8, 3).padding(1));
        nn::QuantizedConv2d q(conv2->options(), conv2->weight, conv2->bias, &fixed);
        nn::Sequential seq{conv, nn::ReLU(), nn::MaxPool2d(2), q};
        if (tail >= 1) seq->push_back(nn::ReLU());
        if (tail >= 2) seq->push_back(nn::MaxPool2d(2));
        seq->push_back(nn::Flatten());
        if (tail >= 3) {  // 8 channels of 3 x 2 pooled pixels
          nn::Linear fc(48, 10);
          if (tail == 3)
            seq->push_back(nn::QuantizedLinear(fc->weight, fc->bias, 0.015f, 20));
          else
            seq->push_back(nn::QuantizedLinear(fc->weight, fc->bias));
          seq->push_back(nn::ReLU());
        }
        Tensor x = uniform({5, 3, 13, 11}, -1, 1);
        x.data<float>()[7] = -INFINITY;
        x.data<float>()[40] = INFINITY;
        x.data<float>()[100] = NAN;  // its pooled windows take code 0, as quantize_u8 takes a NaN
        Tensor h = x;
        for (size_t i = 0; i < seq->size(); ++i) h = (*seq)[i]->forward(h);
        const std::string where = std::to_string(mid) + " channels, " + (onednn ? "oneDNN" : "im2col") +
                                  ", tail " + std::to_string(tail);
        const std::vector<float> want = h.to_vector<float>();
        std::set<std::string> ops;  // what allocated, by the memory history's op names
        {
          memory::History history(kCPU);
          EXPECT_EQ(seq->forward(x).to_vector<float>(), want) << where;
          for (const memory::HistoryEvent& e : memory::history(kCPU).events) ops.insert(e.op);
        }
        EXPECT_TRUE(ops.count("conv2d_relu_pool2_codes")) << where;
        EXPECT_FALSE(ops.count("conv2d_relu_pool2")) << where;  // no f32 block output
        EXPECT_TRUE(std::any_of(want.begin(), want.end(), [](float v) { return v > 0; })) << where;
        EXPECT_TRUE(std::none_of(want.begin(), want.end(), [](float v) { return std::isnan(v); })) << where;
        const Tensor codes = nn::quant::conv2d_relu_pool2_codes(x, *conv, *q);
        ASSERT_TRUE(codes.defined()) << where;
        EXPECT_EQ(codes.shape(), Shape({5, 6, 5, mid}));
        EXPECT_EQ(codes.dtype(), DType::U8);
      }
  cpu::set_int8_conv_onednn(true);  // the default
  nn::Conv2d conv(nn::Conv2dOptions(3, 16, 3).padding(1));
  nn::Conv2d conv2(nn::Conv2dOptions(16, 8, 3));
  const Tensor x = uniform({2, 3, 10, 10}, -1, 1);
  nn::QuantizedConv2d dynamic(conv2->options(), conv2->weight, conv2->bias);
  EXPECT_FALSE(nn::quant::conv2d_relu_pool2_codes(x, *conv, *dynamic).defined());
  nn::Sequential seq{conv, nn::ReLU(), nn::MaxPool2d(2), dynamic};
  EXPECT_EQ(seq->forward(x).to_vector<float>(),
            dynamic->forward(max_pool2d(relu(conv->forward(x)), 2)).to_vector<float>());
  // A non-contiguous input (a channels-last view) takes the codes path and gives its copy's result.
  nn::QuantizedConv2d static_conv(conv2->options(), conv2->weight, conv2->bias, &fixed);
  nn::Sequential chain{conv, nn::ReLU(), nn::MaxPool2d(2), static_conv};
  const Tensor view = x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
  ASSERT_FALSE(view.is_contiguous());
  EXPECT_TRUE(nn::quant::conv2d_relu_pool2_codes(view, *conv, *static_conv).defined());
  EXPECT_EQ(chain->forward(view).to_vector<float>(), chain->forward(x).to_vector<float>());
  nn::Conv2d other(nn::Conv2dOptions(8, 8, 3));
  nn::QuantizedConv2d mismatched(other->options(), other->weight, other->bias, &fixed);
  EXPECT_FALSE(nn::quant::conv2d_relu_pool2_codes(x, *conv, *mismatched).defined());
  nn::Sequential bad{conv, nn::ReLU(), nn::MaxPool2d(2), mismatched};
  expect_error<ShapeError>([&] { bad->forward(x); },
                           {"QuantizedConv2d: expected an input of shape [N, 8, H, W]"});
  nn::QuantizedConv2d q(conv2->options(), conv2->weight, conv2->bias, &fixed);
  expect_error<Error>(
      [&] {
        dynamic->forward_staged(zeros({1, 4, 4, 16}, DType::U8), true, false, false);
      },
      {"dynamic"});
  expect_error<ShapeError>(
      [&] {
        q->forward_staged(zeros({1, 16, 4, 4}, DType::U8), true, false, false);
      },
      {"codes of shape [N, H, W, 16]"});
  expect_error<DTypeError>(
      [&] {
        q->forward_staged(zeros({1, 4, 4, 16}), true, false, false);
      },
      {"u8 codes"});
  nn::Linear fc(48, 10);
  nn::QuantizedLinear static_linear(fc->weight, fc->bias, 0.015f, 20), dynamic_linear(fc->weight, fc->bias);
  expect_error<Error>(
      [&] {
        dynamic_linear->forward_codes(zeros({2, 48}, DType::U8), false);
      },
      {"QuantizedLinear::forward_codes", "dynamic"});
  expect_error<ShapeError>(
      [&] {
        static_linear->forward_codes(zeros({2, 47}, DType::U8), false);
      },
      {"codes of shape [N, 48]"});
}

// The blocks a forward takes and gives back, in order: "+" or "-", bytes requested, the op that took them.
// Events [first, last) of the record.
std::vector<std::string> block_events(const memory::HistoryRecord& record, size_t first, size_t last) {
  std::vector<std::string> out;
  for (size_t i = first; i < last; ++i) {
    const memory::HistoryEvent& e = record.events[i];
    if (e.kind == memory::EventKind::Alloc || e.kind == memory::EventKind::Free)
      out.push_back((e.kind == memory::EventKind::Alloc ? "+" : "-") + std::to_string(e.requested) + " " +
                    e.op);
  }
  return out;
}

// A dry run (memory::estimate) of an int8 CNN's forward takes the blocks the real forward takes, in the same
// order: W2's shape with its static QuantizedConv2d taking the f32 block's codes and making the
// QuantizedLinear's (Note [an int8 convolution's input as codes]); a dynamic one (values in, values out);
// one without a pool; through oneDNN's int8 convolution and through im2col; batches of one chunk and of
// several; an input that is a view. A QuantizedEmbedding's lookup likewise. ModelPool sizes int8 requests
// from such dry runs.
TEST(QuantizedConv2d, ADryRunOfAnInt8CnnTakesTheSameBlocks) {
  // form 0: static, codes between the three blocks; 1: dynamic; 2: no pool after the int8 layer; 3: as 0 with
  // 12 channels in the f32 block, which fill no blocked layout's blocks (its codes come from an NCHW pool).
  auto make = [](int form) {
    const int64_t mid = form == 3 ? 12 : 16;
    nn::Sequential m{
        nn::Conv2d(nn::Conv2dOptions(1, mid, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
        nn::QuantizedConv2d(nn::Conv2dOptions(mid, 32, 3).padding(1), /*static_input=*/form != 1),
        nn::ReLU()};
    if (form == 2) return m;
    m->push_back(nn::MaxPool2d(2));
    m->push_back(nn::Flatten());
    m->push_back(nn::QuantizedLinear(32 * 7 * 7, 64, true, /*static_input=*/form != 1));
    m->push_back(nn::ReLU());
    m->push_back(nn::QuantizedLinear(64, 10));
    return m;
  };
  for (bool onednn : {true, false})
    for (int form : {0, 1, 2, 3})
      for (int64_t batch : {1, 9, 70}) {
        const bool view = batch == 9;  // the input a transposed view: the copy that makes it contiguous too
        const std::string where = std::string(onednn ? "oneDNN" : "im2col") + ", form " +
                                  std::to_string(form) + ", batch " + std::to_string(batch);
        cpu::set_int8_conv_onednn(onednn);
        size_t first = 0, last = 0;  // the forward's events in the dry run's timeline
        const memory::Estimate e = memory::estimate([&](Device d) {
          nn::Sequential m = make(form);
          Tensor x = empty({batch, 1, 28, 28}, TensorOptions(kF32).device(d));
          if (view) x = x.transpose(2, 3);
          first = memory::history(d).events.size();
          InferenceMode im;
          const Tensor y = m->forward(x);
          last = memory::history(d).events.size();
          EXPECT_EQ(y.size(0), batch) << where;
        });
        nn::Sequential m = make(form);
        Tensor x = uniform({batch, 1, 28, 28}, -1, 1);
        if (view) x = x.transpose(2, 3);
        ASSERT_EQ(x.is_contiguous(), !view);
        std::vector<std::string> real;
        {
          memory::History history(kCPU);
          InferenceMode im;
          const Tensor y = m->forward(x);
          const memory::HistoryRecord record = memory::history(kCPU);
          real = block_events(record, 0, record.events.size());
        }
        ASSERT_FALSE(real.empty()) << where;
        EXPECT_EQ(block_events(e.timeline, first, last), real) << where;
        if (form == 0 || form == 3) {  // the codes path ran
          const std::string codes = "+" + std::to_string(batch * 14 * 14 * (form == 3 ? 12 : 16));
          EXPECT_TRUE(std::find(real.begin(), real.end(), codes + " conv2d_relu_pool2_codes") != real.end())
              << where;
        }
      }
  cpu::set_int8_conv_onednn(true);  // the default
  // A QuantizedEmbedding's lookup, of i32 indices (cast to i64 first).
  int64_t peak = 0;
  const memory::Estimate e = memory::estimate([&](Device d) {
    nn::QuantizedEmbedding table(300, 24);
    const Tensor idx = empty({5, 7}, TensorOptions(DType::I32).device(d));
    const int64_t base = memory::stats(d).requested.current;
    memory::reset_peak(d);
    const Tensor y = table->forward(idx);
    EXPECT_EQ(y.shape(), Shape({5, 7, 24}));
    peak = memory::stats(d).requested.peak - base;
  });
  nn::QuantizedEmbedding table(300, 24);
  const Tensor idx = randint(0, 300, {5, 7}, DType::I32);
  const int64_t base = memory::stats(kCPU).requested.current;
  memory::reset_peak(kCPU);
  const Tensor y = table->forward(idx);
  EXPECT_EQ(memory::stats(kCPU).requested.peak - base, peak);
  EXPECT_EQ(peak, 5 * 7 * 8 + 5 * 7 * 24 * 4);  // the indices as i64, and the rows
  // Layers on the cpu given a dry run's input, and layers on the meta device given a cpu input, say so and
  // read nothing.
  nn::QuantizedConv2d cpu_conv(nn::Conv2dOptions(2, 4, 3), true);
  nn::QuantizedLinear cpu_linear(8, 4);
  const Tensor cpu_x = uniform({3, 8}, -1, 1);
  memory::estimate([&](Device d) {
    InferenceMode im;
    nn::QuantizedLinear meta_linear(8, 4);
    expect_error<DeviceError>([&] { meta_linear->forward(cpu_x); }, {"QuantizedLinear", "cpu", "meta"});
    expect_error<DeviceError>(
        [&] {
          cpu_conv->forward(empty({1, 2, 5, 5}, TensorOptions(kF32).device(d)));
        },
        {"QuantizedConv2d", "meta", "cpu"});
    expect_error<DeviceError>(
        [&] {
          cpu_linear->forward(empty({3, 8}, TensorOptions(kF32).device(d)));
        },
        {"QuantizedLinear", "meta", "cpu"});
    expect_error<DeviceError>([&] { table->forward(empty({3}, TensorOptions(DType::I64).device(d))); },
                              {"QuantizedEmbedding", "meta", "cpu"});
  });
}

// prepare wraps both Conv2ds and the Linear; convert gives QuantizedConv2d / QuantizedLinear with the
// calibrated input scales; the f32 weights are freed; the model stays close to f32 and saves and loads back
// bit-identically with its int8 weights as I8.
TEST(StaticQuant, ConvertsAConvNetAndItsBytesFall) {
  manual_seed(5);
  nn::Sequential net = small_cnn();
  const Tensor x = uniform({16, 2, 14, 14}, -0.5, 2, DType::F32, 8);
  std::vector<float> f32;
  {
    NoGradGuard ng;
    f32 = net->forward(x).to_vector<float>();
  }
  const int64_t before = memory::stats(kCPU).allocated.current;
  EXPECT_EQ(nn::quant::prepare(*net, nn::quant::Observer::MinMax), 3);
  EXPECT_NE(dynamic_cast<nn::ObservedConv2dImpl*>((*net)[0].get()), nullptr);
  {
    NoGradGuard ng;
    net->forward(x);
  }
  EXPECT_EQ(nn::quant::convert(*net), 3);
  const int64_t after = memory::stats(kCPU).allocated.current;
  // The arena's blocks (multiples of 512 B): f32 weights and biases before; after, int8 weights, and per
  // layer the f32 scales, the bias, the input scale and zero point.
  auto block = [](int64_t bytes) { return std::max<int64_t>(512, (bytes + 511) / 512 * 512); };
  const int64_t weights[] = {6 * 2 * 9, 8 * 6 * 9, 8 * 7 * 7 * 10}, outs[] = {6, 8, 10};
  int64_t f32_bytes = 0, int8_bytes = 0;
  for (int l = 0; l < 3; ++l) {
    f32_bytes += block(4 * weights[l]) + block(4 * outs[l]);
    int8_bytes += block(weights[l]) + 2 * block(4 * outs[l]) + 2 * block(4);
  }
  EXPECT_EQ(before - after, f32_bytes - int8_bytes);
  auto* conv = dynamic_cast<nn::QuantizedConv2dImpl*>((*net)[3].get());
  ASSERT_NE(conv, nullptr);
  ASSERT_TRUE(conv->input_scale.defined());
  EXPECT_EQ(conv->input_zero_point.item<int32_t>(), 0) << "after a ReLU the observed range starts at 0";
  EXPECT_EQ(nn::quant::int8_names(*net), (std::set<std::string>{"0.weight", "3.weight", "6.weight"}));
  NoGradGuard ng;
  const Tensor y = net->forward(x);
  const std::vector<float> got = y.to_vector<float>();
  double err = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, std::fabs(double(got[i]) - f32[i]));
    scale = std::max(scale, std::fabs(double(f32[i])));
  }
  EXPECT_LT(err, 0.05 * scale);
  // Save and load into a fresh model with the same structure: bit-identical outputs.
  const std::string path = ::testing::TempDir() + "quant_conv_roundtrip.safetensors";
  io::save_safetensors(path, net->state_dict(), {}, nn::quant::int8_names(*net));
  nn::Sequential other = small_cnn();
  nn::quant::prepare(*other);
  other->forward(uniform({2, 2, 14, 14}, -3, 3));
  nn::quant::convert(*other);
  const io::SafetensorsFile file = io::load_safetensors(path);
  EXPECT_EQ(file.int8_names, nn::quant::int8_names(*net));
  other->load_state_dict(file.tensors);
  EXPECT_EQ(other->forward(x).to_vector<float>(), got);
}

// prepare_qat takes the convolutions prepare takes: gradients reach their weights through the fake
// quantisation, and convert gives QuantizedConv2d layers that match the QAT model in eval.
TEST(Qat, ConvolutionsTrainThroughFakeQuantAndConvertMatchesTheQatModel) {
  manual_seed(6);
  nn::Sequential net = small_cnn();
  EXPECT_EQ(nn::quant::prepare_qat(*net), 3);
  ASSERT_NE(dynamic_cast<nn::QatConv2dImpl*>((*net)[0].get()), nullptr);
  const Tensor x = uniform({8, 2, 14, 14}, -0.5, 2, DType::F32, 9);
  for (int step = 0; step < 3; ++step) {
    for (const Tensor& p : net->parameters()) p.zero_grad();
    sum(net->forward(x)).backward();
  }
  for (const auto& [name, p] : net->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    const std::vector<float> g = p.grad().to_vector<float>();
    EXPECT_NE(std::count(g.begin(), g.end(), 0.0f), std::ptrdiff_t(g.size())) << name;
  }
  net->eval();
  std::vector<float> qat;
  {
    NoGradGuard ng;
    qat = net->forward(x).to_vector<float>();
  }
  EXPECT_EQ(nn::quant::convert(*net), 3);
  auto* conv = dynamic_cast<nn::QuantizedConv2dImpl*>((*net)[3].get());
  ASSERT_NE(conv, nullptr);
  EXPECT_TRUE(conv->input_scale.defined());
  NoGradGuard ng;
  const std::vector<float> got = net->forward(x).to_vector<float>();
  double scale = 0;
  for (float v : qat) scale = std::max(scale, std::fabs(double(v)));
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], qat[i], 1e-4 * (1 + scale)) << i;
}

TEST(QuantizedConv2d, RejectsBadInputsAndPrepareSkipsGroupedAndTinyConvs) {
  nn::Conv2d conv(nn::Conv2dOptions(2, 4, 3));
  nn::QuantizedConv2d q(conv->options(), conv->weight, conv->bias);
  expect_error<Error>([&] { nn::QuantizedConv2d(nn::Conv2dOptions(2, 4, 3).groups(2), false); },
                      {"QuantizedConv2d", "groups"});
  expect_error<Error>([&] { nn::QuantizedConv2d(nn::Conv2dOptions(3, 4, 3), conv->weight, conv->bias); },
                      {"QuantizedConv2d", "weight"});
  {
    const nn::quant::InputQuant bad{0.0f, 3};
    expect_error<Error>([&] { nn::QuantizedConv2d(conv->options(), conv->weight, conv->bias, &bad); },
                        {"QuantizedConv2d", "scale"});
  }
  NoGradGuard ng;
  expect_error<Error>([&] { q->forward(uniform({1, 3, 5, 5}, -1, 1)); }, {"QuantizedConv2d", "[N, 2, H, W]"});
  expect_error<Error>([&] { q->forward(uniform({1, 2, 2, 5}, -1, 1)); }, {"QuantizedConv2d", "smaller"});
  expect_error<Error>(
      [&] {
        q->forward(uniform({1, 2, 5, 5}, -1, 1, DType::F64));
      },
      {"QuantizedConv2d", "f32"});
  {
    EnableGradGuard on;
    Tensor x = uniform({1, 2, 5, 5}, -1, 1).requires_grad_();
    expect_error<Error>([&] { q->forward(x); }, {"QuantizedConv2d", "inference only"});
  }
  // After the refusals the layer still gives its result.
  const Tensor x = uniform({1, 2, 5, 5}, -1, 1);
  EXPECT_EQ(q->forward(x).shape(), Shape({1, 4, 3, 3}));
  EXPECT_EQ(q->forward(uniform({0, 2, 5, 5}, -1, 1)).shape(), Shape({0, 4, 3, 3}));  // an empty batch
  // A non-contiguous view gives what its contiguous copy gives.
  const Tensor view = uniform({1, 5, 2, 5}, -1, 1).transpose(1, 2);
  ASSERT_FALSE(view.is_contiguous());
  EXPECT_EQ(q->forward(view).to_vector<float>(), q->forward(view.contiguous()).to_vector<float>());
  // Grouped convolutions, and those with fewer than kMinConvPatch values a patch (1 x 3 x 3), stay f32; a
  // 2 x 3 x 3 one is taken.
  nn::Sequential skipped{
      nn::Conv2d(nn::Conv2dOptions(2, 4, 3).groups(2)), nn::ReLU(),
      nn::Conv2d(nn::Conv2dOptions(4, 1, 3)),           nn::Conv2d(nn::Conv2dOptions(1, 4, 3)),
      nn::Conv2d(nn::Conv2dOptions(4, 2, 1)),           nn::Conv2d(nn::Conv2dOptions(2, 2, 3))};
  static_assert(nn::quant::kMinConvPatch > 9 && nn::quant::kMinConvPatch <= 18);
  EXPECT_EQ(nn::quant::prepare(*skipped), 2);
  for (size_t i : {0, 3, 4}) EXPECT_NE(dynamic_cast<nn::Conv2dImpl*>((*skipped)[i].get()), nullptr) << i;
  for (size_t i : {2, 5}) EXPECT_NE(dynamic_cast<nn::ObservedConv2dImpl*>((*skipped)[i].get()), nullptr) << i;
}

}  // namespace
}  // namespace frugal

// nn::quant: the int8 GEMM (oneDNN) against the naive reference, exactly in s32; QuantizedLinear against a
// quantise-then-multiply written out here in double; quantize_dynamic's rewrite and the arena bytes it frees;
// a save/load round trip through safetensors; bad inputs.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>

#include "autograd/functions.h"
#include "autograd/graph.h"
#include "core/estimate.h"
#include "core/memory.h"
#include "core/quant_kernels.h"
#include "io/safetensors.h"
#include "io/serialize.h"
#include "nn/containers.h"
#include "nn/layers.h"
#include "nn/quant.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::uniform;

struct GemmShape {
  int64_t m, k, n;
};

// A few rows (Note [int8 on a few rows] in kernels/cpu/quant.cpp, with AVX-512 VNNI; oneDNN or the reference
// elsewhere) against the reference, bit for bit: every sum is exact in s32 and the output pass is the same.
// Rows one to 8 and past it, k below, at and past a 64-byte vector, n not a whole block, codes over all of
// u8, zero points from 0 to 127, with and without the bias and the ReLU.
TEST(QuantGemm, AFewRowsAreTheReferenceBitForBit) {
  std::mt19937 rng(17);
  for (GemmShape s : {GemmShape{1, 1, 1}, GemmShape{1, 63, 5}, GemmShape{2, 64, 4}, GemmShape{3, 65, 9},
                      GemmShape{8, 784, 256}, GemmShape{1, 256, 10}, GemmShape{9, 100, 6}})
    for (int32_t zp : {0, 37, 127}) {
      std::vector<uint8_t> x(size_t(s.m * s.k));
      std::vector<int8_t> w(size_t(s.n * s.k));
      std::vector<float> scale(size_t(s.n)), bias(size_t(s.n));
      for (auto& v : x) v = uint8_t(rng() % 256);
      for (auto& v : w) v = int8_t(int(rng() % 255) - 127);
      for (auto& v : scale) v = 1e-4f * float(1 + rng() % 1000);
      for (auto& v : bias) v = float(int(rng() % 2001) - 1000) / 300.0f;
      for (bool with_bias : {false, true})
        for (bool relu : {false, true}) {
          std::vector<float> out(size_t(s.m * s.n)), ref(out.size());
          const float* b = with_bias ? bias.data() : nullptr;
          cpu::int8_linear(x.data(), zp, w.data(), scale.data(), b, out.data(), s.m, s.k, s.n, relu);
          cpu::int8_linear_reference(x.data(), zp, w.data(), scale.data(), b, ref.data(), s.m, s.k, s.n,
                                     relu);
          for (size_t i = 0; i < out.size(); ++i)
            ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(ref[i]))
                << s.m << "x" << s.k << "x" << s.n << " zp " << zp << (with_bias ? " bias" : "")
                << (relu ? " relu" : "") << " at " << i << ": " << out[i] << " against " << ref[i];
        }
    }
}

TEST(QuantGemm, OneDnnEqualsReferenceExactlyInS32) {
  std::mt19937 rng(7);
  for (GemmShape s :
       {GemmShape{3, 5, 7}, GemmShape{1, 784, 256}, GemmShape{64, 256, 10}, GemmShape{256, 784, 256}}) {
    std::vector<uint8_t> x(size_t(s.m * s.k));
    std::vector<int8_t> w(size_t(s.n * s.k));
    for (auto& v : x) v = uint8_t(rng() % 128);  // Note [reduced range]
    for (auto& v : w) v = int8_t(int(rng() % 255) - 127);
    const int32_t zp = int32_t(rng() % 128);
    std::vector<int32_t> got(size_t(s.m * s.n)), want(got.size());
    cpu::int8_linear_s32(x.data(), zp, w.data(), got.data(), s.m, s.k, s.n);
    cpu::int8_linear_s32_reference(x.data(), zp, w.data(), want.data(), s.m, s.k, s.n);
    EXPECT_EQ(got, want) << s.m << "x" << s.k << "x" << s.n;
    std::vector<float> scale(size_t(s.n)), bias(size_t(s.n)), out(got.size()), ref(got.size());
    for (auto& v : scale) v = 1e-4f * float(1 + rng() % 100);
    for (auto& v : bias) v = float(int(rng() % 200) - 100) / 50.0f;
    cpu::int8_linear(x.data(), zp, w.data(), scale.data(), bias.data(), out.data(), s.m, s.k, s.n);
    cpu::int8_linear_reference(x.data(), zp, w.data(), scale.data(), bias.data(), ref.data(), s.m, s.k, s.n);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5f * (1 + std::fabs(ref[i]))) << i;
    // With the ReLU: both kernels give max(out, 0) of their own output, and there are negatives to clip.
    std::vector<float> out_relu(got.size()), ref_relu(got.size());
    cpu::int8_linear(x.data(), zp, w.data(), scale.data(), bias.data(), out_relu.data(), s.m, s.k, s.n, true);
    cpu::int8_linear_reference(x.data(), zp, w.data(), scale.data(), bias.data(), ref_relu.data(), s.m, s.k,
                               s.n, true);
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out_relu[i], std::max(out[i], 0.0f)) << i;
      ASSERT_EQ(ref_relu[i], std::max(ref[i], 0.0f)) << i;
    }
    EXPECT_TRUE(std::any_of(out.begin(), out.end(), [](float v) { return v < 0; }));
    // x given transposed (k, m), as QuantizedConv2d's patches: the same result bit for bit.
    std::vector<uint8_t> xt(x.size());
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t p = 0; p < s.k; ++p) xt[size_t(p * s.m + i)] = x[size_t(i * s.k + p)];
    std::vector<float> out_t(got.size());
    cpu::int8_linear_xt(xt.data(), zp, w.data(), scale.data(), bias.data(), out_t.data(), s.m, s.k, s.n,
                        true);
    EXPECT_EQ(out_t, out_relu) << s.m << "x" << s.k << "x" << s.n;
  }
#ifdef FRUGAL_HAVE_ONEDNN
  EXPECT_TRUE(cpu::int8_linear_uses_onednn(256, 784, 256));
#endif
}

// y = dequant(quant(x)) @ dequant(quant(W))^T + b, the quantisation written out independently here.
std::vector<double> reference_quantized_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  const std::vector<float> xv = x.to_vector<float>(), wv = w.to_vector<float>(), bv = b.to_vector<float>();
  float lo = 0, hi = 0;
  for (float v : xv) lo = std::min(lo, v), hi = std::max(hi, v);
  const float xs = (hi - lo) / 127.0f;
  const float zp = std::nearbyint(-lo / xs);
  std::vector<double> y(size_t(m * n));
  for (int64_t j = 0; j < n; ++j) {
    float amax = 0;
    for (int64_t p = 0; p < k; ++p) amax = std::max(amax, std::fabs(wv[size_t(j * k + p)]));
    const float ws = amax / 127.0f;
    for (int64_t i = 0; i < m; ++i) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double qx = std::clamp(std::nearbyint(xv[size_t(i * k + p)] / xs) + zp, 0.0f, 127.0f) - zp;
        const double qw = std::clamp(std::nearbyint(wv[size_t(j * k + p)] / ws), -127.0f, 127.0f);
        acc += qx * qw;
      }
      y[size_t(i * n + j)] = acc * double(xs) * double(ws) + bv[size_t(j)];
    }
  }
  return y;
}

TEST(QuantizedLinear, MatchesQuantiseThenMultiplyAndIsCloseToF32) {
  nn::Linear lin(64, 24);
  const Tensor x = uniform({9, 64}, -2, 3);
  NoGradGuard ng;
  const std::vector<float> f32 = lin->forward(x).to_vector<float>();
  nn::QuantizedLinear q(lin->weight, lin->bias);
  const std::vector<float> got = q->forward(x).to_vector<float>();
  const std::vector<double> want = reference_quantized_linear(x, lin->weight, lin->bias);
  double max_err = 0, max_y = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << i;
    max_err = std::max(max_err, std::fabs(double(got[i]) - f32[i]));
    max_y = std::max(max_y, std::fabs(double(f32[i])));
  }
  EXPECT_LT(max_err, 0.05 * max_y);  // int8 is close to, not equal to, f32
  EXPECT_GT(max_err, 0.0);
  // 3-D input: the leading dims are kept.
  const Tensor x3 = uniform({2, 3, 64}, -1, 1);
  EXPECT_EQ(q->forward(x3).shape(), Shape({2, 3, 24}));
}

TEST(QuantizedLinear, SequentialRunsItWithAFollowingReluAsOnePass) {
  nn::Linear lin(64, 24);
  const Tensor x = uniform({9, 64}, -2, 3);
  NoGradGuard ng;
  nn::QuantizedLinear q(lin->weight, lin->bias);
  const std::vector<float> plain = q->forward(x).to_vector<float>();
  const std::vector<float> fused = q->forward_relu(x).to_vector<float>();
  nn::Sequential seq{q, nn::ReLU()};
  const std::vector<float> in_seq = seq->forward(x).to_vector<float>();
  ASSERT_EQ(plain.size(), fused.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(fused[i], std::max(plain[i], 0.0f)) << i;
    EXPECT_EQ(in_seq[i], fused[i]) << i;
  }
  EXPECT_TRUE(std::any_of(plain.begin(), plain.end(), [](float v) { return v < 0; }));
}

TEST(QuantizeDynamic, ReplacesEveryLinearAndFreesTheF32Weights) {
  nn::Sequential net{nn::Linear(784, 256), nn::ReLU(), nn::Linear(256, 256), nn::ReLU(), nn::Linear(256, 10)};
  const Tensor x = uniform({32, 784}, 0, 1);
  std::vector<float> f32;
  {
    NoGradGuard ng;
    f32 = net->forward(x).to_vector<float>();
  }
  const int64_t weights = 4 * (784 * 256 + 256 * 256 + 256 * 10);
  const int64_t before = memory::stats(kCPU).allocated.current;
  EXPECT_EQ(nn::quant::quantize_dynamic(*net), 3);
  const int64_t after = memory::stats(kCPU).allocated.current;
  int quantized = 0;
  for (const auto& [path, m] : net->named_modules()) {
    EXPECT_EQ(dynamic_cast<nn::LinearImpl*>(m.get()), nullptr) << path;
    quantized += dynamic_cast<nn::QuantizedLinearImpl*>(m.get()) != nullptr;
  }
  EXPECT_EQ(quantized, 3);
  // 4 bytes per weight became 1 (plus a 4-byte scale per row, and the 512 B rounding of small blocks).
  const double fell = double(before - after);
  EXPECT_GT(fell, 0.74 * weights);
  EXPECT_LT(fell, 0.76 * weights);
  NoGradGuard ng;
  const std::vector<float> got = net->forward(x).to_vector<float>();
  double max_err = 0, max_y = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_err = std::max(max_err, std::fabs(double(got[i]) - f32[i]));
    max_y = std::max(max_y, std::fabs(double(f32[i])));
  }
  EXPECT_LT(max_err, 0.05 * max_y);
}

// Each looked-up row is q[idx, :] * scale[idx] with q = round(w / scale), scale = max|w[idx, :]| / 127
// (written out here); quantize_dynamic turns an Embedding into one beside the Linears, and the table's bytes
// fall to a quarter.
TEST(QuantizedEmbedding, RowsAreTheDequantisedInt8RowsAndQuantizeDynamicTakesThem) {
  manual_seed(2);
  nn::Sequential net{nn::Embedding(300, 64), nn::Linear(64, 8)};
  auto* emb = dynamic_cast<nn::EmbeddingImpl*>((*net)[0].get());
  ASSERT_NE(emb, nullptr);
  const std::vector<float> w = emb->weight.to_vector<float>();
  const Tensor idx = tensor<int64_t>({3, 299, 0, 3, 17, 150}, Shape({2, 3}));
  std::vector<float> f32_rows;
  {
    NoGradGuard ng;
    f32_rows = emb->forward(idx).to_vector<float>();
  }
  const int64_t before = memory::stats(kCPU).allocated.current;
  EXPECT_EQ(nn::quant::quantize_dynamic(*net), 2);
  const int64_t after = memory::stats(kCPU).allocated.current;
  auto* q = dynamic_cast<nn::QuantizedEmbeddingImpl*>((*net)[0].get());
  ASSERT_NE(q, nullptr);
  // The table: 300 x 64 f32 (76800 B) became 19200 B of int8 (19456 in the arena) and 1200 B of scales
  // (1536); the Linear's 64 x 8 weight (2048 B) became 512 B and its 8 scales 512 B.
  EXPECT_EQ(before - after, (76800 - 19456 - 1536) + (2048 - 512 - 512));
  EXPECT_EQ(nn::quant::int8_names(*net), (std::set<std::string>{"0.weight", "1.weight"}));
  NoGradGuard ng;
  const Tensor y = q->forward(idx);
  EXPECT_EQ(y.shape(), Shape({2, 3, 64}));
  const std::vector<float> got = y.to_vector<float>();
  const std::vector<int64_t> ids = idx.to_vector<int64_t>();
  for (size_t r = 0; r < ids.size(); ++r) {
    const float* row = w.data() + ids[r] * 64;
    float amax = 0;
    for (int j = 0; j < 64; ++j) amax = std::max(amax, std::fabs(row[j]));
    const float scale = amax / 127.0f;
    for (int j = 0; j < 64; ++j) {
      const float want = std::nearbyint(row[j] / scale) * scale;
      ASSERT_EQ(got[r * 64 + size_t(j)], want) << r << "," << j;
      ASSERT_NEAR(got[r * 64 + size_t(j)], f32_rows[r * 64 + size_t(j)], 0.5f * scale);
    }
  }
  // i32 indices give the same rows; bad indices are refused by name.
  EXPECT_EQ(q->forward(idx.to(DType::I32)).to_vector<float>(), got);
  // A non-contiguous view of indices gives the rows of its contiguous copy.
  const Tensor idx_t = idx.transpose(0, 1);
  ASSERT_FALSE(idx_t.is_contiguous());
  EXPECT_EQ(q->forward(idx_t).to_vector<float>(), q->forward(idx_t.contiguous()).to_vector<float>());
  expect_error<IndexError>(
      [&] {
        q->forward(tensor<int64_t>({0, 300}, Shape({2})));
      },
      {"QuantizedEmbedding", "300", "[0, 299]"});
  expect_error<DTypeError>([&] { q->forward(tensor<float>({1.0f}, Shape({1}))); },
                           {"QuantizedEmbedding", "i64 or i32"});
}

TEST(QuantizeDynamic, StateDictRoundTripsThroughSafetensorsBitIdentically) {
  nn::Sequential a{nn::Linear(20, 16), nn::ReLU(), nn::Linear(16, 5)};
  nn::quant::quantize_dynamic(*a);
  const std::string path = ::testing::TempDir() + "quant_roundtrip.safetensors";
  io::save_safetensors(path, a->state_dict(), {}, nn::quant::int8_names(*a));
  nn::Sequential b{nn::Linear(20, 16), nn::ReLU(), nn::Linear(16, 5)};  // other random weights
  nn::quant::quantize_dynamic(*b);
  const io::SafetensorsFile file = io::load_safetensors(path);
  EXPECT_EQ(file.int8_names, (std::set<std::string>{"0.weight", "2.weight"}));
  // The header says I8 for the int8 weights (what PyTorch's safetensors reads as torch.int8), F32 for scales.
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, ' ');
  in.read(header.data(), std::streamsize(n));
  EXPECT_NE(header.find(R"("0.weight":{"dtype":"I8","shape":[16,20])"), std::string::npos) << header;
  EXPECT_NE(header.find(R"("0.weight_scale":{"dtype":"F32","shape":[16])"), std::string::npos) << header;
  b->load_state_dict(file.tensors);
  std::remove(path.c_str());
  const Tensor x = uniform({7, 20}, -1, 1);
  NoGradGuard ng;
  EXPECT_EQ(a->forward(x).to_vector<float>(), b->forward(x).to_vector<float>());
  EXPECT_TRUE(a->state_dict().count("0.weight_scale"));
  EXPECT_EQ(a->state_dict().at("0.weight").dtype(), kU8);
  // frugal::save writes the int8 weights as I8 too, and frugal::load reads them back.
  save(*a, path);
  EXPECT_EQ(io::load_safetensors(path).int8_names, (std::set<std::string>{"0.weight", "2.weight"}));
  nn::Sequential c{nn::Linear(20, 16), nn::ReLU(), nn::Linear(16, 5)};
  nn::quant::quantize_dynamic(*c);
  load(*c, path);
  std::remove(path.c_str());
  EXPECT_EQ(a->forward(x).to_vector<float>(), c->forward(x).to_vector<float>());
  // A state_dict with an f32 weight where the int8 one goes is refused.
  StateDict bad = a->state_dict();
  bad["0.weight"] = uniform({16, 20}, -1, 1);
  expect_error<DTypeError>([&] { b->load_state_dict(bad); }, {"load_state_dict", "0.weight", "u8", "f32"});
}

// PyTorch's fake_quantize_per_tensor_affine, written out: values and the STE mask.
TEST(FakeQuantize, ValuesAndStraightThroughGradientFollowPyTorch) {
  const double scale = 0.1;
  const int64_t zp = 3, qmin = -8, qmax = 7;
  // Values inside, on the clamp edges, outside below and above, and ties (x / scale = k + 0.5).
  const std::vector<double> xs = {0.0,  0.04, -0.06, 0.37, -1.1, -1.16, 0.44,
                                  0.46, 2.0,  -3.0,  0.25, 0.35, -0.05};
  const Tensor x = tensor(xs, Shape({int64_t(xs.size())})).to(kF64).requires_grad_();
  const Tensor w = uniform({int64_t(xs.size())}, 1, 2, kF64);
  const Tensor y = nn::functional::fake_quantize(x, scale, zp, qmin, qmax);
  sum(mul(y, w)).backward();
  const std::vector<double> yv = y.to_vector<double>(), gv = x.grad().to_vector<double>(),
                            wv = w.to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i) {
    const double q = std::nearbyint(xs[i] / scale) + double(zp);
    EXPECT_DOUBLE_EQ(yv[i], (std::clamp(q, double(qmin), double(qmax)) - double(zp)) * scale) << xs[i];
    EXPECT_EQ(gv[i], q >= double(qmin) && q <= double(qmax) ? wv[i] : 0.0) << xs[i];
  }
  // Some are outside, some inside: the test sees both halves of the rule.
  EXPECT_NE(std::count(gv.begin(), gv.end(), 0.0), 0);
  EXPECT_NE(std::count(gv.begin(), gv.end(), 0.0), std::ptrdiff_t(gv.size()));
}

TEST(FakeQuantize, RejectsBadArguments) {
  const Tensor x = uniform({4}, -1, 1);
  expect_error<Error>([&] { nn::functional::fake_quantize(x, 0.0, 0, -128, 127); },
                      {"fake_quantize", "scale", "0"});
  expect_error<Error>([&] { nn::functional::fake_quantize(x, -1.0, 0, -128, 127); },
                      {"fake_quantize", "scale"});
  expect_error<Error>([&] { nn::functional::fake_quantize(x, 0.1, 0, 5, 5); },
                      {"fake_quantize", "qmin", "qmax", "5"});
  expect_error<Error>([&] { nn::functional::fake_quantize(x, 0.1, 300, 0, 255); },
                      {"fake_quantize", "zero_point", "300"});
}

TEST(Qat, PrepareTrainsThroughFakeQuantAndConvertMatchesTheQatModel) {
  nn::Sequential net{nn::Linear(12, 8), nn::ReLU(), nn::Linear(8, 3)};
  EXPECT_EQ(nn::quant::prepare_qat(*net), 2);
  const Tensor x = uniform({16, 12}, -1, 2);
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
  expect_error<Error>(
      [&] {
        nn::Sequential fresh{nn::Linear(2, 2)};
        nn::quant::prepare_qat(*fresh);
        nn::quant::convert(*fresh);
      },
      {"convert", "observed no batch"});
  EXPECT_EQ(nn::quant::convert(*net), 2);
  int fixed = 0;
  for (const auto& [path, m] : net->named_modules())
    if (auto* q = dynamic_cast<nn::QuantizedLinearImpl*>(m.get())) fixed += q->input_scale.defined();
  EXPECT_EQ(fixed, 2);
  EXPECT_TRUE(net->state_dict().count("0.input_scale"));
  NoGradGuard ng;
  const std::vector<float> got = net->forward(x).to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], qat[i], 1e-4 * (1 + std::fabs(qat[i]))) << i;
}

// Static post-training quantisation: the observers' ranges against the calibration data's (min-max exactly;
// the histogram's clipped past its outlier), and the converted model close to the f32 one.
TEST(StaticQuant, ObserversFixTheInputRangeAndConvertQuantises) {
  manual_seed(3);
  nn::Sequential net{nn::Linear(12, 8), nn::ReLU(), nn::Linear(8, 3)};
  Tensor x = uniform({64, 12}, -1, 2, DType::F32, 4);
  std::vector<float> f32;
  {
    NoGradGuard ng;
    f32 = net->forward(x).to_vector<float>();
  }
  for (nn::quant::Observer obs : {nn::quant::Observer::MinMax, nn::quant::Observer::Histogram}) {
    nn::Sequential copy{nn::Linear(12, 8), nn::ReLU(), nn::Linear(8, 3)};
    copy->load_state_dict(net->state_dict());
    EXPECT_EQ(nn::quant::prepare(*copy, obs), 2);
    expect_error<Error>(
        [&] {
          nn::Sequential c{nn::Linear(2, 2)};
          nn::quant::prepare(*c);
          nn::quant::convert(*c);
        },
        {"convert", "ObservedLinear", "calibrate"});
    NoGradGuard ng;
    Tensor with_outlier = x.clone();
    with_outlier.data<float>()[32 * 12 + 5] = 1000;  // one value in the second batch's 384
    copy->forward(x.narrow(0, 0, 32));
    copy->forward(with_outlier.narrow(0, 32, 32));
    auto* first = dynamic_cast<nn::ObservedLinearImpl*>((*copy)[0].get());
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(first->batches, 2);
    const auto [lo, hi] = first->range();
    const std::vector<float> seen = with_outlier.to_vector<float>();  // both batches
    const float true_lo = *std::min_element(seen.begin(), seen.end()),
                true_hi = *std::max_element(seen.begin(), seen.end());
    if (obs == nn::quant::Observer::MinMax) {
      EXPECT_EQ(lo, true_lo);
      EXPECT_EQ(hi, true_hi);
    } else {
      EXPECT_EQ(lo, true_lo);  // no negative outlier: nothing to clip
      EXPECT_LT(hi, 10.0f) << "the 99.99th percentile of |x| clips the outlier 1000";
      EXPECT_GE(hi, 2.0f * 0.99f);
    }
    // Calibrated on the outlier, min-max spends its levels on [0, 1000]; the histogram's model is the closer.
    EXPECT_EQ(nn::quant::convert(*copy), 2);
    auto* q = dynamic_cast<nn::QuantizedLinearImpl*>((*copy)[0].get());
    ASSERT_NE(q, nullptr);
    ASSERT_TRUE(q->input_scale.defined());
    EXPECT_FLOAT_EQ(q->input_scale.item<float>(), (std::max(hi, 0.0f) - std::min(lo, 0.0f)) / 127.0f);
    const std::vector<float> got = copy->forward(x.narrow(0, 0, 32)).to_vector<float>();
    double err = 0, scale = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      err = std::max(err, double(std::fabs(got[i] - f32[i])));
      scale = std::max(scale, double(std::fabs(f32[i])));
    }
    if (obs == nn::quant::Observer::Histogram) {
      EXPECT_LT(err, 0.05 * scale) << "histogram-calibrated int8";
    } else {
      EXPECT_GT(err, 0.05 * scale) << "min-max over an outlier should lose";
    }
  }
}

// A dry run (memory::estimate) of a quantised model's forward takes the blocks the real forward takes: the
// layers' meta path allocates as the cpu path does, oneDNN's scratchpad included (int8_linear_meta).
TEST(QuantizedLinear, ADryRunOfItsForwardIsExact) {
  auto make = [] {
    nn::Sequential m;
    m->push_back(nn::QuantizedLinear(300, 700));
    m->push_back(nn::ReLU());  // the fused path
    m->push_back(nn::QuantizedLinear(700, 40));
    return m;
  };
  for (int64_t batch : {1, 33, 256}) {
    SCOPED_TRACE(batch);
    int64_t base = 0;
    const memory::Estimate e = memory::estimate([&](Device d) {
      nn::Sequential m = make();
      const Tensor x = empty({batch, 300}, TensorOptions(kF32).device(d));
      base = memory::stats(d).allocated.current;
      memory::reset_peak(d);
      InferenceMode im;
      const Tensor y = m->forward(x);
      EXPECT_EQ(y.shape(), Shape({batch, 40}));
    });
    nn::Sequential m = make();
    const Tensor x = testing::uniform({batch, 300}, -1, 2);
    memory::reset_peak(kCPU);
    const int64_t before = memory::stats(kCPU).allocated.current;
    {
      InferenceMode im;
      const Tensor y = m->forward(x);
    }
    EXPECT_EQ(memory::stats(kCPU).allocated.peak - before, e.peak_allocated - base);
  }
}

TEST(QuantizedLinear, RejectsBadInputs) {
  nn::Linear lin(8, 4);
  nn::QuantizedLinear q(lin->weight, lin->bias);
  {
    NoGradGuard ng;
    expect_error<ShapeError>(
        [&] {
          q->forward(uniform({3, 7}, -1, 1));
        },
        {"QuantizedLinear", "[...,8]", "7"});
    expect_error<DTypeError>([&] { q->forward(uniform({3, 8}, -1, 1, kF64)); }, {"QuantizedLinear", "f32"});
  }
  const Tensor x = uniform({3, 8}, -1, 1).requires_grad_();
  expect_error<Error>([&] { q->forward(x); }, {"QuantizedLinear", "requires grad"});
  expect_error<Error>([&] { nn::quant::quantize_dynamic(*lin); }, {"quantize_dynamic", "Linear"});
  nn::Sequential net{nn::Linear(8, 4)};
  net->named_modules().begin()->second->to(kF64);
  expect_error<DTypeError>([&] { nn::quant::quantize_dynamic(*net); }, {"quantize_dynamic", "f64", "f32"});
}

}  // namespace
}  // namespace frugal

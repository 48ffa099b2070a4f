// QuantizedLinear on a GPU (Note [an int8 layer on a GPU], nn/quant.cpp): its three kernels (the input's
// range, its codes, the int8 GEMM through cuBLASLt or the plain kernel) against the CPU's, bit for bit, over
// shapes cuBLASLt takes and shapes it turns down; a quantised MLP moved to the GPU answering as on the CPU,
// bit for bit, dynamic and static, with the fused ReLU and from codes; the int8 layers that stay on the CPU
// saying so. On the stand-in GPU (FRUGAL_FAKE_GPU=1) both sides run the CPU's kernels: that checks the
// layer's device path, not the CUDA kernels.
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "core/quant_kernels.h"
#include "nn/containers.h"
#include "nn/layers.h"
#include "nn/quant.h"
#include "tests/cuda/gpu_test.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::GpuTest;
using testing::kGpu;

// The bits of an f32 tensor (from any device).
std::vector<uint32_t> bits(const Tensor& t) {
  const Tensor c = t.to(kCPU).contiguous();
  std::vector<uint32_t> out(size_t(c.numel()));
  std::memcpy(out.data(), c.data<float>(), out.size() * sizeof(float));
  return out;
}

template <typename T>
Tensor on_gpu(const std::vector<T>& v, DType t) {
  Tensor h = empty({int64_t(v.size())}, t);
  if (!v.empty()) std::memcpy(h.raw_data(), v.data(), v.size() * sizeof(T));
  return h.to(kGpu);
}

using GpuQuant = GpuTest;

TEST_F(GpuQuant, TheInputsRangeAndCodesAreTheCpus) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-3, 5);
  for (int64_t n : {0, 1, 7, 1000, 70000}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = u(rng);
    if (n >= 7) {  // a NaN (passed over by the range, code 0), infinities, ties of the rounding, -0
      x[1] = nan, x[2] = -inf, x[3] = inf, x[4] = 0.5f, x[5] = 2.5f, x[6] = -0.0f;
    }
    for (bool positive : {false, true}) {
      if (positive)
        for (float& v : x) v = std::fabs(v);
      const Tensor xg = on_gpu(x, kF32);
      const Tensor range = empty({2}, TensorOptions(kF32).device(kGpu));
      op_value_range.get(kGpu, kF32)({xg.data<float>(), n, range.data<float>()});
      float lo = -1, hi = -1;
      cpu::value_range(x.data(), n, lo, hi);
      const std::vector<uint32_t> got = bits(range);
      EXPECT_EQ(got[0], std::bit_cast<uint32_t>(lo)) << n << (positive ? " positive" : "");
      EXPECT_EQ(got[1], std::bit_cast<uint32_t>(hi)) << n << (positive ? " positive" : "");
      for (const nn::quant::InputQuant q : {nn::quant::InputQuant{0.05f, 60}, nn::quant::InputQuant{0.5f, 0},
                                            nn::quant::InputQuant{1.0f, 127}}) {
        const Tensor codes = empty({std::max<int64_t>(n, 1)}, TensorOptions(kU8).device(kGpu));
        op_quantize_u8.get(kGpu, kF32)({xg.data<float>(), n, 1.0f / q.scale, q.zero_point,
                                        nn::quant::kInputQMax, codes.data<uint8_t>()});
        std::vector<uint8_t> want(static_cast<size_t>(n));
        cpu::quantize_u8(x.data(), n, 1.0f / q.scale, q.zero_point, nn::quant::kInputQMax, want.data());
        const Tensor host = codes.to(kCPU);
        EXPECT_EQ(std::vector<uint8_t>(host.data<uint8_t>(), host.data<uint8_t>() + n), want)
            << n << " scale " << q.scale << " zero point " << q.zero_point;
      }
    }
  }
}

TEST_F(GpuQuant, TheInt8GemmIsTheCpusForShapesCublasTakesAndTurnsDown) {
  std::mt19937 rng(11);
  struct Shape3 {
    int64_t m, k, n;
  };
  // Multiples of 16 (cuBLASLt's int8 kernels), then odd sizes it may turn down (the plain kernel), W1's.
  for (Shape3 s : {Shape3{16, 64, 32}, Shape3{256, 784, 256}, Shape3{5, 3, 10}, Shape3{7, 33, 9},
                   Shape3{1, 784, 256}, Shape3{128, 256, 10}}) {
    std::vector<uint8_t> x(size_t(s.m * s.k));
    std::vector<int8_t> w(size_t(s.n * s.k));
    std::vector<float> scale(size_t(s.n)), bias(size_t(s.n));
    for (auto& v : x) v = uint8_t(rng() % 128);
    for (auto& v : w) v = int8_t(int(rng() % 255) - 127);
    for (auto& v : scale) v = 1e-4f * float(1 + rng() % 1000);
    for (auto& v : bias) v = float(int(rng() % 2001) - 1000) / 300.0f;
    const Tensor xg = on_gpu(x, kU8), wg = on_gpu(w, kU8), sg = on_gpu(scale, kF32), bg = on_gpu(bias, kF32);
    for (const bool with_bias : {false, true})
      for (const bool relu : {false, true})
        for (const int32_t zp : {0, 37, 127}) {
          const Tensor out = empty({s.m, s.n}, TensorOptions(kF32).device(kGpu));
          Int8LinearArgs a;
          a.x = xg.data<uint8_t>();
          a.x_zero_point = zp;
          a.w = static_cast<const int8_t*>(wg.raw_data());
          a.scale = sg.data<float>();
          a.bias = with_bias ? bg.data<float>() : nullptr;
          a.out = out.data<float>();
          a.m = s.m, a.k = s.k, a.n = s.n;
          a.relu = relu;
          op_int8_linear.get(kGpu, kU8)(a);
          Tensor want = empty({s.m, s.n}, kF32), ref = empty({s.m, s.n}, kF32);
          cpu::int8_linear(x.data(), zp, w.data(), scale.data(), with_bias ? bias.data() : nullptr,
                           want.data<float>(), s.m, s.k, s.n, relu);
          cpu::int8_linear_reference(x.data(), zp, w.data(), scale.data(), with_bias ? bias.data() : nullptr,
                                     ref.data<float>(), s.m, s.k, s.n, relu);
          const std::string what = std::to_string(s.m) + "x" + std::to_string(s.k) + "x" +
                                   std::to_string(s.n) + " zp " + std::to_string(zp) +
                                   (with_bias ? " bias" : "") + (relu ? " relu" : "");
          EXPECT_EQ(bits(want), bits(ref)) << what << ": the cpu's kernel against its reference";
          ASSERT_EQ(bits(out), bits(want)) << what;
        }
  }
}

nn::Sequential make_mlp() {
  nn::Sequential net;
  net->push_back(nn::Linear(48, 64));
  net->push_back(nn::ReLU());
  net->push_back(nn::Linear(64, 10));
  return net;
}

TEST_F(GpuQuant, AQuantisedMlpAnswersOnTheGpuAsOnTheCpu) {
  manual_seed(5);
  nn::Sequential net = make_mlp();
  nn::quant::quantize_dynamic(*net);
  const Tensor x = testing::uniform({20, 48}, -2, 3);
  NoGradGuard no_grad;
  const Tensor want = net->forward(x);
  net->to(kGpu);
  const Tensor got = net->forward(x.to(kGpu));
  ASSERT_EQ(got.device(), kGpu);
  EXPECT_EQ(bits(got), bits(want)) << "dynamic, the first layer with its ReLU fused";

  // A batch of a single row, an input of three dimensions, and a transposed view (not contiguous).
  const Tensor one = x.narrow(0, 3, 1), three = x.reshape({4, 5, 48});
  const Tensor xt = testing::uniform({48, 6}, -2, 3, kF32, 4);
  net->to(kCPU);
  const Tensor want_one = net->forward(one), want_three = net->forward(three), want_t = net->forward(xt.t());
  net->to(kGpu);
  EXPECT_EQ(bits(net->forward(one.to(kGpu))), bits(want_one));
  const Tensor view = xt.to(kGpu).t();
  ASSERT_FALSE(view.is_contiguous());
  EXPECT_EQ(bits(net->forward(view)), bits(want_t));
  const Tensor got_three = net->forward(three.to(kGpu));
  EXPECT_EQ(got_three.shape(), (Shape{4, 5, 10}));
  EXPECT_EQ(bits(got_three), bits(want_three));
}

TEST_F(GpuQuant, AStaticLayerAndItsCodesAnswerAsOnTheCpu) {
  const Tensor w = testing::uniform({24, 40}, -0.5, 0.5, kF32, 7), b = testing::uniform({24}, -1, 1, kF32, 8);
  nn::QuantizedLinear q(w, b, 0.04f, 50);
  const Tensor x = testing::uniform({9, 40}, -2, 2.5, kF32, 9);
  NoGradGuard no_grad;
  const Tensor want = q->forward(x), want_relu = q->forward_relu(x);
  std::vector<uint8_t> codes(9 * 40);
  nn::quant::quantize_input(x.data<float>(), x.numel(), {0.04f, 50}, codes.data());
  Tensor codes_cpu = empty({9, 40}, kU8);
  std::memcpy(codes_cpu.raw_data(), codes.data(), codes.size());
  const Tensor want_codes = q->forward_codes(codes_cpu, true);
  q->to(kGpu);
  EXPECT_EQ(bits(q->forward(x.to(kGpu))), bits(want));
  EXPECT_EQ(bits(q->forward_relu(x.to(kGpu))), bits(want_relu));
  EXPECT_EQ(bits(q->forward_codes(codes_cpu.to(kGpu), true)), bits(want_codes));
  // The input on the other device is an error that names both.
  expect_error<DeviceError>([&] { q->forward(x); }, {"QuantizedLinear", "cpu", "cuda:0"});
}

TEST_F(GpuQuant, TheInt8ConvolutionAndEmbeddingSayTheyRunOnTheCpu) {
  nn::QuantizedConv2d conv(nn::Conv2dOptions(2, 4, 3), false);
  nn::QuantizedEmbedding table(10, 4);
  conv->to(kGpu);
  table->to(kGpu);
  NoGradGuard no_grad;
  expect_error<DeviceError>(
      [&] {
        conv->forward(testing::uniform({1, 2, 5, 5}, -1, 1).to(kGpu));
      },
      {"QuantizedConv2d", "runs on the cpu only", "cuda:0"});
  expect_error<DeviceError>([&] { table->forward(empty({3}, TensorOptions(kI64).device(kGpu))); },
                            {"QuantizedEmbedding", "runs on the cpu only", "cuda:0"});
}

}  // namespace
}  // namespace frugal

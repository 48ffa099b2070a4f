// The W2 convolutions at batch 64 (conv1: 1->32 on 28x28, conv2: 32->64 on 14x14, 3x3 pad 1): forward,
// backward data, backward weight+bias, and a training step's worth (conv1 needs no input gradient), through
// the registered kernel with oneDNN computing on NCHW or in its own blocked layout (Arg 0 / 1), and through
// the im2col fallback. Each benchmark first checks its results against the naive f64 reference. The peer is
// bench/peers/torch_conv.py. And the inference of a convolution, ReLU and 2 x 2 max pool at an evaluation
// batch of 256: ops::conv2d_relu_pool2 (Arg 1) against conv2d_relu then max_pool2d (Arg 0), checked bit for
// bit against each other first.
#include <benchmark/benchmark.h>

#include <cmath>

#include "core/op_table_conv.h"
#include "frugal.h"
#include "kernels/cpu/reference.h"

namespace {

using namespace frugal;

struct Layer {
  int64_t c, o, hw;
};
constexpr int64_t kBatch = 64;
constexpr Layer kLayers[] = {{1, 32, 28}, {32, 64, 14}};

struct Problem {
  Tensor x, w, b, dy;
  ConvArgs args;
  explicit Problem(const Layer& l) {
    Generator g(5);
    x = randn({kBatch, l.c, l.hw, l.hw}, {}, &g);
    w = randn({l.o, l.c, 3, 3}, {}, &g);
    b = randn({l.o}, {}, &g);
    dy = randn({kBatch, l.o, l.hw, l.hw}, {}, &g);
    args.n = kBatch, args.c = l.c, args.h = args.w = l.hw, args.o = l.o, args.kh = args.kw = 3;
    args.oh = args.ow = l.hw, args.pad_h = args.pad_w = 1;
  }
};

// "" when y, dx (images 0 and 1) and dw, db (whole batch) match the f64 reference.
std::string check(const Problem& p, const Tensor& y, const Tensor& dx, const Tensor& dw, const Tensor& db) {
  auto close = [](const Tensor& got, const Tensor& want, double tol) {
    const auto g = got.to_vector<double>(), e = want.to_vector<double>();
    for (size_t i = 0; i < g.size(); ++i)
      if (std::fabs(g[i] - e[i]) > tol * (1 + std::fabs(e[i]))) return false;
    return true;
  };
  ConvArgs a = p.args;
  a.n = 2;  // forward and backward data are per image: two images check the primitive's indexing
  const Tensor x = p.x.to(DType::F64), w = p.w.to(DType::F64), b = p.b.to(DType::F64),
               dy = p.dy.to(DType::F64);
  Tensor ry = empty({2, a.o, a.oh, a.ow}, DType::F64), rdx = empty({2, a.c, a.h, a.w}, DType::F64);
  Tensor rdw = empty(p.w.shape(), DType::F64), rdb = empty({a.o}, DType::F64);
  a.x = x.raw_data(), a.weight = w.raw_data(), a.bias = b.raw_data(), a.dy = dy.raw_data();
  a.y = ry.raw_data(), a.dx = rdx.raw_data();
  reference::conv2d_forward<double>(a);
  reference::conv2d_backward_data<double>(a);
  a.n = kBatch, a.dweight = rdw.raw_data(), a.dbias = rdb.raw_data();
  reference::conv2d_backward_weight<double>(a);
  if (!close(y.narrow(0, 0, 2), ry, 1e-4)) return "forward differs from the reference";
  if (dx.defined() && !close(dx.narrow(0, 0, 2), rdx, 1e-4))
    return "backward data differs from the reference";
  if (!close(dw, rdw, 1e-3) || !close(db, rdb, 1e-3)) return "backward weight differs from the reference";
  return "";
}

enum Part { kForward, kBackwardData, kBackwardWeight, kTrainStep };

void BM_Conv(benchmark::State& state, int layer, Part part) {
  set_conv_onednn_any_layout(state.range(0) == 1);
  const Problem p(kLayers[layer]);
  const bool need_dx = layer > 0;  // conv1's input is the image: no gradient
  Tensor y = ops::conv2d(p.x, p.w, p.b, 1, 1);
  Tensor dx = ops::conv2d_backward_data(p.dy, p.w, p.x.shape(), 1, 1, 1, 1);
  auto [dw, db] = ops::conv2d_backward_weight(p.dy, p.x, p.w.shape(), 1, 1, 1, 1, true);
  if (const std::string problem = check(p, y, dx, dw, db); !problem.empty())
    return state.SkipWithError(problem.c_str());
  for (auto _ : state) {
    if (part == kForward || part == kTrainStep) y = ops::conv2d(p.x, p.w, p.b, 1, 1);
    if (part == kBackwardData || (part == kTrainStep && need_dx))
      dx = ops::conv2d_backward_data(p.dy, p.w, p.x.shape(), 1, 1, 1, 1);
    if (part == kBackwardWeight || part == kTrainStep)
      std::tie(dw, db) = ops::conv2d_backward_weight(p.dy, p.x, p.w.shape(), 1, 1, 1, 1, true);
    benchmark::DoNotOptimize(y.raw_data());
  }
  const Layer& l = kLayers[layer];
  const double macs = double(kBatch * l.o * l.hw * l.hw * l.c * 9);
  const double passes = part == kTrainStep ? (need_dx ? 3 : 2) : 1;
  state.counters["GFLOP/s"] = benchmark::Counter(
      2 * macs * passes, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  set_conv_onednn_any_layout(true);  // the default
}

// Inference's Conv2d, ReLU and MaxPool2d(2) at a batch of 256: the fused op (Arg 1; Note [a convolution
// pooled from its blocked output]) or the two ops (Arg 0), which it must equal bit for bit.
void BM_ConvReluPool(benchmark::State& state, int layer) {
  const Layer& l = kLayers[layer];
  Generator g(6);
  const Tensor x = randn({256, l.c, l.hw, l.hw}, {}, &g), w = randn({l.o, l.c, 3, 3}, {}, &g),
               b = randn({l.o}, {}, &g);
  auto run = [&](bool fused) {
    return fused ? ops::conv2d_relu_pool2(x, w, b, 1, 1)
                 : ops::max_pool2d(ops::conv2d_relu(x, w, b, 1, 1), 2);
  };
  if (run(true).to_vector<float>() != run(false).to_vector<float>())
    return state.SkipWithError("the fused op differs from conv2d_relu and max_pool2d");
  for (auto _ : state) {
    const Tensor y = run(state.range(0) == 1);
    benchmark::DoNotOptimize(y.raw_data());
  }
}

// The im2col + GEMM fallback (what an Eigen-only build runs), for comparison.
void BM_ConvIm2col(benchmark::State& state, int layer) {
  const Problem p(kLayers[layer]);
  Tensor y = empty({kBatch, p.args.o, p.args.oh, p.args.ow}), dx = empty(p.x.shape()),
         dw = empty(p.w.shape()), db = empty({p.args.o});
  ConvArgs a = p.args;
  a.x = p.x.raw_data(), a.weight = p.w.raw_data(), a.bias = p.b.raw_data(), a.dy = p.dy.raw_data();
  a.y = y.raw_data(), a.dx = dx.raw_data(), a.dweight = dw.raw_data(), a.dbias = db.raw_data();
  conv2d_forward_im2col_cpu(a);
  conv2d_backward_data_im2col_cpu(a);
  conv2d_backward_weight_im2col_cpu(a);
  if (const std::string problem = check(p, y, dx, dw, db); !problem.empty())
    return state.SkipWithError(problem.c_str());
  for (auto _ : state) {
    conv2d_forward_im2col_cpu(a);
    if (layer > 0) conv2d_backward_data_im2col_cpu(a);
    conv2d_backward_weight_im2col_cpu(a);
  }
}

#define FRUGAL_CONV_BENCH(name, layer, part) \
  BENCHMARK_CAPTURE(BM_Conv, name, layer, part)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()
FRUGAL_CONV_BENCH(conv1_forward, 0, kForward);
FRUGAL_CONV_BENCH(conv1_backward_weight, 0, kBackwardWeight);
FRUGAL_CONV_BENCH(conv1_train_step, 0, kTrainStep);
FRUGAL_CONV_BENCH(conv2_forward, 1, kForward);
FRUGAL_CONV_BENCH(conv2_backward_data, 1, kBackwardData);
FRUGAL_CONV_BENCH(conv2_backward_weight, 1, kBackwardWeight);
FRUGAL_CONV_BENCH(conv2_train_step, 1, kTrainStep);
BENCHMARK_CAPTURE(BM_ConvReluPool, conv1_inference_256, 0)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ConvReluPool, conv2_inference_256, 1)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ConvIm2col, conv1_train_step, 0)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_ConvIm2col, conv2_train_step, 1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

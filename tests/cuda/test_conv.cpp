// The CNN path on the GPU against the CPU: conv2d forward, backward data and backward weight/bias (through
// cuDNN and through the im2col fallback, one chunk of images and many), max and average pooling forward and
// backward, batch norm in training and eval, a small CNN's gradients end to end, f32/f16/bf16 on random
// inputs with odd sizes, strides, padding, dilation and groups; bad inputs. Skipped without a GPU.
#include <cmath>

#include "core/batch_norm.h"
#include "tests/cuda/gpu_test.h"
#include "tests/kernels/conv_case.h"

#ifdef FRUGAL_HAVE_CUDA
#include "kernels/cuda/conv.h"
#endif

namespace frugal {
namespace {

using testing::expect_error;
using testing::expect_gpu_matches_cpu;
using testing::tol_for;
using testing::uniform;

using Inputs = std::vector<Tensor>;

// The stand-in GPU (FRUGAL_FAKE_GPU=1, tests/cuda/gpu_test.h) runs the CPU's convolution and pooling kernels
// as every other.
using Cnn = testing::GpuTest;

// The convolution paths this build has: cuDNN (when built with it) and the im2col fallback. The switch is
// restored when the scope ends, failed assertion or not.
struct ConvPath {
  bool cudnn;
  const char* name() const { return cudnn ? "cuDNN" : "im2col"; }
};
std::vector<ConvPath> conv_paths() {
#ifdef FRUGAL_HAVE_CUDA
  if (cuda_conv_has_cudnn()) return {{true}, {false}};
#endif
  return {{false}};
}
struct UsePath {
  explicit UsePath([[maybe_unused]] ConvPath p) {
#ifdef FRUGAL_HAVE_CUDA
    set_cuda_conv_cudnn(p.cudnn);
    set_cuda_batch_norm_cudnn(p.cudnn);
#endif
  }
  ~UsePath() {
#ifdef FRUGAL_HAVE_CUDA
    set_cuda_conv_cudnn(true);
    set_cuda_batch_norm_cudnn(true);
#endif
  }
};

using Case = testing::ConvCase;

// Groups, dilation, strides, padding (also wider than the kernel), 1x1, a kernel as large as the input,
// depthwise, odd sizes, and W2-like layers.
const std::vector<Case> kCases = {
    {2, 3, 7, 9, 4, 3, 3},
    {1, 4, 8, 8, 6, 3, 3, 2, 1, 1, 2},
    {2, 4, 10, 7, 4, 3, 2, {2, 1}, {1, 0}, {2, 1}, 4, false},
    {3, 2, 5, 5, 3, 1, 1},
    {1, 6, 9, 11, 6, 3, 3, 3, 2, 2, 3},
    {1, 3, 6, 6, 5, 5, 5, 1, 2, 1, 1, false},
    {2, 3, 5, 5, 2, 5, 5},
    {1, 5, 6, 13, 7, 2, 4, {1, 3}, {0, 2}, {3, 1}, 1},
    {5, 1, 28, 28, 8, 3, 3, 1, 1},
    {4, 32, 14, 14, 16, 3, 3, 1, 1},
    {3, 17, 13, 11, 33, 3, 3, 2, 1},
    {64, 1, 28, 28, 32, 3, 3, 1, 1},  // W2's layers at its batch
    {64, 32, 14, 14, 64, 3, 3, 1, 1},
};

// Sums of k products of values in [-1, 1]: f32 sums in another order differ by a few ulps of the terms; the
// 16-bit types round once at the end on both sides.
testing::Tol conv_tol(DType t, int64_t k) {
  return t == DType::F32 ? testing::Tol{1e-6 + 1e-7 * double(k), 1e-5} : tol_for(t);
}

void check_conv(const Case& cc, DType t, const std::string& what) {
  const Tensor x = uniform(cc.x_shape(), -1, 1, t, 1), w = uniform(cc.w_shape(), -1, 1, t, 2);
  const Tensor b = cc.bias ? uniform({cc.o}, -1, 1, t, 3) : Tensor();
  const Tensor dy = uniform(cc.y_shape(), -1, 1, t, 4);
  const int64_t k_fwd = cc.c / cc.groups * cc.kh * cc.kw, k_bwd = cc.o / cc.groups * cc.kh * cc.kw,
                k_w = cc.n * cc.oh() * cc.ow();
  // An undefined bias stays out of the inputs (they are copied to the GPU).
  expect_gpu_matches_cpu(
      [&](const Inputs& in) {
        return ops::conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), cc.stride, cc.pad, cc.dil,
                           cc.groups);
      },
      cc.bias ? Inputs{x, w, b} : Inputs{x, w}, conv_tol(t, k_fwd), "forward " + what);
  expect_gpu_matches_cpu(
      [&](const Inputs& in) {
        return ops::conv2d_backward_data(in[0], in[1], cc.x_shape(), cc.stride, cc.pad, cc.dil, cc.groups);
      },
      {dy, w}, conv_tol(t, k_bwd), "backward data " + what);
  for (int part = 0; part < (cc.bias ? 2 : 1); ++part)
    expect_gpu_matches_cpu(
        [&](const Inputs& in) {
          auto [dw, db] = ops::conv2d_backward_weight(in[0], in[1], cc.w_shape(), cc.stride, cc.pad, cc.dil,
                                                      cc.groups, cc.bias);
          return part == 0 ? dw : db;
        },
        {dy, x}, conv_tol(t, k_w), (part == 0 ? "backward weight " : "backward bias ") + what);
}

TEST_F(Cnn, ConvolutionMatchesTheCpuInEveryDirection) {
  for (const ConvPath& path : conv_paths()) {
    UsePath use(path);
    for (DType t : {DType::F32, DType::F16, DType::BF16})
      for (const Case& cc : kCases) {
        check_conv(cc, t, std::string(path.name()) + " " + dtype_name(t) + " " + cc.str());
        if (HasFailure()) return;
      }
  }
}

TEST_F(Cnn, Im2colOverManyChunksOfImages) {
#ifdef FRUGAL_HAVE_CUDA
  struct SmallChunks {
    SmallChunks() { set_cuda_conv_im2col_chunk_bytes(1); }  // one image per chunk
    ~SmallChunks() { set_cuda_conv_im2col_chunk_bytes(int64_t(256) << 20); }
  } small;
#endif
  UsePath use({false});
  for (DType t : {DType::F32, DType::BF16})
    for (const Case& cc : {Case{5, 3, 9, 8, 4, 3, 3, 1, 1}, Case{3, 4, 7, 7, 6, 3, 3, 2, 1, 1, 2}})
      check_conv(cc, t, std::string("one image per chunk ") + dtype_name(t) + " " + cc.str());
}

TEST_F(Cnn, UnbatchedInputAndNonContiguousOperands) {
  for (const ConvPath& path : conv_paths()) {
    UsePath use(path);
    const Tensor x = uniform({3, 9, 7}, -1, 1, DType::F32, 5),
                 w = uniform({4, 3, 3, 3}, -1, 1, DType::F32, 6);
    expect_gpu_matches_cpu([](const Inputs& in) { return ops::conv2d(in[0], in[1], {}, 1, 1); }, {x, w},
                           conv_tol(DType::F32, 27), std::string(path.name()) + " unbatched");
    const Tensor xt = uniform({2, 3, 7, 9}, -1, 1, DType::F32, 7);
    expect_gpu_matches_cpu(
        [](const Inputs& in) { return ops::conv2d(in[0].transpose(2, 3), in[1].transpose(2, 3), {}, 2, 1); },
        {xt, w}, conv_tol(DType::F32, 27), std::string(path.name()) + " transposed views");
  }
}

// A small CNN (conv, relu, max pool, grouped conv, avg pool) through autograd: the loss and every gradient.
TEST_F(Cnn, SmallCnnGradientsMatchTheCpu) {
  for (const ConvPath& path : conv_paths()) {
    UsePath use(path);
    for (DType t : {DType::F32, DType::BF16}) {
      auto run = [&](Device d) {
        auto leaf = [&](const Shape& s, double scale, uint64_t seed) {
          return uniform(s, -scale, scale, t, seed).to(d).detach().requires_grad_();
        };
        const Tensor x = leaf({3, 3, 17, 15}, 1, 11), w1 = leaf({8, 3, 3, 3}, 0.5, 12),
                     b1 = leaf({8}, 0.5, 13), w2 = leaf({8, 4, 3, 3}, 0.3, 14);
        Tensor h = relu(conv2d(x, w1, b1, 1, 1));
        h = max_pool2d(h, 3, Size2{2, 2}, 1);
        h = conv2d(h, w2, {}, 1, 2, 2, 2);
        h = avg_pool2d(h, 2, {}, 1, false);
        const Tensor loss = (h * h).sum();
        loss.backward();
        return std::vector<Tensor>{loss.to(kCPU), x.grad().to(kCPU), w1.grad().to(kCPU), b1.grad().to(kCPU),
                                   w2.grad().to(kCPU)};
      };
      const auto cpu = run(kCPU), gpu = run(testing::kGpu);
      const char* names[] = {"loss", "dx", "dw1", "db1", "dw2"};
      const testing::Tol tol = t == DType::F32 ? testing::Tol{1e-4, 1e-4} : testing::Tol{5e-2, 5e-2};
      for (size_t i = 0; i < cpu.size(); ++i)
        testing::expect_close(gpu[i], cpu[i].to_vector<double>(), tol,
                              std::string(path.name()) + " cnn " + names[i] + " " + dtype_name(t));
    }
  }
}

struct PoolCase {
  Shape x;
  Size2 kernel;
  std::optional<Size2> stride = std::nullopt;
  Size2 pad = 0, dil = 1;
  std::string str() const {
    return detail::str_cat("x ", x, " kernel (", kernel.h, ", ", kernel.w, ") stride ",
                           stride ? detail::str_cat("(", stride->h, ", ", stride->w, ")") : "default",
                           " pad (", pad.h, ", ", pad.w, ") dil (", dil.h, ", ", dil.w, ")");
  }
};

const std::vector<PoolCase> kPoolCases = {
    {{2, 3, 8, 8}, 2},
    {{2, 5, 9, 11}, 3, Size2{2, 2}, 1},
    {{1, 4, 13, 7}, {3, 2}, Size2{1, 2}, {1, 1}},
    {{3, 9, 10}, {2, 3}, Size2{2, 1}, {1, 1}},    // unbatched
    {{2, 2, 11, 12}, 3, Size2{2, 3}, 1, {2, 1}},  // dilated (max only)
    {{4, 16, 28, 28}, 2},                         // W2's pooling
    {{1, 1, 5, 5}, 5, Size2{1, 1}, 2},            // overlapping windows, padding
};

TEST_F(Cnn, PoolingMatchesTheCpu) {
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (const PoolCase& pc : kPoolCases) {
      const std::string what = std::string(dtype_name(t)) + " " + pc.str();
      const Tensor x = uniform(pc.x, -2, 2, t, 21);
      expect_gpu_matches_cpu(
          [&](const Inputs& in) { return ops::max_pool2d(in[0], pc.kernel, pc.stride, pc.pad, pc.dil); }, {x},
          {0, 0}, "max " + what);
      expect_gpu_matches_cpu(
          [&](const Inputs& in) {
            return ops::max_pool2d_with_indices(in[0], pc.kernel, pc.stride, pc.pad, pc.dil).second;
          },
          {x}, {0, 0}, "max indices " + what);
      // The backward through the CPU's indices on both sides, so that it is the scatter that is compared.
      const auto [y, indices] = ops::max_pool2d_with_indices(x, pc.kernel, pc.stride, pc.pad, pc.dil);
      const Tensor dy = uniform(y.shape(), -1, 1, t, 22);
      expect_gpu_matches_cpu([&](const Inputs& in) { return ops::max_pool2d_backward(in[0], in[1], pc.x); },
                             {dy, indices}, tol_for(t), "max backward " + what);
      if (pc.dil.h != 1 || pc.dil.w != 1) continue;
      for (bool include_pad : {true, false}) {
        const std::string w2 = what + (include_pad ? " counting padding" : "");
        expect_gpu_matches_cpu(
            [&](const Inputs& in) {
              return ops::avg_pool2d(in[0], pc.kernel, pc.stride, pc.pad, include_pad);
            },
            {x}, tol_for(t), "avg " + w2);
        const Tensor ya = ops::avg_pool2d(x, pc.kernel, pc.stride, pc.pad, include_pad);
        const Tensor dya = uniform(ya.shape(), -1, 1, t, 23);
        expect_gpu_matches_cpu(
            [&](const Inputs& in) {
              return ops::avg_pool2d_backward(in[0], pc.x, pc.kernel, pc.stride.value_or(pc.kernel), pc.pad,
                                              include_pad);
            },
            {dya}, tol_for(t), "avg backward " + w2);
      }
      if (HasFailure()) return;
    }
}

TEST_F(Cnn, MaxPoolPropagatesNan) {
  std::vector<float> v(2 * 6 * 6, 0.5f);
  v[7] = std::nanf("");
  const Tensor x = tensor(v, {1, 2, 6, 6});
  expect_gpu_matches_cpu([](const Inputs& in) { return ops::max_pool2d(in[0], 2); }, {x}, {0, 0}, "nan max");
  expect_gpu_matches_cpu([](const Inputs& in) { return ops::max_pool2d_with_indices(in[0], 2).second; }, {x},
                         {0, 0}, "nan max indices (ties keep the first)");
}

// Batch norm (the fused op through nn::functional::batch_norm; cuDNN or frugal's kernels in training): the
// output, the running statistics and the gradients, training and eval, with and without weight and bias,
// f32/f16/bf16 inputs (f32 parameters and statistics, as under autocast).
TEST_F(Cnn, BatchNormTrainingAndEvalMatchTheCpu) {
  for (const ConvPath& path : conv_paths()) {
    UsePath use(path);
    for (DType t : {DType::F32, DType::F16, DType::BF16})
      for (const Shape& shape : {Shape{4, 6, 7, 5}, Shape{9, 6}, Shape{2, 6, 1, 33}})
        for (bool affine : {true, false})
          for (bool training : {true, false}) {
            auto run = [&](Device d) {
              const Tensor x = uniform(shape, -2, 3, t, 31).to(d).detach().requires_grad_();
              const Tensor w =
                  affine ? uniform({6}, 0.5, 1.5, DType::F32, 32).to(d).detach().requires_grad_() : Tensor();
              const Tensor b =
                  affine ? uniform({6}, -1, 1, DType::F32, 33).to(d).detach().requires_grad_() : Tensor();
              Tensor rm = uniform({6}, -1, 1, DType::F32, 34).to(d),
                     rv = uniform({6}, 0.5, 2, DType::F32, 35).to(d);
              const Tensor y = nn::functional::batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5);
              const Tensor dy = uniform(y.shape(), -1, 1, y.dtype(), 36).to(d);
              (y * dy).sum().backward();
              std::vector<Tensor> out{y.to(kCPU), rm.to(kCPU), rv.to(kCPU), x.grad().to(kCPU)};
              if (affine) {
                out.push_back(w.grad().to(kCPU));
                out.push_back(b.grad().to(kCPU));
              }
              return out;
            };
            const auto cpu = run(kCPU), gpu = run(testing::kGpu);
            const char* names[] = {"y", "running_mean", "running_var", "dx", "dweight", "dbias"};
            const testing::Tol tol = t == DType::F32 ? testing::Tol{2e-5, 2e-5} : tol_for(t);
            for (size_t i = 0; i < cpu.size(); ++i)
              testing::expect_close(
                  gpu[i], cpu[i].to_vector<double>(), i >= 3 ? testing::Tol{tol.atol * 4, tol.rtol * 2} : tol,
                  detail::str_cat(path.name(), " batch_norm ", training ? "training " : "eval ", names[i],
                                  " ", dtype_name(t), " x ", shape, affine ? " affine" : ""));
            if (HasFailure()) return;
          }
  }
}

TEST_F(Cnn, BatchNorm2dModuleTracksTheSameStatistics) {
  auto run = [](Device d) {
    manual_seed(41);
    nn::BatchNorm2d bn(5);
    bn->to(d);
    for (uint64_t step = 0; step < 3; ++step)
      bn->forward(uniform({3, 5, 6, 4}, -1, 2, DType::F32, 42 + step).to(d));
    bn->eval();
    const Tensor y = bn->forward(uniform({2, 5, 6, 4}, -1, 1, DType::F32, 50).to(d));
    return std::vector<Tensor>{y.to(kCPU), bn->running_mean.to(kCPU), bn->running_var.to(kCPU),
                               bn->num_batches_tracked.to(kCPU)};
  };
  const auto cpu = run(kCPU), gpu = run(testing::kGpu);
  for (size_t i = 0; i < cpu.size(); ++i)
    testing::expect_close(gpu[i], cpu[i].to_vector<double>(), {2e-5, 2e-5},
                          "BatchNorm2d " + std::to_string(i));
}

TEST_F(Cnn, BadInputsGiveClearErrors) {
  const Device g = testing::kGpu;
  const Tensor x = uniform({2, 3, 8, 8}, -1, 1).to(g), w = uniform({4, 3, 3, 3}, -1, 1);
  expect_error<DeviceError>([&] { ops::conv2d(x, w); }, {"conv2d", "the input is on", "the weight is on"});
  expect_error<ShapeError>(
      [&] {
        ops::conv2d(x, uniform({4, 2, 3, 3}, -1, 1).to(g));
      },
      {"conv2d", "3 channels", "expects 2"});
  expect_error<DTypeError>([&] { ops::conv2d(x, w.to(g).to(DType::BF16)); }, {"conv2d", "dtypes differ"});
  expect_error<ShapeError>([&] { ops::conv2d(x, w.to(g), {}, 1, 0, 5); }, {"conv2d", "smaller than"});
  expect_error<Error>([&] { ops::max_pool2d(x, 2, {}, 2); }, {"max_pool2d", "padding", "at most"});
  expect_error<DTypeError>([&] { ops::avg_pool2d(x.to(DType::I64), 2); }, {"avg_pool2d", "floating"});
  const Tensor indices = ops::max_pool2d_with_indices(x, 2).second;
  expect_error<ShapeError>(
      [&] {
        ops::max_pool2d_backward(uniform({2, 3, 5, 5}, -1, 1).to(g), indices, {2, 3, 8, 8});
      },
      {"max_pool2d_backward", "do not belong to one max_pool2d"});
  EXPECT_EQ(indices.device(), g) << "max_pool2d's indices live on its input's device";
  expect_error<DeviceError>(
      [&] {
        ops::max_pool2d_backward(uniform({2, 3, 4, 4}, -1, 1).to(g), indices.to(kCPU), {2, 3, 8, 8});
      },
      {"max_pool2d_backward", "the indices are on cpu", "the output gradient is on cuda:0"});
}

}  // namespace
}  // namespace frugal

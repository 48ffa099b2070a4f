// The measurements of scripts/gpu-check.sh: bf16 GEMM 8192^3 through frugal beside cuBLAS's own rate, an int8
// QuantizedLinear beside its f32 Linear, a 1 GiB device-to-device copy (cudaMemcpy beside frugal's copy_),
// and the bandwidth of elementwise adds and a sum against the copy's, and the W3 GPT and W2 CNN training
// steps in f32 and under bf16 autocast. Each is checked before it is timed (STYLE.md rule 15), then timed
// with CUDA events as the median of several runs after a warm-up. Prints a markdown table; exits non-zero
// when a check fails.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench/cuda/w2_step.h"
#include "frugal.h"
#include "kernels/cuda/runtime.h"

#ifdef FRUGAL_HAVE_CUDNN
#include <cudnn.h>
#endif

using namespace frugal;

namespace {

constexpr int64_t kGiB = int64_t(1) << 30;
int g_failures = 0;

#define BENCH_CUBLAS_CHECK(call)                                                                             \
  do {                                                                                                       \
    const cublasStatus_t s = (call);                                                                         \
    if (s != CUBLAS_STATUS_SUCCESS) {                                                                        \
      std::fprintf(stderr, "%s failed at %s:%d: %s\n", #call, __FILE__, __LINE__, cublasGetStatusString(s)); \
      std::exit(2);                                                                                          \
    }                                                                                                        \
  } while (0)

// Median time of fn in milliseconds, measured with events on the default stream (frugal's).
double median_ms(const std::function<void()>& fn, int warmup = 3, int reps = 15) {
  cudaEvent_t start, stop;
  FRUGAL_CUDA_CHECK(cudaEventCreate(&start));
  FRUGAL_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) fn();
  FRUGAL_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    FRUGAL_CUDA_CHECK(cudaEventRecord(start, nullptr));
    fn();
    FRUGAL_CUDA_CHECK(cudaEventRecord(stop, nullptr));
    FRUGAL_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    FRUGAL_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  FRUGAL_CUDA_CHECK(cudaEventDestroy(start));
  FRUGAL_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]);
}

void check(bool ok, const std::string& what) {
  if (ok) return;
  ++g_failures;
  std::fprintf(stderr, "CHECK FAILED: %s\n", what.c_str());
}

// Elements i of two same-shaped tensors agree within tol (relative to the larger magnitude, plus atol).
void check_samples(const Tensor& got, const std::function<double(int64_t)>& want, int64_t n, double atol,
                   double rtol, const std::string& what) {
  const Tensor flat = got.reshape({-1});
  for (int k = 0; k < 16; ++k) {
    const int64_t i = (int64_t(k) * 2654435761LL) % n;
    const double g = flat.select(0, i).item<double>(), w = want(i);
    if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w))) {
      check(false, what + ": element " + std::to_string(i) + " is " + std::to_string(g) + ", expected " +
                       std::to_string(w));
      return;
    }
  }
}

struct Row {
  std::string measure, frugal, peer, ratio, target;
};
std::vector<Row> g_rows;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

void gemm_bf16(int64_t n) {
  // Inputs drawn on the host, so that the check can recompute entries there.
  Generator gen(1);
  const Tensor a_host = randn({n, n}, DType::F32, &gen).to(DType::BF16);
  const Tensor b_host = randn({n, n}, DType::F32, &gen).to(DType::BF16);
  const Tensor a = a_host.to(cuda(0)), b = b_host.to(cuda(0));
  Tensor c = ops::matmul(a, b);
  // Sampled entries against a dot product in f64 of the same bf16 inputs.
  const std::vector<float> av = a_host.to_vector<float>(), bv = b_host.to_vector<float>();
  auto want = [&](int64_t idx) {
    const int64_t i = idx / n, j = idx % n;
    double s = 0;
    for (int64_t k = 0; k < n; ++k) s += double(av[size_t(i * n + k)]) * double(bv[size_t(k * n + j)]);
    return s;
  };
  check_samples(c, want, n * n, 0.5, 1e-2, "bf16 GEMM (frugal)");

  cublasHandle_t handle;
  BENCH_CUBLAS_CHECK(cublasCreate(&handle));
  Tensor c2 = empty({n, n}, TensorOptions(DType::BF16).device(cuda(0)));
  const float alpha = 1, beta = 0;
  auto cublas = [&] {  // row-major C = A B as column-major C^T = B^T A^T
    BENCH_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(n), int(n), &alpha,
                                    b.raw_data(), CUDA_R_16BF, int(n), a.raw_data(), CUDA_R_16BF, int(n),
                                    &beta, c2.raw_data(), CUDA_R_16BF, int(n), CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
  };
  cublas();
  check_samples(c2, want, n * n, 0.5, 1e-2, "bf16 GEMM (cuBLAS)");

  const double flops = 2.0 * double(n) * double(n) * double(n);
  const double ours = flops / (median_ms([&] { c = ops::matmul(a, b); }) * 1e-3) / 1e12;
  const double peer = flops / (median_ms(cublas) * 1e-3) / 1e12;
  g_rows.push_back({"bf16 GEMM " + std::to_string(n) + "^3", fmt("%.1f TFLOP/s", ours),
                    "cuBLAS " + fmt("%.1f TFLOP/s", peer), fmt("%.2f", ours / peer), ">= 0.70"});
  BENCH_CUBLAS_CHECK(cublasDestroy(handle));
}

// An int8 QuantizedLinear (Note [an int8 layer on a GPU], nn/quant.cpp) beside the f32 Linear it was made
// from, both on the GPU, forward on m rows: the dynamic quantisation of the input (its range read back), the
// s8 GEMM through cuBLASLt and the f32 output. Checked against the f32 layer within the quantisation's error.
void int8_linear(int64_t m, int64_t k, int64_t n) {
  manual_seed(2);
  nn::Linear f32(k, n);
  nn::QuantizedLinear q(f32->weight.detach(), f32->bias.detach());  // quantised on the host, then moved
  f32->to(cuda(0));
  q->to(cuda(0));
  Generator gen(3);
  const Tensor x = randn({m, k}, DType::F32, &gen).to(cuda(0));
  NoGradGuard no_grad;
  Tensor y = f32->forward(x), yq = q->forward(x);
  const Tensor want = y.reshape({-1});
  check_samples(
      yq, [&](int64_t i) { return want.select(0, i).item<double>(); }, m * n, 0.05, 0.05,
      "int8 QuantizedLinear against its f32 Linear");
  const double ours = median_ms([&] { yq = q->forward(x); });
  const double f32_ms = median_ms([&] { y = f32->forward(x); });
  g_rows.push_back({"int8 QuantizedLinear, " + std::to_string(m) + " rows, " + std::to_string(k) + " -> " +
                        std::to_string(n),
                    fmt("%.3f ms", ours), "f32 Linear (frugal) " + fmt("%.3f ms", f32_ms),
                    fmt("%.2f", ours / f32_ms), "<= 0.60"});
}

// Returns the cudaMemcpy rate (GB/s, read + write), the ceiling of the bandwidth rows.
double copies() {
  const int64_t n = kGiB / 4;
  const Tensor src = arange(0, double(n), 1, TensorOptions(DType::F32).device(cuda(0)));
  Tensor dst = zeros({n}, cuda(0));
  auto want = [](int64_t i) { return double(float(double(i))); };
  FRUGAL_CUDA_CHECK(cudaMemcpy(dst.raw_data(), src.raw_data(), size_t(kGiB), cudaMemcpyDeviceToDevice));
  check_samples(dst, want, n, 0, 0, "cudaMemcpy");
  dst.zero_();
  dst.copy_(src);
  check_samples(dst, want, n, 0, 0, "copy_");
  const double bytes = 2.0 * double(kGiB);
  const double peer = bytes /
                      (median_ms([&] {
                         FRUGAL_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), size_t(kGiB),
                                                           cudaMemcpyDeviceToDevice, nullptr));
                       }) *
                       1e-3) /
                      1e9;
  const double ours = bytes / (median_ms([&] { dst.copy_(src); }) * 1e-3) / 1e9;
  g_rows.push_back({"D2D copy 1 GiB (read + write)", "copy_ " + fmt("%.0f GB/s", ours),
                    "cudaMemcpy " + fmt("%.0f GB/s", peer), fmt("%.2f", ours / peer), ""});
  return peer;
}

// Elementwise and reduction rates against the copy's: bytes moved (inputs read + output written) per second.
// The inputs are a[i] = i * (1 / n) and b = a + 1 in f32, each rounding step reproduced on the host below.
void bandwidth(double copy_gbs) {
  auto row = [&](const std::string& what, double bytes, const std::function<void()>& fn) {
    const double gbs = bytes / (median_ms(fn) * 1e-3) / 1e9;
    g_rows.push_back({what, fmt("%.0f GB/s", gbs), "copy " + fmt("%.0f GB/s", copy_gbs),
                      fmt("%.2f", gbs / copy_gbs), ">= 0.80"});
  };
  const int64_t n = kGiB / 4;
  const float scale = float(1.0 / double(n));
  auto fa = [&](int64_t i) { return float(double(i)) * scale; };
  auto fb = [&](int64_t i) { return fa(i) + 1.0f; };
  const Tensor a =
      ops::mul(arange(0, double(n), 1, TensorOptions(DType::F32).device(cuda(0))), 1.0 / double(n));
  const Tensor b = ops::add(a, 1.0);
  Tensor c = ops::add(a, b);
  check_samples(
      c, [&](int64_t i) { return double(fa(i) + fb(i)); }, n, 0, 0, "add f32");
  row("add f32, 1 GiB operands", 3.0 * double(kGiB), [&] { c = ops::add(a, b); });

  const Tensor ah = a.to(DType::BF16), bh = b.to(DType::BF16);
  Tensor ch = ops::add(ah, bh);
  check_samples(
      ch, [&](int64_t i) { return double(float(BFloat16(float(BFloat16(fa(i))) + float(BFloat16(fb(i)))))); },
      n, 0, 0, "add bf16");
  row("add bf16, 512 MiB operands", 1.5 * double(kGiB), [&] { ch = ops::add(ah, bh); });

  const Tensor m = a.reshape({65536, 4096}), bias = b.narrow(0, 0, 4096);
  Tensor mb = ops::add(m, bias);
  check_samples(
      mb, [&](int64_t i) { return double(fa(i) + fb(i % 4096)); }, n, 0, 0, "bias add");
  row("bias add f32 [65536, 4096] + [4096]", 2.0 * double(kGiB), [&] { mb = ops::add(m, bias); });

  Tensor s = ops::sum(m, {1});
  check_samples(
      s,
      [&](int64_t r) {
        double t = 0;
        for (int64_t j = 0; j < 4096; ++j) t += double(fa(r * 4096 + j));
        return t;
      },
      65536, 1e-3, 1e-5, "row sums");
  row("sum over rows f32 [65536, 4096]", double(kGiB), [&] { s = ops::sum(m, {1}); });
}

// W3 (shared/WORKLOADS.md): the GPT of nn/gpt.h (4 blocks, d 128, 4 heads, context 64), batch 32, AdamW lr
// 1e-3, on random tokens (the corpus need not be on the GPU machine), the whole step on cuda:0: forward,
// cross-entropy, backward, update; in f32 or under bf16 autocast. Checked first: one step's loss against the
// same step on the CPU. Then the median step time (CUDA events) and the arena's peak bytes over the steps.
void gpt_step(bool bf16) {
  constexpr int64_t kVocab = 100, kBatch = 32, kContext = 64;
  std::vector<int64_t> ids(size_t(kBatch * (kContext + 1)));
  uint64_t state = 12345;
  for (int64_t& v : ids) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = int64_t((state >> 33) % uint64_t(kVocab));
  }
  const Tensor tokens = tensor(ids, {kBatch, kContext + 1});
  auto make = [&](Device d) {
    manual_seed(0);
    auto model = std::make_shared<nn::GPTImpl>(nn::GPTConfig{.vocab = kVocab});
    model->to(d);
    return model;
  };
  auto step = [&](nn::GPTImpl& model, optim::Optimizer& opt, const Tensor& input, const Tensor& target) {
    opt.zero_grad();
    Tensor loss;
    {
      amp::Autocast autocast(DType::BF16, bf16);
      loss = nn::functional::cross_entropy(model.forward(input).view({-1, kVocab}), target.view({-1}));
    }
    loss.backward();
    opt.step();
    return loss;
  };
  const std::string name = bf16 ? "bf16 autocast" : "f32";
  double loss_cpu = 0, loss_gpu = 0;
  {
    auto model = make(kCPU);
    optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-3));
    loss_cpu = step(*model, opt, tokens.narrow(1, 0, kContext).contiguous(),
                    tokens.narrow(1, 1, kContext).contiguous())
                   .item<double>();
  }
  auto model = make(cuda(0));
  optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-3));
  const Tensor on_gpu = tokens.to(cuda(0));
  const Tensor input = on_gpu.narrow(1, 0, kContext).contiguous(),
               target = on_gpu.narrow(1, 1, kContext).contiguous();
  loss_gpu = step(*model, opt, input, target).item<double>();
  const double tol = bf16 ? 3e-2 : 1e-4;
  check(std::isfinite(loss_gpu) && std::fabs(loss_gpu - loss_cpu) <= tol * std::fabs(loss_cpu),
        "W3 " + name + ": first-step loss on the GPU " + std::to_string(loss_gpu) + ", on the CPU " +
            std::to_string(loss_cpu));
  memory::reset_peak(cuda(0));
  const double ms = median_ms([&] { step(*model, opt, input, target); }, 5, 20);
  const double peak = double(memory::stats(cuda(0)).allocated.peak);
  g_rows.push_back({"W3 GPT step " + name + " (B 32, T 64, d 128)",
                    fmt("%.2f ms", ms) + ", peak " + fmt("%.1f MiB", peak / double(1 << 20)),
                    "loss " + fmt("%.4f", loss_gpu) + " (CPU " + fmt("%.4f", loss_cpu) + ")", "", ""});
}

// W2 (shared/WORKLOADS.md): the trainer's CNN, Adam, batch 64, on a fixed synthetic batch
// (bench/cuda/w2_step.h). The step must learn: the last timed loss below the first.
void cnn_step(std::optional<DType> autocast) {
  const std::string name = autocast ? "bf16 autocast" : "f32";
  const bench::W2StepTiming t = bench::time_w2_step(autocast);
  check(std::isfinite(t.last_loss) && t.last_loss < t.first_loss,
        "W2 " + name + ": the loss on a fixed batch went from " + std::to_string(t.first_loss) + " to " +
            std::to_string(t.last_loss));
  g_rows.push_back({"W2 CNN step " + name + " (batch 64)", fmt("%.2f ms", t.median_ms),
                    "loss " + fmt("%.4f", t.first_loss) + " -> " + fmt("%.4f", t.last_loss), "", ""});
}

}  // namespace

int main() {
  if (!cuda_is_available()) {
    std::fprintf(stderr, "gpu_bench: no CUDA device here\n");
    return 2;
  }
  cudaDeviceProp prop{};
  FRUGAL_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  FRUGAL_CUDA_CHECK(cudaDriverGetVersion(&driver));
  FRUGAL_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf("GPU: %s, sm_%d%d, %d SMs, %.0f GiB; driver %d.%d, runtime %d.%d\n", prop.name, prop.major,
              prop.minor, prop.multiProcessorCount, double(prop.totalGlobalMem) / double(kGiB), driver / 1000,
              (driver % 1000) / 10, runtime / 1000, (runtime % 1000) / 10);
#ifdef FRUGAL_HAVE_CUDNN
  std::printf("cuDNN: linked %s, loaded version %zu; used for convolution and batch norm in training\n",
              FRUGAL_CUDNN_LIBRARY, cudnnGetVersion());
#else
  std::printf("cuDNN: not found at build time, not used\n");
#endif
  gemm_bf16(8192);
  int8_linear(4096, 8192, 8192);
  const double copy_gbs = copies();
  bandwidth(copy_gbs);
  gpt_step(false);
  gpt_step(true);
  cnn_step(std::nullopt);
  cnn_step(DType::BF16);

  std::printf("\n| measure | frugal | peer, same run | frugal / peer | target |\n|---|---|---|---|---|\n");
  for (const Row& r : g_rows)
    std::printf("| %s | %s | %s | %s | %s |\n", r.measure.c_str(), r.frugal.c_str(), r.peer.c_str(),
                r.ratio.c_str(), r.target.c_str());
  std::printf("\n%s", memory::memory_summary(cuda(0)).c_str());
  if (g_failures) std::fprintf(stderr, "gpu_bench: %d check(s) failed\n", g_failures);
  return g_failures ? 1 : 0;
}

// The reference workloads of shared/WORKLOADS.md in libtorch's C++ frontend, printing the same JSON lines as
// bench/peers/torch_workloads.py and bench/workloads:
//   build/bench/libtorch_workloads W1 W4 W4r      (none named: W1-W6)
// Built on request (bench/CMakeLists.txt): against Debian's libtorch-dev 1.13 (libtorch_workloads) and
// against the C++ library inside pip's torch wheel (libtorch2_workloads); bench/compare.sh runs them beside
// frugal and PyTorch. Data as the Python peer reads it: Fashion-MNIST from Debian's gzip'd IDX files (pixels
// / 255, u8 in memory, converted per batch), the fortunes corpus (files without a '.', sorted, byte tokens,
// the first 90% for training). Differences forced by the C++ API, each the nearest equivalent:
// - attention is scaled_dot_product_attention in 2.x, the explicit softmax form in 1.13 (where it is
// missing);
// - W4r's recompute is a custom autograd Function (libtorch has no torch.utils.checkpoint), with the
//   segments of Python's checkpoint_sequential(net, 6): 5 recomputed segments of 10 modules, the last 14
//   modules run plainly;
// - W6 (W3 under bf16 autocast) sets at::autocast's CPU state directly, as torch.autocast("cpu") does.
#include <ATen/autocast_mode.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
namespace nn = torch::nn;
namespace F = torch::nn::functional;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

long long peak_rss() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<long long>(u.ru_maxrss) * 1024;
}

int64_t steps_or(int64_t dflt) {
  const char* s = std::getenv("FRUGAL_BENCH_STEPS");
  return s ? std::max<int64_t>(1, std::atoll(s)) : dflt;
}

std::string peer() { return std::string("libtorch ") + TORCH_VERSION; }

// ---- data
// --------------------------------------------------------------------------------------------------

// An IDX file (gzip'd) as a u8 tensor of its dims.
torch::Tensor read_idx(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path);
  std::vector<unsigned char> bytes;
  unsigned char buf[1 << 16];
  int got;
  while ((got = gzread(f, buf, sizeof buf)) > 0) bytes.insert(bytes.end(), buf, buf + got);
  gzclose(f);
  if (got < 0 || bytes.size() < 4) throw std::runtime_error("cannot read " + path);
  const int ndim = bytes[3];
  std::vector<int64_t> dims;
  size_t off = 4;
  for (int d = 0; d < ndim; ++d, off += 4)
    dims.push_back(int64_t(bytes[off]) << 24 | int64_t(bytes[off + 1]) << 16 | int64_t(bytes[off + 2]) << 8 |
                   int64_t(bytes[off + 3]));
  torch::Tensor t = torch::empty(dims, torch::kUInt8);
  std::copy(bytes.begin() + long(off), bytes.end(), t.data_ptr<uint8_t>());
  return t;
}

// ---- W1 / W2
// -----------------------------------------------------------------------------------------------

void fashion(const char* name, bool cnn) {
  const std::string root = "/usr/share/datasets/fashion-mnist/";
  const char* seed = std::getenv("FRUGAL_BENCH_SEED");  // the seed's spread: as bench/workloads
  torch::manual_seed(seed ? uint64_t(std::atoll(seed)) : 0);
  const torch::Tensor xtr = read_idx(root + "train-images-idx3-ubyte.gz"),
                      ytr = read_idx(root + "train-labels-idx1-ubyte.gz").to(torch::kLong),
                      xte = read_idx(root + "t10k-images-idx3-ubyte.gz"),
                      yte = read_idx(root + "t10k-labels-idx1-ubyte.gz").to(torch::kLong);
  nn::Sequential model;
  int64_t batch;
  if (cnn) {
    model = nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 32, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                           nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                           nn::Flatten(), nn::Linear(3136, 128), nn::ReLU(), nn::Linear(128, 10));
    batch = 64;
  } else {
    model = nn::Sequential(nn::Flatten(), nn::Linear(784, 256), nn::ReLU(), nn::Linear(256, 256), nn::ReLU(),
                           nn::Linear(256, 10));
    batch = 128;
  }
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  const torch::Tensor perm = torch::randperm(60000);
  const int64_t steps = steps_or(60000 / batch);
  std::vector<double> times;
  const Clock::time_point t0 = Clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    const Clock::time_point t = Clock::now();
    const torch::Tensor idx = perm.slice(0, i * batch, (i + 1) * batch);
    const torch::Tensor x = xtr.index_select(0, idx).to(torch::kFloat).div_(255).unsqueeze(1);
    torch::Tensor loss = F::cross_entropy(model->forward(x), ytr.index_select(0, idx));
    opt.zero_grad();
    loss.backward();
    opt.step();
    times.push_back(ms_since(t));
  }
  const double epoch_s = ms_since(t0) / 1000;
  int64_t correct = 0;
  {
    torch::NoGradGuard no_grad;
    for (int64_t j = 0; j < 10000; j += 250) {
      const torch::Tensor x = xte.slice(0, j, j + 250).to(torch::kFloat).div(255).unsqueeze(1);
      correct += (model->forward(x).argmax(1) == yte.slice(0, j, j + 250)).sum().item<int64_t>();
    }
  }
  std::printf(
      "{\"name\": \"%s\", \"median_step_ms\": %.4f, \"steps\": %lld, \"epoch_s\": %.3f, \"test_accuracy\": "
      "%.4f, "
      "\"peak_rss_bytes\": %lld, \"threads\": %d, \"peer\": \"%s\"}\n",
      name, median(times), static_cast<long long>(steps), epoch_s, double(correct) / 10000, peak_rss(),
      torch::get_num_threads(), peer().c_str());
}

// ---- W4 / W4r
// ----------------------------------------------------------------------------------------------

// Modules [begin, end) of a Sequential, one after another.
torch::Tensor run_modules(nn::Sequential& net, int64_t begin, int64_t end, torch::Tensor x) {
  for (auto it = net->begin() + begin; it != net->begin() + end; ++it) x = it->forward(x);
  return x;
}

// Runs modules [begin, end) of a Sequential without recording; backward runs them again with recording on
// and differentiates them (the reentrant form of torch.utils.checkpoint). The segment's parameters are inputs
// too, so that its output requires grad even when x does not (the first segment's).
struct Checkpoint : torch::autograd::Function<Checkpoint> {
  // params is a TensorList: the form Function::apply counts as inputs (a std::vector would not be).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, at::TensorList params,
                               nn::Sequential* net, int64_t begin, int64_t end) {
    ctx->save_for_backward({x});
    ctx->saved_data["net"] = reinterpret_cast<int64_t>(net);
    ctx->saved_data["begin"] = begin;
    ctx->saved_data["end"] = end;
    ctx->saved_data["params"] = int64_t(params.size());
    torch::NoGradGuard no_grad;
    return run_modules(*net, begin, end, x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto* net = reinterpret_cast<nn::Sequential*>(ctx->saved_data["net"].toInt());
    const int64_t begin = ctx->saved_data["begin"].toInt(), end = ctx->saved_data["end"].toInt();
    const torch::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    torch::autograd::variable_list inputs{x};
    for (auto it = (*net)->begin() + begin; it != (*net)->begin() + end; ++it)
      for (const torch::Tensor& p : it->ptr()->parameters()) inputs.push_back(p);
    torch::Tensor y;
    {
      torch::AutoGradMode on(true);
      y = run_modules(*net, begin, end, x);
    }
    torch::autograd::variable_list grads = torch::autograd::grad({y}, inputs, {grad[0]});
    grads.resize(grads.size() + 3);  // net, begin, end
    return grads;
  }
};

// The parameters of modules [begin, end).
torch::autograd::variable_list parameters_of(nn::Sequential& net, int64_t begin, int64_t end) {
  torch::autograd::variable_list ps;
  for (auto it = net->begin() + begin; it != net->begin() + end; ++it)
    for (const torch::Tensor& p : it->ptr()->parameters()) ps.push_back(p);
  return ps;
}

// checkpoint_sequential(net, segments, x): segments - 1 recomputed runs of size() / segments modules, then
// the rest plainly.
torch::Tensor checkpoint_sequential(nn::Sequential& net, int64_t segments, torch::Tensor x) {
  const int64_t n = int64_t(net->size()), size = n / segments;
  int64_t end = -1;
  for (int64_t start = 0; start < size * (segments - 1); start += size) {
    end = start + size - 1;
    const torch::autograd::variable_list params = parameters_of(net, start, end + 1);
    x = Checkpoint::apply(x, at::TensorList(params), &net, start, end + 1);
  }
  return run_modules(net, end + 1, n, x);
}

// torch.autocast("cpu", torch.bfloat16) on entry and exit, in either API.
void set_cpu_autocast(bool on) {
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCPU, on);
#else
  at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
  at::autocast::set_cpu_enabled(on);
#endif
  if (!on) at::autocast::clear_cache();
}

// W4, W4r (segments > 0) and W4b (bf16: the forward and the loss under bf16 autocast, 20 steps).
void deep(const char* name, int64_t segments, bool bf16 = false) {
  torch::manual_seed(0);
  nn::Sequential net;
  for (int i = 0; i < 32; ++i) {
    net->push_back(nn::Linear(1024, 1024));
    net->push_back(nn::ReLU());
  }
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(1e-3).momentum(0.9));
  const torch::Tensor x = torch::randn({1024, 1024}), target = torch::randn({1024, 1024});
  std::vector<double> times;
  double loss = 0;
  const int64_t steps = steps_or(bf16 ? 18 : 8);
  for (int64_t s = 0; s < steps + 2; ++s) {
    const Clock::time_point t = Clock::now();
    opt.zero_grad();
    if (bf16) set_cpu_autocast(true);
    const torch::Tensor y = segments ? checkpoint_sequential(net, segments, x) : net->forward(x);
    torch::Tensor l = F::mse_loss(y, target);
    if (bf16) set_cpu_autocast(false);
    l.backward();
    opt.step();
    if (s >= 2) times.push_back(ms_since(t));
    loss = l.item<double>();
  }
  const double med = median(times);
  std::printf(
      "{\"name\": \"%s\", \"median_step_ms\": %.3f, \"steps\": %lld, \"gflops\": %.1f, \"loss\": %.6f, "
      "\"peak_rss_bytes\": %lld, \"threads\": %d, \"peer\": \"%s\"}\n",
      name, med, static_cast<long long>(steps), 3.0 * 2 * std::pow(1024.0, 3) * 32 / (med * 1e6), loss,
      peak_rss(), torch::get_num_threads(), peer().c_str());
}

// ---- W3 / W6
// -----------------------------------------------------------------------------------------------

constexpr int64_t kD = 128, kT = 64, kHeads = 4, kLayers = 4;

struct AttentionImpl : nn::Module {
  nn::Linear qkv{nullptr}, proj{nullptr};
  torch::Tensor mask;
  AttentionImpl()
      : qkv(register_module("qkv", nn::Linear(kD, 3 * kD))),
        proj(register_module("proj", nn::Linear(kD, kD))) {
    mask = register_buffer("mask", torch::ones({kT, kT}, torch::kBool).triu(1));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1);
    const auto qkv_heads = qkv->forward(x).view({b, t, 3, kHeads, kD / kHeads}).permute({2, 0, 3, 1, 4});
    const torch::Tensor q = qkv_heads[0], k = qkv_heads[1], v = qkv_heads[2];
#if TORCH_VERSION_MAJOR >= 2
    const torch::Tensor y = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
#else
    torch::Tensor att = torch::matmul(q, k.transpose(-1, -2)) * (1 / std::sqrt(double(kD / kHeads)));
    att = torch::softmax(att.masked_fill(mask.slice(0, 0, t).slice(1, 0, t), -INFINITY), -1);
    const torch::Tensor y = torch::matmul(att, v);
#endif
    return proj->forward(y.transpose(1, 2).reshape({b, t, kD}));
  }
};
TORCH_MODULE(Attention);

struct BlockImpl : nn::Module {
  nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  Attention attn{nullptr};
  nn::Sequential mlp{nullptr};
  BlockImpl()
      : ln1(register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({kD})))),
        ln2(register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({kD})))),
        attn(register_module("attn", Attention())),
        mlp(register_module("mlp",
                            nn::Sequential(nn::Linear(kD, 4 * kD), nn::GELU(), nn::Linear(4 * kD, kD)))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn->forward(ln1->forward(x));
    return x + mlp->forward(ln2->forward(x));
  }
};
TORCH_MODULE(Block);

struct GPTImpl : nn::Module {
  nn::Embedding tok{nullptr}, pos{nullptr};
  std::vector<Block> blocks;
  nn::LayerNorm ln_f{nullptr};
  nn::Linear head{nullptr};
  explicit GPTImpl(int64_t vocab)
      : tok(register_module("tok", nn::Embedding(vocab, kD))),
        pos(register_module("pos", nn::Embedding(kT, kD))) {
    for (int64_t i = 0; i < kLayers; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), Block()));
    ln_f = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({kD})));
    head = register_module("head", nn::Linear(kD, vocab));
  }
  torch::Tensor forward(const torch::Tensor& idx) {
    torch::Tensor x = tok->forward(idx) + pos->forward(torch::arange(idx.size(1)));
    for (auto& b : blocks) x = b->forward(x);
    return head->forward(ln_f->forward(x));
  }
};
TORCH_MODULE(GPT);

// W3, and W6 (W3 under bf16 autocast) when bf16 is set.
void gpt(const char* name, bool bf16) {
  namespace fs = std::filesystem;
  const std::string root = "/usr/share/games/fortunes";
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (n.find('.') == std::string::npos && e.is_regular_file()) files.push_back(n);
  }
  std::sort(files.begin(), files.end());
  std::vector<uint8_t> corpus;
  for (const auto& f : files) {
    std::ifstream in(root + "/" + f, std::ios::binary);
    corpus.insert(corpus.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  int64_t id_of[256];
  std::fill(std::begin(id_of), std::end(id_of), -1);
  for (uint8_t b : corpus) id_of[b] = 0;
  int64_t vocab = 0;
  for (int64_t& id : id_of)
    if (id == 0) id = vocab++;
  const int64_t n = int64_t(corpus.size()), n_train = n - int64_t(double(n) * 0.1);
  torch::Tensor train = torch::empty({n_train}, torch::kLong);
  for (int64_t i = 0; i < n_train; ++i) train.data_ptr<int64_t>()[i] = id_of[corpus[size_t(i)]];

  torch::manual_seed(0);
  GPT model(vocab);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  std::vector<double> times;
  double value = 0;
  const int64_t steps = steps_or(30);
  const torch::Tensor offsets = torch::arange(kT + 1);
  for (int64_t s = 0; s < steps + 5; ++s) {
    const Clock::time_point t = Clock::now();
    const torch::Tensor starts = torch::randint(0, n_train - kT, {32});
    const torch::Tensor window = train.index({starts.unsqueeze(1) + offsets});
    for (auto& p : model->parameters()) p.mutable_grad().reset();  // zero_grad(set_to_none=True)
    torch::Tensor loss;
    if (bf16) set_cpu_autocast(true);
    {
      torch::Tensor logits = model->forward(window.slice(1, 0, kT));
      loss = F::cross_entropy(logits.reshape({-1, vocab}), window.slice(1, 1, kT + 1).reshape({-1}));
    }
    if (bf16) set_cpu_autocast(false);
    loss.backward();
    opt.step();
    value = loss.item<double>();
    if (s >= 5) times.push_back(ms_since(t));
  }
  std::printf(
      "{\"name\": \"%s\", \"median_step_ms\": %.3f, \"steps\": %lld, \"loss\": %.6f, \"peak_rss_bytes\": "
      "%lld, "
      "\"threads\": %d, \"peer\": \"%s\"}\n",
      name, median(times), static_cast<long long>(steps), value, peak_rss(), torch::get_num_threads(),
      peer().c_str());
}

// ---- W5
// ----------------------------------------------------------------------------------------------------

// W5, and W5b in bf16 (a bf16 result; the GEMM accumulates in f32).
void gemm(bool bf16) {
  const auto dtype = bf16 ? torch::kBFloat16 : torch::kFloat32;
  const torch::Tensor a = torch::randn({1024, 1024}).to(dtype), b = torch::randn({1024, 1024}).to(dtype);
  std::vector<double> times;
  for (int i = 0; i < 23; ++i) {
    const Clock::time_point t = Clock::now();
    const torch::Tensor c = torch::matmul(a, b);
    if (i >= 3) times.push_back(ms_since(t));
  }
  const double med = median(times);
  std::printf(
      "{\"name\": \"%s\", \"median_ms\": %.4f, \"gflops\": %.1f, \"threads\": %d, \"peer\": \"%s\"}\n",
      bf16 ? "W5b" : "W5", med, 2 * std::pow(1024.0, 3) / (med * 1e6), torch::get_num_threads(),
      peer().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> names(argv + 1, argv + argc);
  if (names.empty()) names = {"W1", "W2", "W3", "W4", "W4r", "W5", "W6"};
  try {
    for (const std::string& n : names) {
      if (n == "W1")
        fashion("W1", false);
      else if (n == "W2")
        fashion("W2", true);
      else if (n == "W3")
        gpt("W3", false);
      else if (n == "W4")
        deep("W4", 0);
      else if (n == "W4r")
        deep("W4r", 6);
      else if (n == "W4b")
        deep("W4b", 0, true);
      else if (n == "W5")
        gemm(false);
      else if (n == "W5b")
        gemm(true);
      else if (n == "W6")
        gpt("W6", true);
      else {
        std::fprintf(stderr, "libtorch_workloads: unknown workload '%s' (W1 W2 W3 W4 W4r W4b W5 W5b W6)\n",
                     n.c_str());
        return 1;
      }
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libtorch_workloads: %s\n", e.what());
    return 1;
  }
  return 0;
}

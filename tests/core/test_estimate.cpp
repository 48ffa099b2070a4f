// The dry run (core/estimate.h) on the meta device (Note [the meta device], core/device.h): meta tensors have
// shapes and no values, and a step run on them allocates exactly what it allocates on the cpu, event for
// event, so that the estimated peak is the measured one.
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "autograd/nn_ops.h"
#include "kernels/cpu/reference.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

namespace F = nn::functional;
using memory::EventKind;
using memory::HistoryRecord;

TEST(MetaDevice, TensorsHaveShapesAndNoValues) {
  EXPECT_EQ(Device::parse("meta"), kMeta);
  EXPECT_EQ(kMeta.str(), "meta");
  const Tensor a = randn({3, 4}, kMeta);
  const Tensor b = ones({4, 5}, TensorOptions(DType::BF16).device(kMeta));
  const Tensor c = matmul(a, b.to(DType::F32));
  EXPECT_EQ(c.shape(), Shape({3, 5}));
  EXPECT_EQ(c.device(), kMeta);
  EXPECT_EQ(c.sum().shape(), Shape({}));
  EXPECT_EQ(c.str(), "tensor(..., device='meta', size=(3, 5))");
  EXPECT_EQ(b.str(), "tensor(..., device='meta', size=(4, 5), dtype=bf16)");
  // A value from the host goes in; none comes out.
  const Tensor host = tensor(std::vector<float>{1, 2, 3});
  EXPECT_EQ(host.to(kMeta).device(), kMeta);
  testing::expect_error<DeviceError>([&] { (void)c.sum().item<float>(); },
                                     {"meta tensor", "no values", "dry run"});
  testing::expect_error<DeviceError>([&] { (void)c.to(kCPU); }, {"meta tensor", "shape [3, 5]", "cpu"});
  testing::expect_error<DeviceError>([&] { (void)a.to_vector<float>(); }, {"meta tensor"});
  // Shapes are still checked as on the cpu.
  testing::expect_error<ShapeError>([&] { (void)matmul(a, a); }, {"matmul", "[3, 4]"});
  testing::expect_error<DeviceError>([&] { (void)add(a, randn({3, 4})); }, {"meta", "cpu"});
  EXPECT_THROW(memory::allocator(Device(DeviceType::Meta, 1)), DeviceError);
}

TEST(MetaDevice, TheDefaultDeviceGuardPutsNewTensorsThere) {
  {
    DefaultDeviceGuard guard(kMeta);
    EXPECT_EQ(default_device(), kMeta);
    EXPECT_EQ(zeros({2}).device(), kMeta);
    EXPECT_EQ(arange(5).device(), kMeta);
    nn::Linear big(1 << 14, 1 << 14);  // 1 GiB of parameters, none of it real
    EXPECT_EQ(big->weight.device(), kMeta);
    EXPECT_EQ(tensor(std::vector<int64_t>{1, 2}).device(), kCPU);  // host values stay on the host
  }
  EXPECT_EQ(default_device(), kCPU);
  EXPECT_EQ(zeros({2}).device(), kCPU);
}

// A record's events as comparable lines: what happened, to how many bytes, by which op, under which tag.
std::vector<std::string> event_lines(const HistoryRecord& r) {
  std::vector<std::string> out;
  for (const memory::HistoryEvent& e : r.events) {
    if (e.kind == EventKind::Live) continue;
    // A free names no request: blocks of one size freed in another order (a hash map of nodes, say, whose
    // order follows heap addresses) change no figure.
    const int64_t requested = e.kind == EventKind::Free ? 0 : e.requested;
    out.push_back(detail::str_cat(memory::event_kind_name(e.kind), " ", e.size, " ", requested, " ", e.op,
                                  " ", e.tag < r.tags.size() ? r.tags[e.tag] : "?", " ",
                                  memory::phase_name(e.phase), " ", e.allocated, " ", e.reserved));
  }
  return out;
}

// Runs step as a dry run from the cpu's arena as it is now, then for real on the cpu: the same events in the
// same order, and so the same peaks.
void expect_dry_run_is_exact(const std::function<void(Device)>& step) {
  const memory::Estimate e = memory::estimate(step, memory::EstimateOptions().from(kCPU));
  ASSERT_FALSE(e.out_of_memory) << e.error;
  memory::reset_peak(kCPU);
  HistoryRecord real;
  {
    memory::History history(kCPU);
    step(kCPU);
    real = memory::history(kCPU);
  }
  const memory::Stats s = memory::stats(kCPU);
  EXPECT_EQ(e.peak_allocated, s.allocated.peak);
  EXPECT_EQ(e.peak_reserved, s.reserved.peak);
  EXPECT_EQ(e.peak_requested, s.requested.peak);
  EXPECT_EQ(e.at_peak.total, e.peak_allocated);
  const std::vector<std::string> dry = event_lines(e.timeline), measured = event_lines(real);
  if (const char* dump = std::getenv("FRUGAL_TEST_DUMP_EVENTS")) {  // for a look at a mismatch side by side
    std::ofstream d(std::string(dump) + ".dry"), m(std::string(dump) + ".real");
    for (const std::string& l : dry) d << l << "\n";
    for (const std::string& l : measured) m << l << "\n";
  }
  EXPECT_EQ(dry.size(), measured.size());
  for (size_t i = 0; i < std::min(dry.size(), measured.size()); ++i)
    ASSERT_EQ(dry[i], measured[i]) << "event " << i << " of " << measured.size();
  EXPECT_GT(e.peak_allocated, e.resident);
}

// W1's model at a reduced width.
nn::Sequential small_mlp() {
  nn::Sequential net;
  net->push_back(nn::Flatten());
  net->push_back(nn::Linear(784, 96));
  net->push_back(nn::ReLU());
  net->push_back(nn::Linear(96, 96));
  net->push_back(nn::ReLU());
  net->push_back(nn::Linear(96, 10));
  return net;
}

struct MlpRun {
  std::string optimizer = "adam";
  int micro_batches = 1;
  int recompute_every = 0;
  bool autocast = false;
  bool clip = false;
  int64_t batch = 64;
};

void mlp_steps(Device d, const MlpRun& run) {
  manual_seed(3);
  memory::Tag tag("parameters");
  nn::Sequential model = small_mlp();
  if (run.recompute_every) model->recompute_every(run.recompute_every);
  std::unique_ptr<optim::Optimizer> opt;
  if (run.optimizer == "adam")
    opt = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions(1e-3));
  if (run.optimizer == "sgd")
    opt = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  if (run.optimizer == "adafactor")
    opt = std::make_unique<optim::Adafactor>(model->parameters(), optim::AdafactorOptions());
  ASSERT_NE(opt, nullptr);
  for (int step = 0; step < 2; ++step) {
    opt->zero_grad();
    for (int k = 0; k < run.micro_batches; ++k) {
      memory::Tag data("data");
      const Tensor x = randn({run.batch / run.micro_batches, 1, 28, 28}).to(d);
      const Tensor y = randint(0, 10, {run.batch / run.micro_batches}).to(d);
      std::optional<amp::Autocast> autocast;
      if (run.autocast) autocast.emplace(DType::BF16);
      Tensor loss = F::cross_entropy(model->forward(x), y);
      autocast.reset();
      if (run.micro_batches > 1) loss = loss / double(run.micro_batches);
      loss.backward();
    }
    if (run.clip) optim::clip_grad_norm_(model->parameters(), 1e-6);  // clips: what the dry run assumes
    opt->step();
  }
}

TEST(Estimate, AnMlpStepIsExact) {
  expect_dry_run_is_exact([](Device d) { mlp_steps(d, {}); });
}
TEST(Estimate, EveryTechniqueOfTheMemoryReportIsExact) {
  for (const MlpRun& run : {MlpRun{.optimizer = "sgd"}, MlpRun{.optimizer = "adafactor"},
                            MlpRun{.micro_batches = 4}, MlpRun{.recompute_every = 2},
                            MlpRun{.autocast = true}, MlpRun{.clip = true}, MlpRun{.batch = 4096}}) {
    SCOPED_TRACE(detail::str_cat(run.optimizer, " micro ", run.micro_batches, " recompute ",
                                 run.recompute_every, " autocast ", run.autocast, " batch ", run.batch));
    expect_dry_run_is_exact([&](Device d) { mlp_steps(d, run); });
  }
}

// W2's layers (convolution, pooling, batch norm) at reduced sizes, f32 and bf16.
void cnn_steps(Device d, bool autocast) {
  manual_seed(5);
  nn::Sequential model;
  model->push_back(nn::Conv2d(nn::Conv2dOptions(1, 8, 3).padding(1)));
  model->push_back(nn::BatchNorm2d(8));
  model->push_back(nn::ReLU());
  model->push_back(nn::MaxPool2d(2));
  model->push_back(nn::Conv2d(nn::Conv2dOptions(8, 16, 3).padding(1)));
  model->push_back(nn::ReLU());
  model->push_back(nn::MaxPool2d(2));
  model->push_back(nn::Flatten());
  model->push_back(nn::Linear(16 * 7 * 7, 10));
  optim::SGD opt(model->parameters(), optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < 2; ++step) {
    const Tensor x = randn({16, 1, 28, 28}).to(d);
    const Tensor y = randint(0, 10, {16}).to(d);
    opt.zero_grad();
    std::optional<amp::Autocast> guard;
    if (autocast) guard.emplace(DType::BF16);
    Tensor loss = F::cross_entropy(model->forward(x), y);
    guard.reset();
    loss.backward();
    opt.step();
  }
}

TEST(Estimate, ACnnStepIsExactInF32AndBf16) {
  expect_dry_run_is_exact([](Device d) { cnn_steps(d, false); });
  expect_dry_run_is_exact([](Device d) { cnn_steps(d, true); });
}

// W2's second convolution at its training batch with Winograd switched on, where oneDNN runs its Winograd
// kernel with a scratchpad for the transformed tiles (Note [Winograd convolutions]) in all three directions.
TEST(Estimate, AWinogradConvolutionStepIsExact) {
  ConvArgs a;
  a.n = 64, a.c = 32, a.h = a.w = 14, a.o = 64, a.kh = a.kw = 3, a.oh = a.ow = 14, a.pad_h = a.pad_w = 1;
  float dummy = 0;
  a.bias = a.dbias = &dummy;
  set_conv_onednn_winograd(true);
  struct Off {
    ~Off() { set_conv_onednn_winograd(false); }  // the default, also when the test stops early
  } off;
  const auto names = conv2d_onednn_implementations(a, DType::F32);
  for (const std::string& name : names)
    if (name.find("wino") == std::string::npos)
      GTEST_SKIP() << "oneDNN runs this convolution without Winograd here: " << name;
  expect_dry_run_is_exact([](Device d) {
    manual_seed(3);
    nn::Sequential model;
    model->push_back(nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)));
    model->push_back(nn::ReLU());
    model->push_back(nn::MaxPool2d(2));
    model->push_back(nn::Flatten());
    model->push_back(nn::Linear(64 * 7 * 7, 10));
    optim::SGD opt(model->parameters(), optim::SGDOptions(0.05));
    for (int step = 0; step < 2; ++step) {
      const Tensor x = randn({64, 32, 14, 14}).to(d);
      const Tensor y = randint(0, 10, {64}).to(d);
      opt.zero_grad();
      F::cross_entropy(model->forward(x), y).backward();
      opt.step();
    }
  });
}

// W3's model at a reduced size: embeddings, attention, layer norm, AdamW, clipping; and with recompute,
// sparse embeddings with SparseAdam (every token distinct, the dry run's worst case, so both agree), or the
// forward under bf16 autocast (W6's form: the norms before a Linear keep x-hat only).
void gpt_steps(Device d, bool recompute, bool sparse, bool autocast = false) {
  manual_seed(7);
  nn::GPTConfig config{.vocab = 64, .d_model = 32, .n_layers = 2, .n_heads = 2, .context = 16};
  config.sparse_embeddings = sparse;
  nn::GPT model(config);
  model->recompute(recompute);
  std::vector<Tensor> dense, embedding;
  for (const Tensor& p : model->parameters())
    (sparse && p.is_same(model->tok_emb->weight) ? embedding : dense).push_back(p);
  optim::AdamW opt(dense, optim::AdamWOptions(1e-3));
  std::optional<optim::SparseAdam> sparse_opt;
  if (sparse) sparse_opt.emplace(embedding, optim::SparseAdamOptions(1e-3));
  for (int step = 0; step < 2; ++step) {
    const Tensor tokens = arange(64, DType::I64).view({4, 16}).to(d);
    opt.zero_grad();
    if (sparse_opt) sparse_opt->zero_grad();
    std::optional<amp::Autocast> guard;
    if (autocast) guard.emplace(DType::BF16);
    Tensor loss = F::cross_entropy(model->forward(tokens).view({-1, config.vocab}), tokens.view({-1}));
    guard.reset();
    loss.backward();
    optim::clip_grad_norm_(dense, 1e-6);  // clips, as the dry run assumes
    opt.step();
    if (sparse_opt) sparse_opt->step();
  }
}

TEST(Estimate, AGptStepIsExact) {
  expect_dry_run_is_exact([](Device d) { gpt_steps(d, false, false); });
  expect_dry_run_is_exact([](Device d) { gpt_steps(d, true, false); });
  expect_dry_run_is_exact([](Device d) { gpt_steps(d, false, true); });
  expect_dry_run_is_exact([](Device d) { gpt_steps(d, false, false, true); });
  expect_dry_run_is_exact([](Device d) { gpt_steps(d, true, false, true); });
}

// Note [counted work in a dry run]: the FLOPs of the ops that multiply matrices and the bytes of the operands
// they read, by their shapes; the kernels fetched; the bytes allocated. A real run between dry runs counts
// nothing, and each dry run starts from zero.
TEST(Estimate, CountsTheWorkOfTheStep) {
  const int64_t m = 24, k = 40, n = 16;
  const memory::Estimate mm = memory::estimate([&](Device d) {
    const Tensor a = empty({3, m, k}, TensorOptions().device(d)),
                 b = empty({k, n}, TensorOptions().device(d));
    const Tensor c = matmul(a, b);
  });
  EXPECT_DOUBLE_EQ(mm.flops, 2.0 * 3 * m * n * k);
  EXPECT_GE(mm.kernel_calls, 1);
  EXPECT_EQ(mm.bytes_allocated, (3 * m * k + k * n + 3 * m * n) * 4);
  EXPECT_DOUBLE_EQ(mm.operand_bytes, (3 * m * k + k * n) * 4);  // b is broadcast: read once
  // A Linear's forward and its two gradients (the input's and the weight's), the bias's sum beside them.
  (void)matmul(testing::uniform({m, k}, -1, 1), testing::uniform({k, n}, -1, 1));  // a cpu op: not counted
  const memory::Estimate lin = memory::estimate([&](Device d) {
    manual_seed(3);
    nn::Linear fc(k, n);
    Tensor x = empty({m, k}, TensorOptions().device(d));
    x.requires_grad_(true);
    fc->forward(x).sum().backward();
  });
  EXPECT_DOUBLE_EQ(lin.flops, 3 * 2.0 * m * n * k);
  // x and w forward; dy and w for d x; dy and x for d w.
  EXPECT_DOUBLE_EQ(lin.operand_bytes, (2 * m * k + 2 * n * k + 2 * m * n) * 4);
  // The weight is read once a product: a forward over two halves of the batch reads it twice.
  auto forward_bytes = [&](int parts) {
    return memory::estimate([&](Device d) {
             manual_seed(3);
             nn::Linear fc(k, n);
             const Tensor x = empty({m, k}, TensorOptions().device(d));
             NoGradGuard no_grad;
             for (int i = 0; i < parts; ++i) fc->forward(x.narrow(0, i * m / parts, m / parts));
           })
        .operand_bytes;
  };
  EXPECT_DOUBLE_EQ(forward_bytes(1), (m * k + n * k) * 4);
  EXPECT_DOUBLE_EQ(forward_bytes(2) - forward_bytes(1), n * k * 4);
  EXPECT_GT(lin.kernel_calls, mm.kernel_calls);
  // A convolution's three directions: 2 x n x o x oh x ow x c x kh x kw each.
  const memory::Estimate conv = memory::estimate([&](Device d) {
    manual_seed(4);
    nn::Conv2d c(nn::Conv2dOptions(3, 8, 3).padding(1));
    Tensor x = empty({2, 3, 10, 10}, TensorOptions().device(d));
    x.requires_grad_(true);
    c->forward(x).sum().backward();
  });
  EXPECT_DOUBLE_EQ(conv.flops, 3 * 2.0 * 2 * 8 * 10 * 10 * 3 * 3 * 3);
  const double cx = 2 * 3 * 10 * 10 * 4, cw = 8 * 3 * 3 * 3 * 4, cy = 2 * 8 * 10 * 10 * 4;
  EXPECT_DOUBLE_EQ(conv.operand_bytes, 2 * (cx + cw + cy));  // x and w; dy and x; dy and w
  // Causal attention: half of the scores and of P V forward, half of four products (five where only the
  // rows' statistics were kept) backward.
  const int64_t b = 2, t = 16, heads = 2, hd = 8;
  const memory::Estimate att = memory::estimate([&](Device d) {
    Tensor qkv = empty({b, t, 3 * heads * hd}, TensorOptions().device(d));
    qkv.requires_grad_(true);
    autograd::self_attention(qkv, heads, hd, 0.25, true).sum().backward();
  });
  const double product = 2.0 * b * heads * t * t * hd * 0.5;
  EXPECT_TRUE(att.flops == product * (2 + 4) || att.flops == product * (2 + 5)) << att.flops / product;
  EXPECT_DOUBLE_EQ(att.operand_bytes,
                   (2 * b * t * 3 * heads * hd + b * t * heads * hd) * 4.0);  // qkv twice, dy
}

TEST(Estimate, AnEmptyArenaAndWhatAStepLeavesBehind) {
  const memory::Estimate e = memory::estimate([](Device d) { mlp_steps(d, {}); });
  EXPECT_EQ(e.resident, 0);
  EXPECT_EQ(e.stats.allocated.current, 0);  // everything the step made was freed by its end
  EXPECT_GT(e.peak_allocated, 0);
  EXPECT_GE(e.peak_reserved, e.peak_allocated);
  int64_t sum = 0;
  for (int64_t b : e.at_peak.by_category) sum += b;
  EXPECT_EQ(sum, e.peak_allocated);
  EXPECT_GT(e.at_peak.by_category[size_t(memory::Category::Parameters)], 0);
  EXPECT_GT(e.at_peak.by_category[size_t(memory::Category::OptimizerState)], 0);
  const std::string table = e.summary();
  EXPECT_NE(table.find("parameters"), std::string::npos) << table;
  EXPECT_NE(table.find(memory::format_bytes(e.peak_allocated)), std::string::npos) << table;
  // The dry run touched neither the cpu's arena nor the default generator.
  const auto before = default_generator().state();
  const memory::Stats cpu = memory::stats(kCPU);
  (void)memory::estimate([](Device d) { mlp_steps(d, {}); });
  EXPECT_EQ(default_generator().state().offset, before.offset);
  EXPECT_EQ(memory::stats(kCPU).allocated.current, cpu.allocated.current);
}

TEST(Estimate, UnderALimitItFailsWhereTheRealRunWould) {
  const memory::Estimate free_run = memory::estimate([](Device d) { mlp_steps(d, {}); });
  const int64_t limit = free_run.peak_reserved / 2;
  const memory::Estimate e =
      memory::estimate([](Device d) { mlp_steps(d, {}); }, memory::EstimateOptions().limit(limit));
  ASSERT_TRUE(e.out_of_memory);
  EXPECT_FALSE(e.fits());
  EXPECT_NE(e.error.find("out of memory on meta"), std::string::npos) << e.error;
  EXPECT_LE(e.peak_reserved, limit);
  // The real run under the same limit fails too.
  memory::empty_cache(kCPU);
  memory::set_memory_limit(kCPU, memory::stats(kCPU).reserved.current + limit);
  EXPECT_THROW(mlp_steps(kCPU, {}), OutOfMemoryError);
  memory::set_memory_limit(kCPU, 0);
}

TEST(Estimate, MetaTensorsKeptFromAnEarlierRunAreAClearError) {
  Tensor kept;
  (void)memory::estimate([&](Device d) { kept = zeros({1000}, d); });
  testing::expect_error<Error>([] { (void)memory::estimate([](Device) {}); },
                               {"memory::estimate", "meta tensors", "still alive"});
  kept = Tensor();
  EXPECT_NO_THROW((void)memory::estimate([](Device) {}));
  testing::expect_error<Error>([] { (void)memory::estimate(nullptr); }, {"memory::estimate", "empty"});
  testing::expect_error<Error>(
      [] { (void)memory::estimate([](Device) {}, memory::EstimateOptions().from(kMeta)); }, {"real device"});
}

}  // namespace
}  // namespace frugal

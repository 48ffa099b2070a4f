// serve::ModelPool: lazy loading by mapping, outputs equal to the model loaded alone (also after eviction
// and reload), LRU order, a model in use survives pressure, the budget holds under a random concurrent mix,
// variants (bf16, int8), requests no dry run can size measured, inference keeps no activations beyond a
// layer's, and bad files and impossible requests get clear errors.
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "serve/model_pool.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using serve::ModelPool;
using serve::Precision;
using testing::expect_error;

// Linear(in, hidden), then (layers - 1) x [Tanh, Linear(hidden, hidden)], then Tanh, Linear(hidden, out).
nn::Sequential make_mlp(int64_t in, int64_t hidden, int64_t out, int layers = 1) {
  nn::Sequential net;
  net->push_back(nn::Linear(in, hidden));
  for (int i = 1; i < layers; ++i) {
    net->push_back(nn::Tanh());
    net->push_back(nn::Linear(hidden, hidden));
  }
  net->push_back(nn::Tanh());
  net->push_back(nn::Linear(hidden, out));
  return net;
}

std::string bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), size_t(c.nbytes()));
}

class ModelPoolTest : public testing::ScratchDirTest {
 protected:
  // Trains nothing: random weights from a seed, saved; the factory makes the same structure.
  serve::Factory save_mlp(const std::string& file, int64_t in, int64_t hidden, int64_t out, int layers = 1,
                          uint64_t seed = 1) {
    manual_seed(seed);
    nn::Sequential m = make_mlp(in, hidden, out, layers);
    io::save_safetensors(path(file), m->state_dict());
    return [=] { return make_mlp(in, hidden, out, layers).ptr(); };
  }
  // The model loaded the usual way, run the usual way.
  Tensor reference(const serve::Factory& factory, const std::string& file, const Tensor& x) {
    std::shared_ptr<nn::Module> m = factory();
    m->load_state_dict(io::load_safetensors(path(file)).tensors);
    m->eval();
    InferenceMode im;
    return m->forward(x);
  }
  int64_t file_bytes(const std::string& file) { return int64_t(std::filesystem::file_size(path(file))); }
};

TEST_F(ModelPoolTest, LoadsLazilyByMappingAndAnswersAsTheModelLoadedAlone) {
  const auto f = save_mlp("a.safetensors", 32, 64, 10);
  const Tensor x = testing::uniform({8, 32}, -1, 1);
  const Tensor expected = reference(f, "a.safetensors", x);

  ModelPool pool(kCPU, 1 << 20);
  const memory::Stats before = memory::stats(kCPU);
  pool.add("a", f, path("a.safetensors"));
  EXPECT_EQ(memory::stats(kCPU).mapped.current, before.mapped.current);  // registered, not loaded
  EXPECT_TRUE(pool.loaded().empty());

  Tensor y = pool.run("a", x);
  EXPECT_EQ(bytes_of(y), bytes_of(expected));
  y = Tensor();
  EXPECT_EQ(memory::stats(kCPU).mapped.current, before.mapped.current + file_bytes("a.safetensors"));
  int64_t weights_tag = -1;
  for (const auto& t : memory::tag_stats(kCPU))
    if (t.tag == "model/a/weights") weights_tag = t.mapped.current;
  EXPECT_EQ(weights_tag, file_bytes("a.safetensors"));

  EXPECT_EQ(bytes_of(pool.run("a", x)), bytes_of(expected));
  const serve::ModelStats s = pool.stats("a");
  EXPECT_EQ(s.requests, 2);
  EXPECT_EQ(s.loads, 1);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.weight_bytes, file_bytes("a.safetensors"));
  EXPECT_EQ(s.evictions, 0);
  ASSERT_EQ(s.latency_ms.size(), 2u);
  EXPECT_GT(s.latency_percentile_ms(50), 0);

  // The output holds its block (8 x 10 f32: one 512-byte block) in the budget until its last view goes.
  Tensor out = pool.run("a", x);
  const Tensor view = out.narrow(0, 2, 3);
  EXPECT_EQ(pool.committed(), file_bytes("a.safetensors") + 512);
  out = Tensor();
  EXPECT_EQ(pool.committed(), file_bytes("a.safetensors") + 512);
  EXPECT_EQ(bytes_of(view), bytes_of(expected.narrow(0, 2, 3)));
  EXPECT_TRUE(view.is_writable());  // an output is the caller's to change
  { const Tensor gone = view; }
  EXPECT_LE(pool.peak_committed(), pool.budget());
  memory::allocator(kCPU).check_invariants();
}

TEST_F(ModelPoolTest, EvictsTheLeastRecentlyUsedIdleModelAndReloadsBitIdentically) {
  const auto fa = save_mlp("a.safetensors", 64, 128, 10, 1, 1);
  const auto fb = save_mlp("b.safetensors", 64, 128, 10, 1, 2);
  const auto fc = save_mlp("c.safetensors", 64, 128, 10, 1, 3);
  const Tensor x = testing::uniform({4, 64}, -1, 1);
  const int64_t w = file_bytes("a.safetensors");
  ASSERT_EQ(w, file_bytes("b.safetensors"));

  {
    ModelPool probe(kCPU, 1 << 30);
    probe.add("a", fa, path("a.safetensors"));
    ASSERT_GT(probe.request_bytes("a", x), 0);
  }
  ModelPool sizing(kCPU, 1 << 30);
  sizing.add("a", fa, path("a.safetensors"));
  const int64_t r = sizing.request_bytes("a", x);
  // Room for two models' weights and one request, not three.
  ModelPool pool(kCPU, 2 * w + r + 2048);
  pool.add("a", fa, path("a.safetensors"));
  pool.add("b", fb, path("b.safetensors"));
  pool.add("c", fc, path("c.safetensors"));
  const std::string ya = bytes_of(pool.run("a", x));
  pool.run("b", x);
  pool.run("a", x);  // a is now the most recently used
  pool.run("c", x);  // evicts b
  auto names = [&] {
    std::vector<std::string> out;
    for (auto& [n, p] : pool.loaded()) out.push_back(n);
    return out;
  };
  EXPECT_EQ(names(), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(pool.stats("b").evictions, 1);
  pool.run("b", x);  // evicts a
  EXPECT_EQ(names(), (std::vector<std::string>{"c", "b"}));
  EXPECT_EQ(bytes_of(pool.run("a", x)), ya);  // reloaded from the file: the same bytes out
  EXPECT_EQ(pool.stats("a").loads, 2);
  EXPECT_EQ(bytes_of(pool.run("a", x)), bytes_of(reference(fa, "a.safetensors", x)));
  EXPECT_LE(pool.peak_committed(), pool.budget());

  pool.evict_idle();
  EXPECT_TRUE(pool.loaded().empty());
  EXPECT_EQ(pool.committed(), 0);
}

// A module whose forward waits at a gate, to hold a request in flight.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, open = false;
};
Gate* g_gate = nullptr;

struct GatedImpl : nn::Module {
  nn::Linear fc{nullptr};
  GatedImpl() { fc = register_module("fc", nn::Linear(64, 64)); }
  Tensor forward(const Tensor& x) override {
    if (Gate* g = g_gate; g && !x.device().is_meta()) {  // the dry run that sizes it passes
      std::unique_lock lock(g->mu);
      g->entered = true;
      g->cv.notify_all();
      g->cv.wait(lock, [&] { return g->open; });
    }
    return fc(x);
  }
};
FRUGAL_MODULE(Gated);

TEST_F(ModelPoolTest, AModelInUseIsNeverEvicted) {
  {
    manual_seed(5);
    Gated g;
    io::save_safetensors(path("g.safetensors"), g->state_dict());
  }
  const auto fb = save_mlp("b.safetensors", 64, 64, 64, 1, 2);
  const auto fc = save_mlp("c.safetensors", 64, 64, 64, 1, 3);
  const Tensor x = testing::uniform({4, 64}, -1, 1);
  ModelPool sizing(kCPU, 1 << 30);
  sizing.add("b", fb, path("b.safetensors"));
  const int64_t r = sizing.request_bytes("b", x);
  const int64_t wg = file_bytes("g.safetensors"), wb = file_bytes("b.safetensors");
  // g running, and one of b or c beside it with a request: not both.
  ModelPool pool(kCPU, wg + wb + 2 * r + wb / 2);
  pool.add(
      "g", [] { return Gated().ptr(); }, path("g.safetensors"));
  pool.add("b", fb, path("b.safetensors"));
  pool.add("c", fc, path("c.safetensors"));

  Gate gate;
  g_gate = &gate;
  std::string gated;
  std::thread t([&] { gated = bytes_of(pool.run("g", x)); });
  {
    std::unique_lock lock(gate.mu);
    gate.cv.wait(lock, [&] { return gate.entered; });
  }
  pool.run("b", x);
  pool.run("c", x);  // must evict b, the idle one, never g
  pool.run("b", x);
  EXPECT_EQ(pool.stats("g").evictions, 0);
  EXPECT_GE(pool.stats("b").evictions, 1);
  {
    std::lock_guard lock(gate.mu);
    gate.open = true;
  }
  gate.cv.notify_all();
  t.join();
  g_gate = nullptr;
  EXPECT_EQ(gated, bytes_of(reference([] { return Gated().ptr(); }, "g.safetensors", x)));
  EXPECT_LE(pool.peak_committed(), pool.budget());
}

TEST_F(ModelPoolTest, TheBudgetHoldsUnderARandomConcurrentMix) {
  struct Model {
    std::string name;
    serve::Factory factory;
    std::vector<Tensor> inputs;
    std::vector<std::string> expected;
  };
  std::vector<Model> models;
  const int64_t sizes[][3] = {{784, 128, 10}, {256, 256, 32}, {128, 320, 64}};
  int64_t sum = 0;
  for (int i = 0; i < 3; ++i) {
    Model m;
    m.name = "m" + std::to_string(i);
    m.factory = save_mlp(m.name + ".safetensors", sizes[i][0], sizes[i][1], sizes[i][2], 2, 10 + i);
    for (int64_t batch : {1, 7, 32}) {
      m.inputs.push_back(testing::uniform({batch, sizes[i][0]}, -1, 1, DType::F32, 100 + batch));
      m.expected.push_back(bytes_of(reference(m.factory, m.name + ".safetensors", m.inputs.back())));
    }
    sum += file_bytes(m.name + ".safetensors");
    models.push_back(std::move(m));
  }
  // Room for the largest model with its largest request, and a little: well under all three together.
  int64_t largest = 0, requests_sum = 0;
  {
    ModelPool sizing(kCPU, int64_t(1) << 40);
    for (const Model& m : models) {
      sizing.add(m.name, m.factory, path(m.name + ".safetensors"));
      const int64_t r = sizing.request_bytes(m.name, m.inputs.back());
      largest = std::max(largest, file_bytes(m.name + ".safetensors") + r);
      requests_sum += r;
    }
  }
  ModelPool pool(kCPU, largest + (64 << 10));
  ASSERT_LT(pool.budget(), sum);
  for (const Model& m : models) pool.add(m.name, m.factory, path(m.name + ".safetensors"));

  // Everything the threads read exists already: what the device holds beyond it is the pool's.
  memory::reset_peak(kCPU);
  const int64_t baseline = memory::stats(kCPU).footprint.current;
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(uint32_t(t + 1));
      for (int i = 0; i < 40; ++i) {
        const Model& m = models[rng() % 3];
        const size_t k = rng() % m.inputs.size();
        const Tensor y = pool.run(m.name, m.inputs[k]);
        if (bytes_of(y) != m.expected[k]) ++mismatches;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
  const memory::Stats s = memory::stats(kCPU);
  EXPECT_LE(s.footprint.peak - baseline, pool.budget());
  EXPECT_LE(pool.peak_committed(), pool.budget());
  int64_t requests = 0, evictions = 0;
  for (const Model& m : models) {
    requests += pool.stats(m.name).requests;
    evictions += pool.stats(m.name).evictions;
  }
  EXPECT_EQ(requests, 160);
  EXPECT_GT(evictions, 0);  // the three do not fit together: the mix must evict
  (void)requests_sum;
  memory::allocator(kCPU).check_invariants();
}

TEST_F(ModelPoolTest, InferenceKeepsNoActivationsBeyondALayersAndTheDryRunIsExact) {
  const auto shallow = save_mlp("s.safetensors", 256, 256, 256, 1);
  const auto deep = save_mlp("d.safetensors", 256, 256, 256, 8);
  const Tensor x = testing::uniform({64, 256}, -1, 1);
  ModelPool pool(kCPU, 64 << 20);
  pool.add("s", shallow, path("s.safetensors"));
  pool.add("d", deep, path("d.safetensors"));
  pool.run("s", x);
  pool.run("d", x);  // both loaded: the runs below allocate only their activations
  for (const char* name : {"s", "d"}) {
    SCOPED_TRACE(name);
    memory::reset_peak(kCPU);
    const int64_t before = memory::stats(kCPU).allocated.current;
    pool.run(name, x);
    EXPECT_EQ(memory::stats(kCPU).allocated.peak - before, pool.request_bytes(name, x));
  }
  // Eight layers hold no more at once than one: each activation is freed once the next is made.
  EXPECT_EQ(pool.request_bytes("d", x), pool.request_bytes("s", x));
  // With the tape on, the same forwards keep every layer's output: seven more layers keep at least seven
  // more [64, 256] f32 activations (64 KiB each).
  auto taped_peak = [&](const serve::Factory& f) {
    const std::shared_ptr<nn::Module> m = f();
    memory::reset_peak(kCPU);
    const int64_t before = memory::stats(kCPU).allocated.current;
    const Tensor y = m->forward(x);
    return memory::stats(kCPU).allocated.peak - before;
  };
  EXPECT_GE(taped_peak(deep) - taped_peak(shallow), 7 * 64 * 256 * 4);
}

// A forward that reads a value (its input's largest magnitude): no dry run can size it.
struct DataDependentImpl : nn::Module {
  nn::Linear fc{nullptr};
  DataDependentImpl() { fc = register_module("fc", nn::Linear(128, 16)); }
  Tensor forward(const Tensor& x) override {
    const float largest = x.abs().max().item<float>();
    return fc(x * (1.0 / double(largest)));
  }
};
FRUGAL_MODULE(DataDependent);

TEST_F(ModelPoolTest, VariantsServeSmallerUnderPressureAndRequestsNoDryRunSizesAreMeasured) {
  manual_seed(3);
  nn::Sequential f32 = make_mlp(128, 256, 16);
  io::save_safetensors(path("f32.safetensors"), f32->state_dict());
  f32->to(DType::BF16);
  io::save_safetensors(path("bf16.safetensors"), f32->state_dict());
  manual_seed(3);
  nn::Sequential q = make_mlp(128, 256, 16);
  nn::quant::quantize_dynamic(*q);
  io::save_safetensors(path("int8.safetensors"), q->state_dict(), {}, nn::quant::int8_names(*q));
  auto f32_factory = [] { return make_mlp(128, 256, 16).ptr(); };
  auto bf16_factory = [] {
    nn::Sequential m = make_mlp(128, 256, 16);
    m->to(DType::BF16);
    return m.ptr();
  };
  auto int8_factory = [] {
    nn::Sequential m;
    m->push_back(nn::QuantizedLinear(128, 256));
    m->push_back(nn::Tanh());
    m->push_back(nn::QuantizedLinear(256, 16));
    return m.ptr();
  };
  const Tensor x = testing::uniform({16, 128}, -1, 1);

  // Each variant alone answers as its model loaded the usual way.
  Tensor bf16_reference;
  {
    std::shared_ptr<nn::Module> b = bf16_factory();
    b->load_state_dict(io::load_safetensors(path("bf16.safetensors")).tensors);
    InferenceMode im;
    bf16_reference = b->forward(x.to(DType::BF16)).to(DType::F32);
  }
  {
    ModelPool pool(kCPU, 8 << 20);
    pool.add("bf16", {{Precision::BF16, bf16_factory, path("bf16.safetensors")}});
    pool.add("int8", {{Precision::Int8, int8_factory, path("int8.safetensors")}});
    InferenceMode im;
    EXPECT_EQ(bytes_of(pool.run("bf16", x)), bytes_of(bf16_reference));
    // The int8 layers' dry run (QuantizedLinear's meta path) sizes the request to the byte.
    const int64_t sized = pool.request_bytes("int8", x);
    EXPECT_GT(sized, 0);
    const std::string q_reference = bytes_of(q->forward(x));
    memory::reset_peak(kCPU);
    const int64_t before = memory::stats(kCPU).allocated.current;
    EXPECT_EQ(bytes_of(pool.run("int8", x)), q_reference);  // loads the variant, then runs it
    EXPECT_EQ(memory::stats(kCPU).allocated.peak - before, sized);
  }
  {
    // An int8 CNN (its QuantizedConv2d's meta path, the codes between the blocks included) is sized so too.
    manual_seed(5);
    const nn::quant::InputQuant fixed{0.03f, 4};
    nn::Conv2d c1(nn::Conv2dOptions(1, 8, 3).padding(1)), c2(nn::Conv2dOptions(8, 16, 3).padding(1));
    nn::Linear fc(16 * 7 * 7, 10);
    nn::Sequential cnn{c1,
                       nn::ReLU(),
                       nn::MaxPool2d(2),
                       nn::QuantizedConv2d(c2->options(), c2->weight, c2->bias, &fixed),
                       nn::ReLU(),
                       nn::MaxPool2d(2),
                       nn::Flatten(),
                       nn::QuantizedLinear(fc->weight, fc->bias, 0.02f, 3)};
    io::save_safetensors(path("cnn8.safetensors"), cnn->state_dict(), {}, nn::quant::int8_names(*cnn));
    auto cnn_factory = [] {
      return nn::Sequential{nn::Conv2d(nn::Conv2dOptions(1, 8, 3).padding(1)),
                            nn::ReLU(),
                            nn::MaxPool2d(2),
                            nn::QuantizedConv2d(nn::Conv2dOptions(8, 16, 3).padding(1), true),
                            nn::ReLU(),
                            nn::MaxPool2d(2),
                            nn::Flatten(),
                            nn::QuantizedLinear(16 * 7 * 7, 10, true, true)}
          .ptr();
    };
    const Tensor images = testing::uniform({6, 1, 28, 28}, -1, 1);
    ModelPool pool(kCPU, 8 << 20);
    pool.add("cnn8", {{Precision::Int8, cnn_factory, path("cnn8.safetensors")}});
    InferenceMode im;
    const int64_t sized = pool.request_bytes("cnn8", images);
    EXPECT_GT(sized, 0);
    const std::string reference = bytes_of(cnn->forward(images));
    memory::reset_peak(kCPU);
    const int64_t before = memory::stats(kCPU).allocated.current;
    EXPECT_EQ(bytes_of(pool.run("cnn8", images)), reference);
    EXPECT_EQ(memory::stats(kCPU).allocated.peak - before, sized);
  }
  {
    // A forward that reads a value cannot run on the meta device: its first request is measured, alone.
    manual_seed(4);
    DataDependent d;
    io::save_safetensors(path("dd.safetensors"), d->state_dict());
    const Tensor expected = reference([] { return DataDependent().ptr(); }, "dd.safetensors", x);
    ModelPool pool(kCPU, 8 << 20);
    pool.add(
        "dd", [] { return DataDependent().ptr(); }, path("dd.safetensors"));
    EXPECT_EQ(pool.request_bytes("dd", x), -1);
    EXPECT_EQ(bytes_of(pool.run("dd", x)), bytes_of(expected));
    const int64_t measured = pool.request_bytes("dd", x);
    EXPECT_GT(measured, 0);
    memory::reset_peak(kCPU);
    const int64_t before = memory::stats(kCPU).allocated.current;
    EXPECT_EQ(bytes_of(pool.run("dd", x)), bytes_of(expected));
    EXPECT_EQ(memory::stats(kCPU).allocated.peak - before, measured);  // what the probe saw is a request
  }

  // Under pressure: room for the f32 weights with a request, or the bf16 ones beside another model.
  const int64_t w32 = file_bytes("f32.safetensors"), w16 = file_bytes("bf16.safetensors");
  ASSERT_LT(w16, w32 * 3 / 5);
  const auto other = save_mlp("o.safetensors", 128, 96, 16, 1, 9);
  ModelPool sizing(kCPU, 1 << 30);
  sizing.add("m", {{Precision::F32, f32_factory, path("f32.safetensors")},
                   {Precision::BF16, bf16_factory, path("bf16.safetensors")}});
  sizing.add("o", other, path("o.safetensors"));
  const int64_t r32 = sizing.request_bytes("m", x), r16 = sizing.request_bytes("m", x, Precision::BF16);
  const int64_t wo = file_bytes("o.safetensors"), ro = sizing.request_bytes("o", x);
  const int64_t budget = std::max({w32 + r32, wo + w16 + r16, wo + ro}) + 1024;
  ASSERT_LT(budget, wo + w32 + r32);  // f32 beside o does not fit
  ModelPool pool(kCPU, budget);
  pool.add("m", {{Precision::F32, f32_factory, path("f32.safetensors")},
                 {Precision::BF16, bf16_factory, path("bf16.safetensors")}});
  pool.add("o", other, path("o.safetensors"));
  pool.run("o", x);
  // The f32 variant would need o evicted; allowed to, the pool serves bf16 beside o instead.
  const Tensor y = pool.run("m", x, serve::RunOptions().allow_smaller(true));
  EXPECT_EQ(bytes_of(y), bytes_of(bf16_reference));
  EXPECT_EQ(pool.stats("m").smaller, 1);
  EXPECT_EQ(pool.stats("o").evictions, 0);
  // Not allowed to: the least recently used idle variants go (o, then the bf16 one), f32 serves.
  EXPECT_EQ(bytes_of(pool.run("m", x)), bytes_of(reference(f32_factory, "f32.safetensors", x)));
  EXPECT_EQ(pool.stats("o").evictions, 1);
  EXPECT_LE(pool.peak_committed(), pool.budget());
}

TEST_F(ModelPoolTest, BadFilesAndImpossibleRequestsGetClearErrors) {
  const auto f = save_mlp("a.safetensors", 32, 64, 10);
  const Tensor x = testing::uniform({8, 32}, -1, 1);
  ModelPool pool(kCPU, 1 << 20);
  // A corrupt file is refused when it is added.
  std::ofstream(path("bad.safetensors"), std::ios::binary) << "not a safetensors file";
  expect_error<Error>([&] { pool.add("bad", f, path("bad.safetensors")); }, {"bad.safetensors"});
  expect_error<Error>([&] { pool.add("missing", f, path("missing.safetensors")); }, {"cannot open"});
  // A file of another model fails its first load, and the pool holds nothing afterwards.
  save_mlp("other.safetensors", 32, 48, 10);
  pool.add("wrong", f, path("other.safetensors"));
  expect_error<Error>([&] { pool.run("wrong", x); }, {"does not fit model 'wrong'", "0.weight", "differs"});
  EXPECT_EQ(pool.committed(), 0);
  EXPECT_TRUE(pool.loaded().empty());
  expect_error<Error>([&] { pool.run("nobody", x); }, {"no model named 'nobody'", "wrong"});
  pool.add("a", f, path("a.safetensors"));
  expect_error<Error>([&] { pool.add("a", f, path("a.safetensors")); }, {"registered already"});
  // A bad input is the model's error, and releases what the request held.
  expect_error<Error>([&] { pool.run("a", testing::uniform({8, 31}, -1, 1)); }, {"31"});
  EXPECT_EQ(pool.committed(), pool.stats("a").weight_bytes);
  // A model that cannot fit even alone.
  ModelPool tiny(kCPU, 4096);
  tiny.add("a", f, path("a.safetensors"));
  expect_error<OutOfMemoryError>([&] { tiny.run("a", x); }, {"model 'a'", "budget"});
  EXPECT_EQ(tiny.committed(), 0);
  expect_error<Error>([&] { ModelPool(kCPU, 0); }, {"budget"});
}

}  // namespace
}  // namespace frugal

// serve::ModelPool (serve/model_pool.h): admission against the budget, loading by mapping, eviction of the
// least recently used idle variant.
#include "serve/model_pool.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>

#include "autograd/graph.h"
#include "core/allocator_base.h"
#include "core/estimate.h"
#include "core/memory.h"
#include "io/safetensors.h"

namespace frugal::serve {

// Note [the pool's budget]
// The pool counts what it holds in `committed` and admits a load or a request only while that stays within
// the budget:
// - a variant's weights, from when its load starts until it is evicted: on the cpu the bytes of its mapped
//   file (what Stats::mapped counts, Note [mapped bytes] in core/memory.h); elsewhere the blocks its tensors
//   take there, as a dry run of its structure counts them;
// - a request, from its admission until its forward returns: the most its forward's blocks hold at once
//   (Note [sizing a request]);
// - an output handed out, until the last tensor viewing it is released: its block.
// So what the pool holds never exceeds `committed`, and the device's footprint (allocated + mapped) stays
// within the budget plus what the program holds itself (its inputs, say). The arena may cache freed blocks
// beyond that (Stats::reserved): a program that must bound those too sets a memory limit with some room above
// the budget, or calls memory::empty_cache.

// Note [sizing a request]
// A request's bytes come from a dry run of the same forward on the meta device (memory::estimate): the
// structure the factory makes, an input of the request's shape and dtype, the same casts. The meta device
// follows the cpu's allocations, so the dry run's blocks are the real forward's, in the same order; the most
// they hold at once, past the structure and the input, is the request's figure, with one margin: each block
// above kSmallRequest counts kLargeSplitRemainder more (core/allocator_base.h), because the real arena may
// hand such a request a cached block up to that much larger where the dry run's fresh arena splits one to
// size. It is computed once per variant and input signature. The int8 layers (QuantizedLinear,
// QuantizedConv2d with the codes between blocks, QuantizedEmbedding) have meta paths, so int8 variants are
// sized so too. A structure whose forward cannot run on the meta device (one that reads a value) is measured
// instead: its first request of a signature runs alone, with every idle variant evicted and the whole free
// budget reserved, under a memory::AllocationProbe, and what the probe saw sizes the later ones.

// Note [choosing a variant]
// A request goes to the model's first variant (the one to serve first) when that variant is loaded or can
// be loaded without evicting anything, and it fits. With RunOptions::allow_smaller, a variant that is loaded
// already and fits is taken first (in the order given: no load, and no second copy of the model's weights),
// then one that can be loaded without evicting anything, before anything is evicted for the first. Otherwise
// the least recently used idle variants (of any model) are evicted until the first variant fits, and if it
// still does not, the request waits for the requests in flight to finish. A variant that cannot fit even
// alone (its weights and the request above the budget) is an OutOfMemoryError, unless allow_smaller names a
// later one that can.

namespace {

using Clock = std::chrono::steady_clock;
enum class Status { Unloaded, Loading, Loaded };
constexpr int64_t kUnsized = -1;  // a signature whose request bytes must be measured

std::string signature(const Tensor& x) {
  std::string s = dtype_name(x.dtype());
  for (int64_t d : x.shape()) {
    s += ' ';
    s += std::to_string(d);
  }
  s += ' ';
  s += x.device().str();
  return s;
}

// The request's computation, the same in the dry run (on `device` = meta) and for real.
Tensor forward_as(nn::Module& model, const Tensor& x, Precision precision, Device device) {
  InferenceMode inference;
  Tensor in = x.device() == device ? x : x.to(device);
  if (precision == Precision::BF16 && is_floating(in.dtype()) && in.dtype() != DType::BF16)
    in = in.to(DType::BF16);
  Tensor y = model.forward(in);
  if (precision == Precision::BF16 && y.defined() && y.dtype() == DType::BF16) y = y.to(DType::F32);
  return y;
}

}  // namespace

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::F32:
      return "f32";
    case Precision::BF16:
      return "bf16";
    case Precision::Int8:
      return "int8";
  }
  return "?";
}

double ModelStats::latency_percentile_ms(double p) const {
  if (latency_ms.empty()) return 0;
  std::vector<double> sorted = latency_ms;
  std::sort(sorted.begin(), sorted.end());
  const double rank = std::ceil(std::clamp(p, 0.0, 100.0) / 100.0 * double(sorted.size()));
  return sorted[size_t(std::clamp<double>(rank, 1, double(sorted.size()))) - 1];
}

struct VariantState {
  Variant spec;
  int64_t weight_bytes = 0;
  Status status = Status::Unloaded;
  std::shared_ptr<nn::Module> module;  // while loaded
  int in_use = 0;                      // requests admitted to it and not yet done
  uint64_t last_used = 0;
  std::map<std::string, int64_t> request_bytes;  // by signature: bytes, or kUnsized
};

struct ModelState {
  std::string name;
  std::vector<VariantState> variants;
  ModelStats stats;
  uint32_t weights_tag = 0, activations_tag = 0;
};

struct ModelPool::State {
  Device device;
  int64_t budget = 0;
  mutable std::mutex mu;
  std::condition_variable changed;  // committed fell, a load ended or a request finished
  std::vector<std::unique_ptr<ModelState>> models;
  int64_t committed = 0, peak = 0;
  uint64_t clock = 0;
  int in_flight = 0;  // requests admitted and not yet done

  ModelState& find_locked(const std::string& name) const {
    for (const auto& m : models)
      if (m->name == name) return *m;
    std::string known;
    for (const auto& m : models) known += (known.empty() ? "" : ", ") + m->name;
    throw Error(frugal::detail::str_cat("ModelPool: no model named '", name,
                                        "'; registered: ", known.empty() ? "none" : known));
  }
  void commit_locked(int64_t bytes) {
    committed += bytes;
    peak = std::max(peak, committed);
  }
  void release(int64_t bytes) {
    {
      std::lock_guard lock(mu);
      committed -= bytes;
    }
    changed.notify_all();
  }
  // Evicts the least recently used idle variant other than `keep`; false when there is none.
  bool evict_one_locked(const VariantState* keep) {
    VariantState* victim = nullptr;
    ModelState* owner = nullptr;
    for (auto& m : models)
      for (VariantState& v : m->variants)
        if (&v != keep && v.status == Status::Loaded && v.in_use == 0 &&
            (!victim || v.last_used < victim->last_used)) {
          victim = &v;
          owner = m.get();
        }
    if (!victim) return false;
    victim->module.reset();  // the views go, and with the last one the mapping (Note [mapped bytes])
    victim->status = Status::Unloaded;
    committed -= victim->weight_bytes;
    ++owner->stats.evictions;
    return true;
  }
};

namespace {

// The structure on the meta device, inside a dry run: one dry run at a time holds the process's meta
// device (core/estimate.h), and a structure being built holds meta tensors too.
int64_t structure_bytes(const Variant& v) {
  int64_t bytes = 0;
  memory::estimate([&](Device d) {
    const std::shared_ptr<nn::Module> m = v.factory();
    FRUGAL_CHECK(m != nullptr, "ModelPool: the factory of '", v.weights_path, "' returned no module");
    bytes = memory::stats(d).allocated.current;
  });
  return bytes;
}

// Note [sizing a request]: the dry run's figure, or kUnsized when the forward cannot run on the meta device.
int64_t dry_run_request(const Variant& v, const Tensor& input, Device device) {
  size_t first_event = 0;
  memory::Estimate e;
  try {
    e = memory::estimate([&](Device d) {
      const std::shared_ptr<nn::Module> m = v.factory();
      m->eval();
      Tensor x = empty(input.shape(), TensorOptions(input.dtype()).device(d));
      first_event = memory::history(d).events.size();  // the request starts here
      // An input from another device is copied before the forward: its block is the request's.
      if (input.device() != device) x = empty(input.shape(), TensorOptions(input.dtype()).device(d));
      forward_as(*m, x, v.precision, d);
    });
  } catch (const Error&) {
    return kUnsized;  // the real request will say what is wrong, if anything is
  }
  FRUGAL_CHECK(!e.timeline.truncated, "ModelPool: the dry run of a request of ", input.shape(),
               " recorded more events than a history holds");
  int64_t live = 0, large = 0, most = 0;
  for (size_t i = first_event; i < e.timeline.events.size(); ++i) {
    const memory::HistoryEvent& ev = e.timeline.events[i];
    const int sign = ev.kind == memory::EventKind::Alloc ? 1 : ev.kind == memory::EventKind::Free ? -1 : 0;
    live += sign * ev.size;
    if (ev.size > memory::detail::kSmallRequest) large += sign;
    most = std::max(most, live + large * memory::detail::kLargeSplitRemainder);
  }
  return most;
}

// Maps the variant's file and points the structure's tensors at it (on the cpu; copies them elsewhere).
std::shared_ptr<nn::Module> load_variant(const ModelState& m, const Variant& v, Device device) {
  std::shared_ptr<nn::Module> model;
  memory::estimate([&](Device) {
    model = v.factory();
    model->eval();
    io::SafetensorsFile file;
    {
      memory::Tag tag(m.weights_tag);
      file = io::map_safetensors(v.weights_path);
    }
    memory::Tag tag(m.weights_tag);
    std::vector<std::string> missing, wrong;
    for (auto& [name, t] : model->state_dict()) {
      if (!t.defined()) continue;
      auto it = file.tensors.find(name);
      if (it == file.tensors.end()) {
        missing.push_back(name);
        continue;
      }
      const Tensor& w = it->second;
      if (w.shape() != t.shape() || w.dtype() != t.dtype()) {
        wrong.push_back(frugal::detail::str_cat(name, " (", w.dtype(), " ", w.shape(), " in the file, ",
                                                t.dtype(), " ", t.shape(), " in the model)"));
        continue;
      }
      t.set_data(device.is_cpu() ? w : w.to(device));
    }
    if (!missing.empty() || !wrong.empty()) {
      std::string what;
      for (const auto& n : missing) what += "\n  missing from the file: " + n;
      for (const auto& n : wrong) what += "\n  differs: " + n;
      throw Error(frugal::detail::str_cat("ModelPool: '", v.weights_path, "' does not fit model '", m.name,
                                          "' (", precision_name(v.precision), "):", what));
    }
    // Inside the dry run: this one's meta arena, which no other thread touches until it ends.
    FRUGAL_CHECK(memory::stats(kMeta).allocated.current == 0, "ModelPool: model '", m.name,
                 "' holds meta tensors its state_dict does not list; a served structure keeps every tensor "
                 "as a parameter or buffer");
  });
  return model;
}

}  // namespace

ModelPool::ModelPool(Device device, int64_t budget) : state_(std::make_shared<State>()) {
  FRUGAL_CHECK(!device.is_meta(), "ModelPool: serves on a real device, not ", device);
  FRUGAL_CHECK(budget > 0, "ModelPool: the budget must be positive, got ", budget);
  state_->device = device;
  state_->budget = budget;
}

ModelPool::~ModelPool() {
  std::lock_guard lock(state_->mu);
  for (auto& m : state_->models)
    for (VariantState& v : m->variants) v.module.reset();
}

void ModelPool::add(const std::string& name, Factory factory, const std::string& weights_path) {
  add(name, {Variant{Precision::F32, std::move(factory), weights_path}});
}

void ModelPool::add(const std::string& name, std::vector<Variant> variants) {
  FRUGAL_CHECK(
      !name.empty() && name.find('/') == std::string::npos,
      "ModelPool::add: a model's name must be non-empty and hold no '/' (it names memory tags), got '", name,
      "'");
  FRUGAL_CHECK(!variants.empty(), "ModelPool::add('", name, "'): no variant given");
  auto m = std::make_unique<ModelState>();
  m->name = name;
  for (Variant& v : variants) {
    FRUGAL_CHECK(v.factory != nullptr, "ModelPool::add('", name, "'): the ", precision_name(v.precision),
                 " variant has no factory");
    VariantState s;
    io::load_safetensors_metadata(v.weights_path);  // the header, checked against the file's length
    s.weight_bytes =
        state_->device.is_cpu() ? int64_t(std::filesystem::file_size(v.weights_path)) : structure_bytes(v);
    s.spec = std::move(v);
    m->variants.push_back(std::move(s));
  }
  m->weights_tag = memory::intern_tag("model/" + name + "/weights");
  m->activations_tag = memory::intern_tag("model/" + name + "/activations");
  std::lock_guard lock(state_->mu);
  for (const auto& other : state_->models)
    FRUGAL_CHECK(other->name != name, "ModelPool::add: a model named '", name, "' is registered already");
  state_->models.push_back(std::move(m));
}

namespace {

// What admission gave a request (Done, in run, gives it back however the request ends).
struct Admitted {
  ModelPool::State* state = nullptr;
  ModelState* model = nullptr;
  VariantState* variant = nullptr;
  int64_t reserved = 0;  // bytes of the request (weights are the variant's)
  bool measure = false;  // Note [sizing a request]: runs alone, under a probe
  bool load = false;     // this request loads the variant
};

}  // namespace

Tensor ModelPool::run(const std::string& name, const Tensor& input, const RunOptions& options) {
  const Clock::time_point start = Clock::now();
  FRUGAL_CHECK(input.defined(), "ModelPool::run('", name, "'): the input is undefined");
  State& s = *state_;
  const std::string sig = signature(input);

  // Sizes every variant the request may use (the dry runs happen outside the pool's lock).
  ModelState* model = nullptr;
  {
    std::vector<std::pair<size_t, Variant>> unsized;
    {
      std::lock_guard lock(s.mu);
      model = &s.find_locked(name);
      for (size_t i = 0; i < model->variants.size(); ++i)
        if ((i == 0 || options.allow_smaller()) && !model->variants[i].request_bytes.count(sig))
          unsized.emplace_back(i, model->variants[i].spec);
    }
    for (auto& [i, v] : unsized) {
      const int64_t bytes = dry_run_request(v, input, s.device);
      std::lock_guard lock(s.mu);
      model->variants[i].request_bytes.emplace(sig, bytes);
    }
  }

  Admitted a;
  a.state = &s;
  a.model = model;
  {
    std::unique_lock lock(s.mu);
    for (;;) {
      const size_t candidates = options.allow_smaller() ? model->variants.size() : 1;
      auto request_of = [&](const VariantState& v) { return v.request_bytes.at(sig); };
      auto weights_needed = [&](const VariantState& v) {
        return v.status == Status::Unloaded ? v.weight_bytes : 0;
      };
      // What a variant needs now: its weights if not loaded, and the request (the whole free budget when it
      // must be measured, which also waits for every other request to finish).
      auto fits_now = [&](const VariantState& v) {
        if (request_of(v) == kUnsized)
          return s.in_flight == 0 && s.budget - s.committed - weights_needed(v) > 0;
        return s.committed + weights_needed(v) + request_of(v) <= s.budget;
      };
      auto fits_alone = [&](const VariantState& v) {
        return request_of(v) == kUnsized ? v.weight_bytes < s.budget
                                         : v.weight_bytes + request_of(v) <= s.budget;
      };
      // First a variant that fits as things are. One still to measure never does: it runs alone, with every
      // idle variant evicted (below), so that its unknown need meets the most room there can be.
      // With several candidates, one loaded already goes first: no load, and no second copy of the model.
      VariantState* chosen = nullptr;
      for (int pass = candidates > 1 ? 0 : 1; pass < 2 && !chosen; ++pass)
        for (size_t i = 0; i < candidates && !chosen; ++i) {
          VariantState& v = model->variants[i];
          if ((pass == 1 || v.status != Status::Unloaded) && request_of(v) != kUnsized && fits_now(v))
            chosen = &v;
        }
      if (!chosen) {
        // Then the first variant that can fit alone, evicting idle variants least recently used first, as
        // long as evicting can make it fit; else the request waits.
        VariantState* target = nullptr;
        for (size_t i = 0; i < candidates && !target; ++i)
          if (fits_alone(model->variants[i])) target = &model->variants[i];
        if (!target) {
          const VariantState& first = model->variants[0];
          throw OutOfMemoryError(frugal::detail::str_cat(
              "ModelPool: model '", name, "' (", precision_name(first.spec.precision), ") needs ",
              memory::format_bytes(first.weight_bytes), " of weights",
              request_of(first) == kUnsized
                  ? std::string(" and room for its request")
                  : frugal::detail::str_cat(" and ", memory::format_bytes(request_of(first)),
                                            " for a request of ", input.shape()),
              ", more than the pool's whole budget of ", memory::format_bytes(s.budget),
              options.allow_smaller() || model->variants.size() == 1
                  ? std::string()
                  : std::string("; RunOptions().allow_smaller(true) lets a smaller variant serve it")));
        }
        int64_t idle = 0;
        for (auto& m : s.models)
          for (VariantState& v : m->variants)
            if (&v != target && v.status == Status::Loaded && v.in_use == 0) idle += v.weight_bytes;
        if (request_of(*target) == kUnsized) {
          // Measured alone, with all the room there is (Note [sizing a request]).
          if (s.in_flight == 0) {
            while (s.evict_one_locked(target)) {
            }
            if (fits_now(*target)) chosen = target;
          }
        } else if (s.committed - idle + weights_needed(*target) + request_of(*target) <= s.budget) {
          while (!fits_now(*target) && s.evict_one_locked(target)) {
          }
          chosen = target;
        }
      }
      if (chosen) {
        a.variant = chosen;
        a.measure = request_of(*chosen) == kUnsized;
        a.load = chosen->status == Status::Unloaded;
        a.reserved = a.measure ? s.budget - s.committed - weights_needed(*chosen) : request_of(*chosen);
        s.commit_locked(weights_needed(*chosen) + a.reserved);
        if (a.load) chosen->status = Status::Loading;
        ++chosen->in_use;
        ++s.in_flight;
        break;
      }
      s.changed.wait(lock);
    }
  }

  VariantState& v = *a.variant;
  const size_t index = size_t(&v - model->variants.data());
  // Undoes the admission when anything below throws: the reservation, and a load that did not finish.
  struct Done {
    Admitted& a;
    bool ok = false;
    ~Done() {
      State& s = *a.state;
      {
        std::lock_guard lock(s.mu);
        --a.variant->in_use;
        --s.in_flight;
        s.committed -= a.reserved;
        if (!ok && a.variant->status == Status::Loading) {
          a.variant->status = Status::Unloaded;
          a.variant->module.reset();
          s.committed -= a.variant->weight_bytes;
        }
        a.variant->last_used = ++s.clock;
      }
      s.changed.notify_all();
    }
  } done{a};

  std::shared_ptr<nn::Module> module;
  if (a.load) {
    const Clock::time_point load_start = Clock::now();
    std::shared_ptr<nn::Module> loaded = load_variant(*model, v.spec, s.device);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - load_start).count();
    std::lock_guard lock(s.mu);
    v.module = std::move(loaded);
    v.status = Status::Loaded;
    ++model->stats.loads;
    model->stats.load_ms.push_back(ms);
  }
  {
    std::unique_lock lock(s.mu);
    s.changed.wait(lock, [&] { return v.status != Status::Loading; });
    FRUGAL_CHECK(v.status == Status::Loaded, "ModelPool::run('", name, "'): loading its ",
                 precision_name(v.spec.precision), " variant failed in another request");
    module = v.module;
  }
  s.changed.notify_all();  // a load finished: the requests waiting for this variant go on

  Tensor y;
  {
    memory::Tag tag(model->activations_tag);
    memory::AllocationProbe probe;
    y = forward_as(*module, input, v.spec.precision, s.device);
    if (a.measure) {
      std::lock_guard lock(s.mu);
      v.request_bytes[sig] = probe.peak();
    }
  }
  FRUGAL_CHECK(y.defined(), "ModelPool::run('", name, "'): the model's forward returned no tensor");

  // The output keeps its block in the budget until its last view goes (Note [the pool's budget]).
  const int64_t out_bytes = y.storage()->block_bytes();
  struct Release {
    Release(std::shared_ptr<State> s, int64_t b) : state(std::move(s)), bytes(b) {}
    Release(const Release&) = delete;
    Release& operator=(const Release&) = delete;
    ~Release() { state->release(bytes); }
    std::shared_ptr<State> state;
    int64_t bytes;
  };
  {
    // The request's bytes give way to the output's, which they include (it is live when the forward ends).
    std::lock_guard lock(s.mu);
    s.committed -= std::exchange(a.reserved, 0);
    s.commit_locked(out_bytes);
    ModelStats& st = model->stats;
    ++st.requests;
    if (!a.load) ++st.hits;
    if (index != 0) ++st.smaller;
    st.latency_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  auto release = std::make_shared<Release>(state_, out_bytes);
  auto storage = std::make_shared<Storage>(y.storage(), std::move(release));
  done.ok = true;
  return Tensor(storage, y.byte_offset(), y.shape(), y.strides(), y.dtype());
}

ModelStats ModelPool::stats(const std::string& name) const {
  std::lock_guard lock(state_->mu);
  const ModelState& m = state_->find_locked(name);
  ModelStats out = m.stats;
  for (const VariantState& v : m.variants)
    if (v.status == Status::Loaded) out.weight_bytes += v.weight_bytes;
  return out;
}

std::vector<std::string> ModelPool::names() const {
  std::lock_guard lock(state_->mu);
  std::vector<std::string> out;
  for (const auto& m : state_->models) out.push_back(m->name);
  return out;
}

std::vector<std::pair<std::string, Precision>> ModelPool::loaded() const {
  std::lock_guard lock(state_->mu);
  std::vector<std::tuple<uint64_t, std::string, Precision>> all;
  for (const auto& m : state_->models)
    for (const VariantState& v : m->variants)
      if (v.status == Status::Loaded) all.emplace_back(v.last_used, m->name, v.spec.precision);
  std::sort(all.begin(), all.end());
  std::vector<std::pair<std::string, Precision>> out;
  for (auto& [t, n, p] : all) out.emplace_back(n, p);
  return out;
}

int64_t ModelPool::budget() const { return state_->budget; }
Device ModelPool::device() const { return state_->device; }

int64_t ModelPool::committed() const {
  std::lock_guard lock(state_->mu);
  return state_->committed;
}

int64_t ModelPool::peak_committed() const {
  std::lock_guard lock(state_->mu);
  return state_->peak;
}

int64_t ModelPool::request_bytes(const std::string& name, const Tensor& input) const {
  Variant first;
  {
    std::lock_guard lock(state_->mu);
    first = state_->find_locked(name).variants[0].spec;
  }
  return request_bytes(name, input, first.precision);
}

int64_t ModelPool::request_bytes(const std::string& name, const Tensor& input, Precision precision) const {
  Variant spec;
  int64_t known = kUnsized;
  bool found = false, have = false;
  {
    std::lock_guard lock(state_->mu);
    for (const VariantState& v : state_->find_locked(name).variants)
      if (v.spec.precision == precision && !found) {
        found = true;
        spec = v.spec;
        auto it = v.request_bytes.find(signature(input));
        if ((have = it != v.request_bytes.end() && it->second != kUnsized)) known = it->second;
      }
  }
  FRUGAL_CHECK(found, "ModelPool::request_bytes: model '", name, "' has no ", precision_name(precision),
               " variant");
  return have ? known : dry_run_request(spec, input, state_->device);
}

void ModelPool::evict_idle() {
  {
    std::lock_guard lock(state_->mu);
    while (state_->evict_one_locked(nullptr)) {
    }
  }
  state_->changed.notify_all();
}

}  // namespace frugal::serve

// The parts of examples/multi_model.cpp (workloads W1, W2 and W3 served together by serve::ModelPool under
// one budget), shared with its test: each model's variant files, a Zipf request mix, and a run of the mix
// from several threads that checks every output against the same variant loaded alone. Public header only.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <frugal/frugal.h>

namespace multi_model {

using namespace frugal;

// The structure of an f32 Sequential with each Linear an int8 QuantizedLinear of its size (what
// quant::quantize_dynamic makes of it, and the names its file holds), the other children as they are.
inline std::shared_ptr<nn::Module> int8_structure(const nn::Sequential& f32) {
  nn::Sequential q;
  for (const auto& [name, child] : f32->named_children()) {
    if (const auto* linear = dynamic_cast<const nn::LinearImpl*>(child.get()))
      q->push_back(nn::QuantizedLinear(linear->options.in_features(), linear->options.out_features(),
                                       linear->options.bias()));
    else
      q->push_back(child);
  }
  return q.ptr();
}

// One model of the mix: its variants (the first served first), the inputs its requests send, and for each
// variant the bytes of its output for each input when loaded alone.
struct Served {
  std::string name;
  std::vector<serve::Variant> variants;
  std::vector<Tensor> inputs;
  std::vector<std::vector<std::string>> expected;  // [variant][input]
};

inline std::string bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), size_t(c.nbytes()));
}

// Each variant loaded alone the usual way (load_safetensors, load_state_dict), run on every input. It casts
// as the pool does for a bf16 variant, written out here rather than taken from the pool, so that the check
// does not share the code it checks.
inline void compute_expected(Served& s) {
  s.expected.clear();
  for (const serve::Variant& v : s.variants) {
    std::shared_ptr<nn::Module> m = v.factory();
    m->load_state_dict(io::load_safetensors(v.weights_path).tensors);
    m->eval();
    InferenceMode inference;
    std::vector<std::string> outs;
    for (const Tensor& x : s.inputs) {
      Tensor in = v.precision == serve::Precision::BF16 && is_floating(x.dtype()) ? x.to(DType::BF16) : x;
      Tensor y = m->forward(in);
      if (y.dtype() == DType::BF16) y = y.to(DType::F32);
      outs.push_back(bytes_of(y));
    }
    s.expected.push_back(std::move(outs));
  }
}

// `n` model indices in [0, models): model k (0-based) drawn with probability proportional to 1 / (k+1)^s.
inline std::vector<int> zipf_requests(int models, int64_t n, double s, uint64_t seed) {
  std::vector<double> weights;
  for (int k = 0; k < models; ++k) weights.push_back(1.0 / std::pow(double(k + 1), s));
  std::discrete_distribution<int> pick(weights.begin(), weights.end());
  std::mt19937_64 rng(seed);
  std::vector<int> out(size_t(std::max<int64_t>(n, 0)));
  for (int& m : out) m = pick(rng);
  return out;
}

struct MixResult {
  double seconds = 0;
  int64_t peak_bytes = 0;  // the device's footprint peak above what it held before (the pool's bytes)
  int64_t peak_committed = 0;
  int64_t mismatches = 0;
  int64_t errors = 0;       // requests that threw (an OutOfMemoryError when a model cannot fit at all)
  std::string first_error;  // the first one's message
  int64_t requests = 0, evictions = 0, loads = 0;
  int64_t smaller = 0;  // answered by a smaller variant (allow_smaller)
  std::map<std::string, serve::ModelStats> stats;
};

// Serves `requests` (indices into `models`, each with a random one of its inputs) from `threads` threads
// through one pool of `budget` bytes, comparing every output with the variant's output loaded alone.
inline MixResult serve_mix(const std::vector<Served>& models, int64_t budget,
                           const std::vector<int>& requests, int threads, bool allow_smaller, uint64_t seed) {
  serve::ModelPool pool(kCPU, budget);
  for (const Served& s : models) pool.add(s.name, s.variants);
  std::vector<size_t> which(requests.size());
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < requests.size(); ++i) which[i] = rng() % models[size_t(requests[i])].inputs.size();

  memory::reset_peak(kCPU);
  const int64_t baseline = memory::stats(kCPU).footprint.current;
  std::atomic<size_t> next{0};
  std::atomic<int64_t> mismatches{0};
  std::mutex error_mu;
  int64_t errors = 0;
  std::string first_error;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool_threads;
  for (int t = 0; t < threads; ++t)
    pool_threads.emplace_back([&] {
      for (size_t i = next++; i < requests.size(); i = next++) {
        const Served& s = models[size_t(requests[i])];
        try {
          const Tensor y =
              pool.run(s.name, s.inputs[which[i]], serve::RunOptions().allow_smaller(allow_smaller));
          // Any of the variants may have answered: the output must be one of theirs, bit for bit.
          bool same = false;
          for (const auto& outs : s.expected) same = same || bytes_of(y) == outs[which[i]];
          if (!same) ++mismatches;
        } catch (const std::exception& e) {
          std::lock_guard lock(error_mu);
          if (errors++ == 0) first_error = e.what();
        }
      }
    });
  for (auto& t : pool_threads) t.join();
  MixResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.peak_bytes = memory::stats(kCPU).footprint.peak - baseline;
  r.peak_committed = pool.peak_committed();
  r.mismatches = mismatches.load();
  r.errors = errors;
  r.first_error = first_error;
  for (const Served& s : models) {
    const serve::ModelStats st = pool.stats(s.name);
    r.requests += st.requests;
    r.evictions += st.evictions;
    r.loads += st.loads;
    r.smaller += st.smaller;
    r.stats[s.name] = st;
  }
  return r;
}

}  // namespace multi_model

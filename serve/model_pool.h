// serve::ModelPool: several models served in one memory budget. A model is registered without being loaded;
// its first request loads it by mapping its weights file (io::map_safetensors: no copy on the cpu) into a
// structure built on the meta device, runs it under InferenceMode, and when a load or a request would pass
// the budget the least recently used idle model is evicted (its weights drop back to the file). Several
// threads may call run at once, on one model or several. Not a server: no network, no batching of requests.
//
//   serve::ModelPool pool(kCPU, 4 << 20);                       // 4 MiB for weights and activations
//   pool.add("mlp", [] { return fmnist::make_mlp().ptr(); }, "mlp.safetensors");
//   pool.add("gpt", {{serve::Precision::F32, make_gpt, "gpt.safetensors"},
//                    {serve::Precision::BF16, make_gpt_bf16, "gpt-bf16.safetensors"}});
//   Tensor logits = pool.run("mlp", images);                    // loads mlp, then runs it
//   pool.run("gpt", tokens, serve::RunOptions().allow_smaller(true));
//   pool.stats("mlp").loads;                                    // 1
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../core/options.h"
#include "../core/tensor.h"
#include "../nn/module.h"

namespace frugal::serve {

// Makes the model's structure. Its values do not matter: the weights file's replace them. The pool calls it
// with the meta device as the default device (core/device.h), so a structure of any size costs no bytes;
// it must make its tensors without naming a device. Every tensor of the structure's state_dict must be in
// the file under the same name, shape and dtype, and the structure must hold no other tensor.
using Factory = std::function<std::shared_ptr<nn::Module>()>;

// What the weights of a variant are. BF16 runs the model in bf16: floating inputs are cast to bf16 and
// floating outputs back to f32, inside the request. Int8 is a structure of nn::quant's int8 layers (its
// file saved with quant::int8_names); inputs and outputs as the structure takes and gives them.
enum class Precision { F32, BF16, Int8 };
const char* precision_name(Precision precision);  // "f32", "bf16", "int8"

// One way to serve a model: its precision, structure and weights file.
struct Variant {
  Precision precision = Precision::F32;
  Factory factory;
  std::string weights_path;
};

struct RunOptions {
  // Note [choosing a variant]: serve from any of the model's variants that is loaded already and fits; else
  // when loading the first would need an eviction or a wait, from a later variant (in the order given to
  // add) that fits as things are; and when the first cannot fit at all, from the first later one that can.
  FRUGAL_ARG(bool, allow_smaller) = false;
};

struct ModelStats {
  int64_t requests = 0;      // run calls answered
  int64_t hits = 0;          // answered by a variant that was loaded already
  int64_t loads = 0;         // variants loaded
  int64_t evictions = 0;     // variants evicted
  int64_t smaller = 0;       // answered by a variant other than the first (RunOptions::allow_smaller)
  int64_t weight_bytes = 0;  // of the variants loaded now
  // Of each answered request in order, waiting and loading included; one double a request, kept for the
  // pool's life (a long-running server would want a bounded summary instead).
  std::vector<double> latency_ms;
  std::vector<double> load_ms;  // of each load: mapping the file and pointing the structure at it
  double latency_percentile_ms(double p) const;  // p in [0, 100], nearest rank; 0 when none
};

class ModelPool {
 public:
  // `budget`: the most bytes the pool's weights and requests hold at once on `device`, counted as the
  // device's Stats::footprint counts them (arena blocks, rounded, and mapped files: Note [the pool's
  // budget], serve/model_pool.cpp).
  ModelPool(Device device, int64_t budget);
  ~ModelPool();  // no run may be in flight; outputs handed out stay valid
  ModelPool(const ModelPool&) = delete;
  ModelPool& operator=(const ModelPool&) = delete;

  // Registers a model under a new name, served in f32 from `weights_path`.
  void add(const std::string& name, Factory factory, const std::string& weights_path);
  // Registers a model with its variants, the one to serve first first. Reads each file's header (a missing
  // or corrupt file is an Error now) but loads nothing.
  void add(const std::string& name, std::vector<Variant> variants);

  // The model's output for `input` (the model's forward on it). Loads the model if it is not loaded, evicting
  // the least recently used idle models as needed; waits while the requests in flight hold what it needs.
  // Throws OutOfMemoryError naming the model and the bytes when it cannot fit even alone, and Error for an
  // unknown name. The output holds its bytes in the budget until it is released.
  Tensor run(const std::string& name, const Tensor& input, const RunOptions& options = {});

  ModelStats stats(const std::string& name) const;
  std::vector<std::string> names() const;  // in the order added
  // The variants loaded now, least recently used first: (name, precision).
  std::vector<std::pair<std::string, Precision>> loaded() const;
  int64_t budget() const;
  Device device() const;
  // The bytes the pool holds now (the weights of the variants loaded or loading, what the requests in
  // flight may use at most, and the outputs not yet released), and the most it has held: never above the
  // budget.
  int64_t committed() const;
  int64_t peak_committed() const;
  // The bytes a request of this input (its shape and dtype) needs beyond the weights, at most, on the
  // model's first variant (or `precision`'s): from a dry run (core/estimate.h) where one can size it, else
  // -1 until a request has measured it (Note [sizing a request]).
  int64_t request_bytes(const std::string& name, const Tensor& input) const;
  int64_t request_bytes(const std::string& name, const Tensor& input, Precision precision) const;
  // Evicts every idle variant now (their weights drop back to their files).
  void evict_idle();

  struct State;  // serve/model_pool.cpp

 private:
  std::shared_ptr<State> state_;  // shared with the outputs handed out, which release their bytes into it
};

}  // namespace frugal::serve

// The Fashion-MNIST trainer's parts (models W1 and W2 of shared/WORKLOADS.md, one training step with gradient
// accumulation, evaluation, the memory report by category, checkpoints), shared by examples/train_fmnist.cpp
// and its tests. Uses the public header only.
#pragma once

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <frugal/frugal.h>
#include "common.h"

namespace fmnist {

using namespace frugal;

// W1: Linear 784->256, ReLU, Linear 256->256, ReLU, Linear 256->10.
inline nn::Sequential make_mlp() {
  nn::Sequential net;
  net->push_back(nn::Flatten());
  net->push_back(nn::Linear(784, 256));
  net->push_back(nn::ReLU());
  net->push_back(nn::Linear(256, 256));
  net->push_back(nn::ReLU());
  net->push_back(nn::Linear(256, 10));
  return net;
}

// W2: Conv 1->32 3x3 pad 1, ReLU, MaxPool 2; Conv 32->64 3x3 pad 1, ReLU, MaxPool 2; Linear 3136->128, ReLU,
// Linear 128->10.
inline nn::Sequential make_cnn() {
  nn::Sequential net;
  net->push_back(nn::Conv2d(nn::Conv2dOptions(1, 32, 3).padding(1)));
  net->push_back(nn::ReLU());
  net->push_back(nn::MaxPool2d(2));
  net->push_back(nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)));
  net->push_back(nn::ReLU());
  net->push_back(nn::MaxPool2d(2));
  net->push_back(nn::Flatten());
  net->push_back(nn::Linear(3136, 128));
  net->push_back(nn::ReLU());
  net->push_back(nn::Linear(128, 10));
  return net;
}

inline std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& kind,
                                                        const std::vector<Tensor>& params, double lr) {
  if (kind == "sgd") return std::make_unique<optim::SGD>(params, optim::SGDOptions(lr).momentum(0.9));
  if (kind == "adam") return std::make_unique<optim::Adam>(params, optim::AdamOptions(lr));
  if (kind == "adamw") return std::make_unique<optim::AdamW>(params, optim::AdamWOptions(lr));
  if (kind == "adafactor") return std::make_unique<optim::Adafactor>(params, optim::AdafactorOptions(lr));
  if (kind == "adam8bit") return std::make_unique<optim::Adam8bit>(params, optim::Adam8bitOptions(lr));
  if (kind == "adamw8bit") return std::make_unique<optim::AdamW8bit>(params, optim::AdamW8bitOptions(lr));
  constexpr auto float8 = optim::Adam8bitCode::Float8;
  if (kind == "adam8bit-float8")
    return std::make_unique<optim::Adam8bit>(params, optim::Adam8bitOptions(lr).code(float8));
  if (kind == "adamw8bit-float8")
    return std::make_unique<optim::AdamW8bit>(params, optim::AdamW8bitOptions(lr).code(float8));
  throw Error(
      "unknown optimizer '" + kind +
      "'; valid: sgd, adam, adamw, adafactor, adam8bit, adamw8bit, adam8bit-float8, adamw8bit-float8");
}

// Mixed precision of a run (--amp): autocast to `autocast` around the forward and the loss (none: f32), and
// for f16 a loss scaler (bf16 has f32's range and needs none; a disabled scaler is a no-op).
struct Precision {
  std::optional<DType> autocast;
  amp::GradScaler scaler;
  explicit Precision(std::optional<DType> dtype = std::nullopt)
      : autocast(dtype), scaler(amp::GradScalerOptions().enabled(dtype == DType::F16)) {}
};
// "f32" (off), "bf16" or "f16", as --amp takes it.
inline std::optional<DType> parse_amp(const std::string& s) {
  if (s.empty() || s == "f32" || s == "off") return std::nullopt;
  if (s == "bf16") return DType::BF16;
  if (s == "f16") return DType::F16;
  throw Error("--amp: unknown precision '" + s + "'; valid: bf16, f16, f32 (off)");
}

// A number the host needs from a tensor; 0 in a dry run (--estimate), whose meta tensors hold none.
template <typename T>
T host_value(const Tensor& t) {
  return memory::item_or(t, T(0));
}

// The dry run's stand-in for a Fashion-MNIST split (--estimate): batches of the shapes and dtypes the real
// one gives, made on the meta device in the same order (input, then target), without reading a pixel.
class DryImages : public data::Dataset {
 public:
  explicit DryImages(int64_t size) : size_(size) {}
  int64_t size() const override { return size_; }
  data::Batch get_batch(std::span<const int64_t> indices, DType dtype) const override {
    memory::PhaseScope phase(memory::Phase::Data);
    const auto b = int64_t(indices.size());
    data::Batch batch;
    batch.input = empty({b, 1, 28, 28}, TensorOptions(dtype).device(kMeta));
    batch.target = empty({b}, TensorOptions(DType::I64).device(kMeta));
    return batch;
  }

 private:
  int64_t size_;
};

// The dry run's stand-in for a DataLoader (--estimate): the same batches on the meta device, with the
// `prefetch` batches the real loader's worker keeps ahead made in this thread (in_caller_thread), so that the
// dry run holds what the worker's queue holds, in one order.
inline std::unique_ptr<data::DataLoader> dry_loader(const data::DataLoader& real) {
  data::DataLoaderOptions options = real.options();
  return std::make_unique<data::DataLoader>(std::make_shared<DryImages>(real.dataset().size()),
                                            options.in_caller_thread(true));
}

// Forward and backward of one micro-batch, its loss scaled by `scale` (1 / micro-batches per step, so that
// the accumulated gradient is the mean over the whole batch). Returns the scaled loss and the correct
// predictions.
struct StepResult {
  double loss = 0;
  int64_t correct = 0;
};
inline StepResult forward_backward(nn::Module& model, const data::Batch& batch, double scale,
                                   Precision* precision = nullptr) {
  StepResult r;
  Tensor loss;
  {
    memory::Tag tag("activations");
    const bool on = precision && precision->autocast;
    amp::Autocast autocast(on ? *precision->autocast : DType::BF16, on);
    const Tensor logits = model.forward(batch.input);
    loss = nn::functional::cross_entropy(logits, batch.target) * scale;
    r.correct = host_value<int64_t>(ops::sum(ops::eq(ops::argmax(logits.detach(), 1), batch.target)));
  }
  memory::Tag tag("backward");
  if (precision)
    precision->scaler.scale(loss).backward();
  else
    loss.backward();
  r.loss = host_value<double>(loss);
  return r;
}

// One epoch (or its first max_steps optimizer steps, when > 0). The loader yields micro-batches; every
// `accum` of them make one step (gradient accumulation: the batch never has to fit in memory at once, not
// even as data). Calls on_step(step, samples, result) after each step and returns the step losses. With a
// precision, the forward runs under its autocast and the steps go through its scaler. With ddp (--ddp), the
// gradients are reduced once a step, in its last micro-batch's backward.
inline std::vector<double> train_epoch(
    nn::Module& model, optim::Optimizer& opt, data::DataLoader& loader, int64_t epoch, int64_t max_steps,
    int accum, const std::function<void(int64_t, int64_t, const StepResult&)>& on_step = {},
    Precision* precision = nullptr, dist::DistributedDataParallel* ddp = nullptr) {
  FRUGAL_CHECK(accum >= 1, "train_epoch: accum must be at least 1, got ", accum);
  model.train();
  std::vector<double> losses;
  loader.begin_epoch(epoch);
  while (max_steps <= 0 || int64_t(losses.size()) < max_steps) {
    StepResult step;
    int64_t samples = 0;
    int micro = 0;
    opt.zero_grad();
    for (; micro < accum; ++micro) {
      std::optional<data::Batch> b = loader.next();
      if (!b) break;
      std::optional<dist::DistributedDataParallel::NoSync> no_sync;
      if (ddp && micro + 1 < accum) no_sync.emplace(*ddp);
      const StepResult r = forward_backward(model, *b, 1.0 / accum, precision);
      step.loss += r.loss;
      step.correct += r.correct;
      samples += b->target.numel();
    }
    if (micro < accum) break;  // the epoch ended inside a step: drop the partial step, as drop_last does
    memory::Tag tag("optimizer/step");
    if (precision) {
      precision->scaler.step(opt);  // skipped when an f16 gradient overflowed
      precision->scaler.update();
    } else {
      opt.step();
    }
    losses.push_back(step.loss);
    if (on_step) on_step(int64_t(losses.size()), samples, step);
  }
  return losses;
}

// Test-set accuracy, without recording and with the model in eval mode (under autocast to `autocast`, if
// given).
inline double evaluate(nn::Module& model, data::DataLoader& loader, std::optional<DType> autocast = {}) {
  InferenceMode no_record;
  memory::Tag tag("evaluation");
  amp::Autocast guard(autocast.value_or(DType::BF16), autocast.has_value());
  const bool was_training = model.is_training();
  model.eval();
  int64_t correct = 0, total = 0;
  for (data::Batch& b : loader.epoch(0)) {
    correct += host_value<int64_t>(ops::sum(ops::eq(ops::argmax(model.forward(b.input), 1), b.target)));
    total += b.target.numel();
  }
  model.train(was_training);
  return total ? double(correct) / double(total) : 0.0;
}

using examples::memory_report;

// Note [the model file is the whole model]
// The weights file is what a user carries to other tools (PyTorch with the safetensors package, say), so it
// holds everything needed to use the model besides its code: in the metadata, the model kind, the input's
// shape and normalisation ((pixel / 255 - input_mean) / input_std, the training set's statistics written to
// round-trip exactly), and the class names by label. The README shows a PyTorch user loading it.
struct ModelInfo {
  std::string model;  // "mlp" (W1) or "cnn" (W2)
  double input_mean = 0, input_std = 1;
};
inline std::map<std::string, std::string> model_metadata(const ModelInfo& info) {
  auto exact = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  std::string classes = "[";
  for (const char* name : data::FashionMNIST::kClassNames)
    classes += std::string(classes.size() > 1 ? ", " : "") + "\"" + name + "\"";
  return {{"format", "frugal"},
          {"model", info.model},
          {"input_shape", "[1, 28, 28]"},
          {"input_scale", "1/255"},
          {"input_mean", exact(info.input_mean)},
          {"input_std", exact(info.input_std)},
          {"classes", classes + "]"}};
}

// Checkpoints: the weights in `path` (safetensors), the training state beside them in `path`.state, saved and
// loaded as one unit (Note [checkpoint pairs] in io/checkpoint.h).
struct TrainingState {
  int64_t epoch = 0;  // epochs completed
  Generator::State rng;
};
// A loss scaler's state goes beside the optimizer's (when it is enabled).
inline void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& opt,
                            const TrainingState& st, const ModelInfo& info,
                            const amp::GradScaler* scaler = nullptr) {
  StateDict state;
  for (auto& [k, t] : opt.state_dict()) state["optimizer." + k] = t;
  if (scaler)
    for (auto& [k, t] : scaler->state_dict()) state["scaler." + k] = t;
  state["trainer.epoch"] = tensor<int64_t>({st.epoch}, Shape{});
  state["trainer.rng_seed"] = tensor<int64_t>({int64_t(st.rng.seed)}, Shape{});
  state["trainer.rng_offset"] = tensor<int64_t>({int64_t(st.rng.offset)}, Shape{});
  io::save_checkpoint(path, model.state_dict(), model_metadata(info), state,
                      {{"optimizer", opt.name()}, {"model", info.model}});
}

// Everything is checked before anything changes: the pair (io::load_checkpoint), the optimizer's kind and
// the trainer's keys and the scaler's state, then the model (Module::load_state_dict changes nothing when it
// refuses), then the optimizer and the scaler (the same for them; they only refuse a state that does not fit
// parameters the model just accepted).
inline TrainingState load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& opt,
                                     amp::GradScaler* scaler = nullptr) {
  const io::Checkpoint ckpt = io::load_checkpoint(path);
  const std::string state_path = io::checkpoint_state_path(path);
  const auto saved_by = ckpt.state.metadata.find("optimizer");
  FRUGAL_CHECK(saved_by != ckpt.state.metadata.end() && saved_by->second == opt.name(), "resume: '",
               state_path, "' holds the state of the optimizer ",
               saved_by == ckpt.state.metadata.end() ? std::string("(none recorded)") : saved_by->second,
               " but this run uses ", opt.name(), "; resume with the --optimizer it was saved with");
  StateDict opt_state, scaler_state;
  for (auto& [k, t] : ckpt.state.tensors) {
    if (k.rfind("optimizer.", 0) == 0) opt_state[k.substr(10)] = t;
    if (k.rfind("scaler.", 0) == 0) scaler_state[k.substr(7)] = t;
  }
  FRUGAL_CHECK(!scaler || !scaler->is_enabled() || !scaler_state.empty(), "resume: '", state_path,
               "' has no loss scaler state; was it saved without --amp f16?");
  auto get = [&](const char* key) {
    auto it = ckpt.state.tensors.find(key);
    FRUGAL_CHECK(it != ckpt.state.tensors.end(), "resume: '", state_path, "' has no '", key, "'");
    return it->second.item<int64_t>();
  };
  TrainingState st;
  st.epoch = get("trainer.epoch");
  st.rng.seed = uint64_t(get("trainer.rng_seed"));
  st.rng.offset = uint64_t(get("trainer.rng_offset"));
  model.load_state_dict(ckpt.weights.tensors);
  opt.load_state_dict(opt_state);
  if (scaler) scaler->load_state_dict(scaler_state);
  return st;
}

}  // namespace fmnist

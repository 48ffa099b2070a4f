// The compression report's parts (examples/compress.cpp): for each technique, a copy of the trained model
// with the technique applied, measured for bytes (the arena's), file size, test accuracy and inference time.
// Shared with its test (tests/examples/test_compress.cpp). Uses the public header only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "distill.h"

namespace compress {

using namespace frugal;

inline int64_t arena_bytes() { return memory::stats(kCPU).allocated.current; }

struct Row {
  std::string technique;
  int64_t model_bytes = 0, file_bytes = 0;
  double test_accuracy = 0, infer_ms = 0;
  double infer_ratio = 0;  // the median over the timed pairs of this row's forward time / the f32 model's
};

// What the rows share: the data, the trained weights, and how long a fine-tune runs.
struct Setup {
  std::string model;
  std::shared_ptr<data::FashionMNIST> train_set, test_set;
  StateDict trained;
  int epochs = 2;           // of training
  int student_epochs = 10;  // the distilled student's
  int64_t max_steps = 0;    // per epoch (0: the whole epoch)
  int64_t finetune_steps = 0;
  double finetune_lr = 5e-4;
  int repeats = 0;
  Tensor infer_batch;                     // the first 256 test images
  std::shared_ptr<nn::Module> reference;  // the trained f32 model, timed beside each row (run_rows makes it)
  std::string scratch;                    // a file path for measuring file_bytes
};

inline nn::Sequential fresh(const Setup& s) {
  return s.model == "mlp" ? fmnist::make_mlp() : fmnist::make_cnn();
}

// Fine-tunes `model` for the setup's steps (Adam at the setup's lr, the W1/W2 batch); the optimizer's state
// is freed on return.
inline void finetune(nn::Module& model, const Setup& s) {
  if (s.finetune_steps == 0) return;
  optim::Adam opt(model.parameters(), optim::AdamOptions(s.finetune_lr));
  data::DataLoader train(s.train_set, data::DataLoaderOptions()
                                          .batch_size(s.model == "mlp" ? 128 : 64)
                                          .shuffle(true)
                                          .seed(1)
                                          .drop_last(true));
  fmnist::train_epoch(model, opt, train, 0, s.finetune_steps, 1);
}

// The row's model and the f32 reference (`reference`, the trained model itself) run alternately, `repeats`
// times each after a warm-up, so that both see the same machine: on a shared machine a row's own median
// moves by more than the techniques differ. Returns the row's median time (ms) and the median of the pairs'
// ratios.
inline std::pair<double, double> timed_forwards(nn::Module& model, nn::Module& reference, const Setup& s) {
  InferenceMode no_record;
  model.eval();
  reference.eval();
  for (int i = 0; i < 3; ++i) model.forward(s.infer_batch), reference.forward(s.infer_batch);
  auto time_ms = [&](nn::Module& m) {
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor y = m.forward(s.infer_batch);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> ms, ratios;
  for (int i = 0; i < s.repeats; ++i) {
    const double ref = time_ms(reference), mine = time_ms(model);
    ms.push_back(mine);
    ratios.push_back(mine / ref);
  }
  auto median = [](std::vector<double>& v) {
    std::nth_element(v.begin(), v.begin() + ptrdiff_t(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  return {median(ms), median(ratios)};
}

// Makes the row's model (`make`, which returns it with the technique applied) and measures it. Everything
// `make` used besides the model (optimizer state, gradients, calibration batches) is gone when it returns,
// so the arena's growth is the model's own.
inline Row measure(const std::string& technique, const Setup& s,
                   const std::function<nn::Sequential()>& make) {
  Row r{technique};
  const int64_t before = arena_bytes();
  nn::Sequential model = make();
  model->zero_grad();
  r.model_bytes = arena_bytes() - before;
  io::save_safetensors(s.scratch, model->state_dict(), {}, nn::quant::int8_names(*model));
  r.file_bytes = int64_t(std::filesystem::file_size(s.scratch));
  std::filesystem::remove(s.scratch);
  data::DataLoader test(s.test_set, data::DataLoaderOptions().batch_size(250));
  r.test_accuracy = fmnist::evaluate(*model, test);
  std::tie(r.infer_ms, r.infer_ratio) = timed_forwards(*model, *s.reference, s);
  return r;
}

// A copy of the trained model.
inline nn::Sequential trained_copy(const Setup& s) {
  nn::Sequential m = fresh(s);
  m->load_state_dict(s.trained);
  return m;
}

// The model's prunable layers (its Linears and Conv2ds) and, for structured pruning, all but the last (whose
// outputs are the model's).
inline std::vector<nn::Module*> prunable_layers(nn::SequentialImpl& m, bool but_last = false) {
  std::vector<nn::Module*> layers;
  for (const auto& child : m)
    if (dynamic_cast<nn::LinearImpl*>(child.get()) || dynamic_cast<nn::Conv2dImpl*>(child.get()))
      layers.push_back(child.get());
  if (but_last && !layers.empty()) layers.pop_back();
  return layers;
}

// The trained model with `amount` of its weights pruned by magnitude, one threshold over all its layers
// (global: W2's first convolution has 288 weights against the first Linear's 401,408, and pruning each
// layer alike costs it most), iteratively (PyTorch's
// iterative pruning, Zhu and Gupta's gradual schedule in three steps): to 50%, 80% and 90% of the weights, as
// far as `amount`, each step pruning a share of what is left and fine-tuning with the masks held; then
// (permanent) the masks removed.
inline nn::Sequential pruned_copy(const Setup& s, double amount, bool permanent) {
  nn::Sequential m = trained_copy(s);
  double done = 0;
  for (double stage : {0.5, 0.8, 0.9, 1.0}) {
    const double to = std::min(stage, amount);
    std::vector<std::pair<nn::Module*, std::string>> weights;
    for (nn::Module* layer : prunable_layers(*m)) weights.emplace_back(layer, "weight");
    nn::prune::global_unstructured(weights, (to - done) / (1 - done));
    finetune(*m, s);
    done = to;
    if (done >= amount) break;
  }
  if (permanent)
    for (nn::Module* layer : prunable_layers(*m)) nn::prune::remove(*layer, "weight");
  return m;
}

// Runs `batches` batches of 256 training images through the model without recording (calibration).
inline void calibrate(nn::Module& model, const Setup& s, int batches) {
  NoGradGuard no_record;
  std::vector<int64_t> idx(256);
  for (int b = 0; b < batches; ++b) {
    std::iota(idx.begin(), idx.end(), int64_t(b) * 256);
    model.forward(s.train_set->get_batch(idx, DType::F32).input);
  }
}

inline std::vector<Row> run_rows(Setup& s) {
  s.reference = trained_copy(s).ptr();
  std::vector<Row> rows;
  auto add = [&](const std::string& technique, const std::function<nn::Sequential()>& make) {
    rows.push_back(measure(technique, s, make));
    const Row& r = rows.back();
    std::fprintf(stderr, "compress: %s done (accuracy %.4f)\n", r.technique.c_str(), r.test_accuracy);
  };
  const std::string tuned = s.finetune_steps ? " + fine-tune" : "";
  add("f32", [&] { return trained_copy(s); });
  // The pruned rows train for up to three fine-tunes more than the f32 model: this row trains as long, so
  // that what pruning costs is the difference to it.
  add("f32 + fine-tune x3", [&] {
    nn::Sequential m = trained_copy(s);
    for (int i = 0; i < 3; ++i) finetune(*m, s);
    return m;
  });
  for (int percent : {50, 80, 90})
    add("l1 global " + std::to_string(percent) + "%" + tuned,
        [&] { return pruned_copy(s, percent / 100.0, false); });
  add("structured 50% + shrink" + tuned, [&] {
    nn::Sequential m = trained_copy(s);
    for (nn::Module* layer : prunable_layers(*m, true)) nn::prune::ln_structured(*layer, "weight", 0.5, 2, 0);
    nn::prune::shrink(*m);
    finetune(*m, s);  // the smaller model, with an optimizer of its own size
    return m;
  });
  add("CSR at 90%" + tuned, [&] {
    nn::Sequential m = pruned_copy(s, 0.9, true);
    nn::prune::to_sparse(*m, 0.5);
    return m;
  });
  add("int8 dynamic", [&] {
    nn::Sequential m = trained_copy(s);
    nn::quant::quantize_dynamic(*m);
    return m;
  });
  add("int8 static (histogram)", [&] {
    nn::Sequential m = trained_copy(s);
    nn::quant::prepare(*m, nn::quant::Observer::Histogram);
    calibrate(*m, s, 8);
    nn::quant::convert(*m);
    return m;
  });
  add("int8 QAT" + tuned, [&] {
    nn::Sequential m = trained_copy(s);
    nn::quant::prepare_qat(*m);
    finetune(*m, s);
    if (s.finetune_steps == 0) calibrate(*m, s, 1);  // convert needs a batch seen
    nn::quant::convert(*m);
    return m;
  });
  add("l1 global 80%" + tuned + " + int8 dynamic", [&] {
    nn::Sequential m = pruned_copy(s, 0.8, true);
    nn::quant::quantize_dynamic(*m);
    return m;
  });
  if (s.model == "mlp") {
    add("distilled student 784-64-10", [&] {
      Tensor logits;
      {
        nn::Sequential teacher = trained_copy(s);
        logits = distill::label_with(*teacher, *s.train_set);
      }
      return distill::train_student(1, s.student_epochs, s.max_steps, logits, 2.0, 0.5, s.train_set);
    });
  }
  return rows;
}

inline void print_table(const std::vector<Row>& rows) {
  const Row& base = rows.front();
  std::printf("| technique | model bytes | × f32 | file bytes | test accuracy | infer ms (256) | × f32 |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows)
    std::printf("| %s | %lld | %.3f | %lld | %.4f | %.3f | %.2f |\n", r.technique.c_str(),
                static_cast<long long>(r.model_bytes), double(r.model_bytes) / double(base.model_bytes),
                static_cast<long long>(r.file_bytes), r.test_accuracy, r.infer_ms, r.infer_ratio);
}

inline void print_json(const std::vector<Row>& rows) {
  for (const Row& r : rows)
    std::printf(
        "{\"technique\": \"%s\", \"model_bytes\": %lld, \"file_bytes\": %lld, \"test_accuracy\": %.4f, "
        "\"infer_ms\": %.4f, \"infer_x_f32\": %.4f}\n",
        r.technique.c_str(), static_cast<long long>(r.model_bytes), static_cast<long long>(r.file_bytes),
        r.test_accuracy, r.infer_ms, r.infer_ratio);
}

}  // namespace compress

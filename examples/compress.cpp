// compress: what each model-compression technique does to workload W1 (mlp) or W2 (cnn) on Fashion-MNIST.
// Trains the model (or loads it with --weights, a file train_fmnist --save wrote), then for each technique
// makes a copy of the trained model, applies it, and measures:
//   model_bytes    the copy's resident bytes, from the arena (allocated bytes with the copy alive, less
//                  those before it was made: parameters, buffers, masks, scales; nothing hidden)
//   file_bytes     its state_dict as a safetensors file
//   test_accuracy  on the 10,000 test images
//   infer_ms       one forward of a batch of 256 test images, the median of --repeats runs
// as a Markdown table, or one JSON object per row with --json.
//
//   build/examples/compress --model mlp
//   build/examples/compress --model cnn --weights cnn.safetensors --json
//   build/examples/compress --save-weights mlp.safetensors   # the trained weights, for
//   bench/compare_compress.sh
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <numeric>

#include "distill.h"

using namespace frugal;

namespace {

int64_t arena_bytes() { return memory::stats(kCPU).allocated.current; }

struct Row {
  std::string technique;
  int64_t model_bytes = 0, file_bytes = 0;
  double test_accuracy = 0, infer_ms = 0;
};

// What the rows share: the data, the trained weights, and how long a fine-tune runs.
struct Setup {
  std::string model;
  std::shared_ptr<data::FashionMNIST> train_set, test_set;
  StateDict trained;
  int epochs = 2;         // of training, the distilled student's too
  int64_t max_steps = 0;  // per epoch (0: the whole epoch)
  int64_t finetune_steps = 0;
  int repeats = 0;
  Tensor infer_batch;   // the first 256 test images
  std::string scratch;  // a file path for measuring file_bytes
};

nn::Sequential fresh(const Setup& s) { return s.model == "mlp" ? fmnist::make_mlp() : fmnist::make_cnn(); }

// Fine-tunes `model` for the setup's steps (Adam, lr 1e-4, the W1/W2 batch); the optimizer's state is freed
// on return.
void finetune(nn::Module& model, const Setup& s) {
  if (s.finetune_steps == 0) return;
  optim::Adam opt(model.parameters(), optim::AdamOptions(1e-4));
  data::DataLoader train(s.train_set, data::DataLoaderOptions()
                                          .batch_size(s.model == "mlp" ? 128 : 64)
                                          .shuffle(true)
                                          .seed(1)
                                          .drop_last(true));
  fmnist::train_epoch(model, opt, train, 0, s.finetune_steps, 1);
}

double median_forward_ms(nn::Module& model, const Setup& s) {
  InferenceMode no_record;
  model.eval();
  for (int i = 0; i < 3; ++i) model.forward(s.infer_batch);  // warm-up: primitives, caches
  std::vector<double> ms;
  for (int i = 0; i < s.repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor y = model.forward(s.infer_batch);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + ptrdiff_t(ms.size() / 2), ms.end());
  return ms[ms.size() / 2];
}

// Makes the row's model (`make`, which returns it with the technique applied) and measures it. Everything
// `make` used besides the model (optimizer state, gradients, calibration batches) is gone when it returns,
// so the arena's growth is the model's own.
Row measure(const std::string& technique, const Setup& s, const std::function<nn::Sequential()>& make) {
  Row r{technique};
  const int64_t before = arena_bytes();
  nn::Sequential model = make();
  model->zero_grad();
  r.model_bytes = arena_bytes() - before;
  io::save_safetensors(s.scratch, model->state_dict());
  r.file_bytes = int64_t(std::filesystem::file_size(s.scratch));
  std::filesystem::remove(s.scratch);
  data::DataLoader test(s.test_set, data::DataLoaderOptions().batch_size(250));
  r.test_accuracy = fmnist::evaluate(*model, test);
  r.infer_ms = median_forward_ms(*model, s);
  return r;
}

// A copy of the trained model.
nn::Sequential trained_copy(const Setup& s) {
  nn::Sequential m = fresh(s);
  m->load_state_dict(s.trained);
  return m;
}

std::vector<Row> run_rows(const Setup& s) {
  std::vector<Row> rows;
  auto add = [&](const std::string& technique, const std::function<nn::Sequential()>& make) {
    rows.push_back(measure(technique, s, make));
    const Row& r = rows.back();
    std::fprintf(stderr, "compress: %s done (accuracy %.4f)\n", r.technique.c_str(), r.test_accuracy);
  };
  add("f32", [&] { return trained_copy(s); });
  if (s.model == "mlp") {
    add("distilled student 784-64-10", [&] {
      Tensor logits;
      {
        nn::Sequential teacher = trained_copy(s);
        logits = distill::label_with(*teacher, *s.train_set);
      }
      return distill::train_student(1, s.epochs, s.max_steps, logits, 2.0, 0.5, s.train_set);
    });
  }
  return rows;
}

void print_table(const std::vector<Row>& rows) {
  const Row& base = rows.front();
  std::printf("| technique | model bytes | × f32 | file bytes | test accuracy | infer ms (256) | × f32 |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows)
    std::printf("| %s | %lld | %.3f | %lld | %.4f | %.3f | %.2f |\n", r.technique.c_str(),
                static_cast<long long>(r.model_bytes), double(r.model_bytes) / double(base.model_bytes),
                static_cast<long long>(r.file_bytes), r.test_accuracy, r.infer_ms,
                r.infer_ms / base.infer_ms);
}

void print_json(const std::vector<Row>& rows) {
  for (const Row& r : rows)
    std::printf(
        "{\"technique\": \"%s\", \"model_bytes\": %lld, \"file_bytes\": %lld, \"test_accuracy\": %.4f, "
        "\"infer_ms\": %.4f}\n",
        r.technique.c_str(), static_cast<long long>(r.model_bytes), static_cast<long long>(r.file_bytes),
        r.test_accuracy, r.infer_ms);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Compress workload W1 (mlp) or W2 (cnn): bytes, accuracy and inference time per technique"};
  Setup s;
  s.model = "mlp";
  std::string weights, save_weights, data_dir = data::kFashionMNISTRoot;
  int threads = 0;
  bool json = false;
  s.finetune_steps = 300;
  s.repeats = 21;
  app.add_option("--model", s.model, "mlp (W1) or cnn (W2)")->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--weights", weights,
                 "start from these trained weights (train_fmnist --save) instead of training");
  app.add_option("--save-weights", save_weights,
                 "write the trained weights here (with train_fmnist's metadata)");
  app.add_option("--epochs", s.epochs, "epochs to train the model (without --weights)")
      ->check(CLI::Validator(examples::integer_in(1, 1000), "[1, 1000]"));
  app.add_option("--max-steps", s.max_steps,
                 "stop each training epoch after this many steps (quick runs: 0, no limit)")
      ->check(CLI::Validator(examples::integer_in(0, INT64_MAX), "INT >= 0"));
  app.add_option("--finetune-steps", s.finetune_steps, "steps of fine-tuning after pruning (0: none)")
      ->check(CLI::Validator(examples::integer_in(0, 1000000), "[0, 1000000]"));
  app.add_option("--repeats", s.repeats, "timed forwards per row (the median is reported)")
      ->check(CLI::Validator(examples::integer_in(1, 10000), "[1, 10000]"));
  app.add_flag("--json", json, "one JSON object per row instead of the table");
  app.add_option("--threads", threads, "CPU threads (default, or 0: all cores)")
      ->check(CLI::Validator(examples::integer_in(0, INT32_MAX), "INT >= 0"));
  app.add_option("--data", data_dir, "folder with the Fashion-MNIST files");
  CLI11_PARSE(app, argc, argv);
  examples::line_buffered_stdout();
  try {
    if (threads > 0) set_num_threads(threads);
    if (!save_weights.empty()) examples::check_can_write("--save-weights", save_weights);
    s.train_set = std::make_shared<data::FashionMNIST>(data_dir, data::Split::Train);
    s.test_set = std::make_shared<data::FashionMNIST>(data_dir, data::Split::Test);
    fmnist::ModelInfo info{s.model};
    if (!weights.empty()) {
      const auto meta = io::load_safetensors_metadata(weights);
      FRUGAL_CHECK(meta.count("model") && meta.at("model") == s.model, "--weights: '", weights,
                   "' is not a W", s.model == "mlp" ? 1 : 2, " ", s.model, " file (its metadata says model=",
                   meta.count("model") ? meta.at("model") : std::string("(none)"), ")");
      info.input_mean = std::stod(meta.at("input_mean"));
      info.input_std = std::stod(meta.at("input_std"));
    } else {
      std::tie(info.input_mean, info.input_std) = s.train_set->pixel_stats();
    }
    s.train_set->normalize(info.input_mean, info.input_std);
    s.test_set->normalize(info.input_mean, info.input_std);
    {
      manual_seed(0);
      nn::Sequential m = fresh(s);
      if (!weights.empty()) {
        m->load_state_dict(io::load_safetensors(weights).tensors);
      } else {
        optim::Adam opt(m->parameters(), optim::AdamOptions(1e-3));
        data::DataLoader train(s.train_set, data::DataLoaderOptions()
                                                .batch_size(s.model == "mlp" ? 128 : 64)
                                                .shuffle(true)
                                                .seed(0)
                                                .drop_last(true));
        for (int e = 0; e < s.epochs; ++e) fmnist::train_epoch(*m, opt, train, e, s.max_steps, 1);
      }
      if (!save_weights.empty())
        io::save_safetensors(save_weights, m->state_dict(), fmnist::model_metadata(info));
      for (auto& [k, t] : m->state_dict()) s.trained[k] = t.detach().clone();
    }
    std::vector<int64_t> first(256);
    std::iota(first.begin(), first.end(), int64_t(0));
    s.infer_batch = s.test_set->get_batch(first, DType::F32).input;
    s.scratch = (std::filesystem::temp_directory_path() /
                 ("frugal-compress-" + std::to_string(::getpid()) + ".safetensors"))
                    .string();
    const std::vector<Row> rows = run_rows(s);
    if (json)
      print_json(rows);
    else
      print_table(rows);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

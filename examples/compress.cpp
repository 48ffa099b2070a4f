// compress: what each model-compression technique does to workload W1 (mlp) or W2 (cnn) on Fashion-MNIST.
// Trains the model (or loads it with --weights, a file train_fmnist --save wrote), then for each technique
// makes a copy of the trained model, applies it, and measures:
//   model_bytes    the copy's resident bytes, from the arena (allocated bytes with the copy alive, less
//                  those before it was made: parameters, buffers, masks, scales; nothing hidden)
//   file_bytes     its state_dict as a safetensors file
//   test_accuracy  on the 10,000 test images
//   infer_ms       one forward of a batch of 256 test images, the median of --repeats runs; each run
//                  alternates with one of the trained f32 model, and "× f32" (JSON infer_x_f32) is the
//                  median of those pairs' ratios, so that a noisy machine moves both sides alike
// as a Markdown table, or one JSON object per row with --json.
//
//   build/examples/compress --model mlp
//   build/examples/compress --model cnn --weights cnn.safetensors --json
//   build/examples/compress --save-weights mlp.safetensors   # the trained weights, for
//   bench/compare_compress.sh
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "compress.h"

using namespace frugal;

int main(int argc, char** argv) {
  CLI::App app{"Compress workload W1 (mlp) or W2 (cnn): bytes, accuracy and inference time per technique"};
  compress::Setup s;
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
  app.add_option("--finetune-lr", s.finetune_lr, "Adam's learning rate in fine-tuning")
      ->check(CLI::Validator(examples::check_finite_positive, "POSITIVE"));
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
      nn::Sequential m = compress::fresh(s);
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
    const std::vector<compress::Row> rows = compress::run_rows(s);
    if (json)
      compress::print_json(rows);
    else
      compress::print_table(rows);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

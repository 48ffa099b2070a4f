// multi_model: workloads W1 (MLP), W2 (CNN) and W3 (char GPT) served together by one serve::ModelPool under a
// budget smaller than what they need together. Each model is trained briefly here (or read from
// --weights-dir), saved in f32 and in a smaller variant (int8 for the two Fashion-MNIST models, bf16 for the
// GPT), and registered lazily; then --threads threads send --requests requests, models drawn from a Zipf
// mix, first with no limit and then under --budget, each output checked against the same variant loaded
// alone. Prints per model: requests, loads, evictions, p50/p99 latency and the median load time; then the
// peak bytes against the budget and the throughput against the unlimited run. With --json the last line is
// one JSON object (peak_bytes, budget_bytes, evictions, requests, mismatches, ...).
//
//   build/examples/multi_model                          # budget: half of what the three need together
//   build/examples/multi_model --budget 4M --threads 4 --requests 2000 --json
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "chargpt.h"
#include "common.h"
#include "fmnist.h"
#include "multi_model.h"

using namespace frugal;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kImageBatch = 8, kTextBatch = 4;  // a request: images, or windows of text

// Trains a Fashion-MNIST model for `steps` steps of Adam (batch 64), or not at all.
void train_images(nn::Module& model, const std::shared_ptr<data::FashionMNIST>& train, int steps) {
  if (steps <= 0) return;
  optim::Adam opt(model.parameters(), optim::AdamOptions(1e-3));
  data::DataLoader loader(train, data::DataLoaderOptions().batch_size(64).shuffle(true).seed(0));
  fmnist::train_epoch(model, opt, loader, 0, steps, 1);
}

void train_text(nn::GPTImpl& model, const data::TextDataset& text, int steps) {
  optim::AdamW opt(model.parameters(), optim::AdamWOptions(1e-3));
  Generator gen(1);
  for (int i = 0; i < steps; ++i) {
    const data::Batch b = text.sample_batch(32, gen);
    opt.zero_grad();
    chargpt::lm_loss(model.forward(b.input), b.target).backward();
    opt.step();
  }
}

// The f32 file and the smaller variant's (made from the f32 weights when missing), registered first-first.
std::vector<serve::Variant> variants(const std::string& dir, const std::string& name, serve::Factory f32,
                                     serve::Precision smaller, serve::Factory smaller_factory) {
  const std::string f32_path = dir + "/" + name + ".safetensors";
  const std::string small_path = dir + "/" + name + "-" + serve::precision_name(smaller) + ".safetensors";
  if (!fs::exists(small_path)) {
    std::shared_ptr<nn::Module> m = f32();
    m->load_state_dict(io::load_safetensors(f32_path).tensors);
    if (smaller == serve::Precision::BF16) {
      m->to(DType::BF16);
      io::save_safetensors(small_path, m->state_dict());
    } else {
      nn::quant::quantize_dynamic(*m);
      io::save_safetensors(small_path, m->state_dict(), {}, nn::quant::int8_names(*m));
    }
  }
  return {{serve::Precision::F32, std::move(f32), f32_path},
          {smaller, std::move(smaller_factory), small_path}};
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Serve workloads W1, W2 and W3 together in one memory budget with serve::ModelPool"};
  std::string budget_text, weights_dir, fmnist_dir = data::kFashionMNISTRoot, text_dir = data::kFortunesRoot;
  int threads = 4, train_steps = 50;
  int64_t requests = 600;
  double zipf = 1.1;
  bool json = false, no_smaller = false;
  app.add_option("--budget", budget_text,
                 "the pool's budget (e.g. 4M); default: half of what the three models need together")
      ->check(CLI::Validator(examples::check_byte_count, "SIZE"));
  app.add_option("--threads", threads, "threads sending requests")
      ->check(CLI::Validator(examples::integer_in(1, 256), "[1, 256]"));
  app.add_option("--requests", requests, "requests in each run")
      ->check(CLI::Validator(examples::integer_in(1, 10'000'000), "[1, 10000000]"));
  app.add_option("--zipf", zipf, "the mix's exponent: model k is asked for in proportion to 1/k^s")
      ->check(CLI::Range(0.0, 10.0));
  app.add_option("--weights-dir", weights_dir,
                 "folder of mlp.safetensors, cnn.safetensors and gpt.safetensors (written there after "
                 "training when missing); default: a temporary folder");
  app.add_option("--train-steps", train_steps, "steps to train each model that has no file (0: random)")
      ->check(CLI::Validator(examples::integer_in(0, 100000), "[0, 100000]"));
  app.add_flag("--no-smaller", no_smaller, "never serve the smaller variants (RunOptions::allow_smaller)");
  app.add_flag("--json", json, "end with one JSON line");
  app.add_option("--fmnist", fmnist_dir, "folder with the Fashion-MNIST files");
  app.add_option("--text", text_dir, "folder of text files for the GPT (default: Debian's fortunes)");
  CLI11_PARSE(app, argc, argv);
  examples::line_buffered_stdout();
  try {
    const bool temporary = weights_dir.empty();
    if (temporary)
      weights_dir = (fs::temp_directory_path() / ("frugal-multi-model-" + std::to_string(getpid()))).string();
    fs::create_directories(weights_dir);
    struct Cleanup {
      std::string dir;
      bool on;
      ~Cleanup() {
        if (on) fs::remove_all(dir);
      }
    } cleanup{weights_dir, temporary};

    auto train_set = std::make_shared<data::FashionMNIST>(fmnist_dir, data::Split::Train);
    auto test_set = std::make_shared<data::FashionMNIST>(fmnist_dir, data::Split::Test);
    const auto [mean, std] = train_set->pixel_stats();
    train_set->normalize(mean, std);
    test_set->normalize(mean, std);
    data::TextDataset text(data::TextDatasetOptions().root(text_dir).context(64));
    nn::GPTConfig cfg;
    cfg.vocab = text.vocab_size();

    // The f32 weights: the files there, or a brief training.
    const auto file = [&](const std::string& n) { return weights_dir + "/" + n + ".safetensors"; };
    for (const std::string n : {"mlp", "cnn"})
      if (!fs::exists(file(n))) {
        manual_seed(0);
        nn::Sequential m = n == "mlp" ? fmnist::make_mlp() : fmnist::make_cnn();
        train_images(*m, train_set, train_steps);
        io::save_safetensors(file(n), m->state_dict());
        std::printf("trained %s for %d steps -> %s\n", n.c_str(), train_steps, file(n).c_str());
      }
    if (!fs::exists(file("gpt"))) {
      manual_seed(0);
      nn::GPT g(cfg);
      train_text(*g, text, train_steps);
      io::save_safetensors(file("gpt"), g->state_dict());
      std::printf("trained gpt for %d steps -> %s\n", train_steps, file("gpt").c_str());
    }

    std::vector<multi_model::Served> models(3);
    models[0].name = "mlp";
    models[0].variants = variants(
        weights_dir, "mlp", [] { return fmnist::make_mlp().ptr(); }, serve::Precision::Int8,
        [] { return multi_model::int8_structure(fmnist::make_mlp()); });
    models[1].name = "cnn";
    models[1].variants = variants(
        weights_dir, "cnn", [] { return fmnist::make_cnn().ptr(); }, serve::Precision::Int8,
        [] { return multi_model::int8_structure(fmnist::make_cnn()); });
    models[2].name = "gpt";
    models[2].variants = variants(
        weights_dir, "gpt", [cfg] { return nn::GPT(cfg).ptr(); }, serve::Precision::BF16,
        [cfg] {
          nn::GPT g(cfg);
          g->to(DType::BF16);
          return g.ptr();
        });
    // Eight inputs per model: test images, and windows of the text.
    Generator gen(7);
    for (int i = 0; i < 8; ++i) {
      std::vector<int64_t> idx;
      for (int64_t j = 0; j < kImageBatch; ++j) idx.push_back((i * kImageBatch + j) % test_set->size());
      const Tensor images = test_set->get_batch(idx, DType::F32).input;
      models[0].inputs.push_back(images);
      models[1].inputs.push_back(images);
      models[2].inputs.push_back(text.sample_batch(kTextBatch, gen).input);
    }
    for (auto& m : models) multi_model::compute_expected(m);

    // What each needs alone, in f32: its file and its largest request.
    int64_t need = 0;
    {
      serve::ModelPool sizing(kCPU, int64_t(1) << 40);
      for (auto& m : models) {
        sizing.add(m.name, m.variants);
        need +=
            int64_t(fs::file_size(m.variants[0].weights_path)) + sizing.request_bytes(m.name, m.inputs[0]);
      }
    }
    const int64_t budget = budget_text.empty() ? need / 2 : memory::parse_bytes(budget_text);
    const std::vector<int> mix = multi_model::zipf_requests(3, requests, zipf, 11);

    const multi_model::MixResult free_run =
        multi_model::serve_mix(models, need * 100, mix, threads, !no_smaller, 5);
    const multi_model::MixResult run = multi_model::serve_mix(models, budget, mix, threads, !no_smaller, 5);

    std::printf("%-5s %9s %6s %6s %9s %8s %8s %8s %9s\n", "model", "requests", "hits", "loads", "evictions",
                "smaller", "p50 ms", "p99 ms", "load ms");
    for (const auto& m : models) {
      const serve::ModelStats& s = run.stats.at(m.name);
      std::printf("%-5s %9lld %6lld %6lld %9lld %8lld %8.3f %8.3f %9.3f\n", m.name.c_str(),
                  (long long)s.requests, (long long)s.hits, (long long)s.loads, (long long)s.evictions,
                  (long long)s.smaller, s.latency_percentile_ms(50), s.latency_percentile_ms(99),
                  median(s.load_ms));
    }
    const double throughput = double(run.requests) / run.seconds;
    const double free_throughput = double(free_run.requests) / free_run.seconds;
    std::printf("needed together (f32 weights + one request each): %s\n", memory::format_bytes(need).c_str());
    std::printf("budget_bytes=%lld (%s)\n", (long long)budget, memory::format_bytes(budget).c_str());
    std::printf("peak_bytes=%lld (%s; the pool's own count peaked at %s)\n", (long long)run.peak_bytes,
                memory::format_bytes(run.peak_bytes).c_str(),
                memory::format_bytes(run.peak_committed).c_str());
    std::printf("throughput=%.1f requests/s, unlimited %.1f: x%.3f\n", throughput, free_throughput,
                throughput / free_throughput);
    std::printf("mismatches=%lld of %lld outputs (each against its variant loaded alone)\n",
                (long long)(run.mismatches + free_run.mismatches),
                (long long)(run.requests + free_run.requests));
    if (run.errors + free_run.errors > 0)
      std::printf("errors=%lld requests failed; the first: %s\n", (long long)(run.errors + free_run.errors),
                  (run.errors ? run.first_error : free_run.first_error).c_str());
    if (json) {
      nlohmann::ordered_json j;
      j["peak_bytes"] = run.peak_bytes;
      j["budget_bytes"] = budget;
      j["evictions"] = run.evictions;
      j["requests"] = run.requests;
      j["mismatches"] = run.mismatches + free_run.mismatches;
      j["errors"] = run.errors + free_run.errors;
      j["loads"] = run.loads;
      j["needed_bytes"] = need;
      j["throughput"] = throughput;
      j["throughput_unlimited"] = free_throughput;
      j["gpt_load_ms"] = median(run.stats.at("gpt").load_ms);
      std::printf("%s\n", j.dump().c_str());
    }
    const int64_t failed = run.mismatches + free_run.mismatches + run.errors + free_run.errors;
    return failed == 0 && run.peak_bytes <= budget ? 0 : 1;
  } catch (const OutOfMemoryError& e) {
    return examples::report_out_of_memory(e, "multi_model", "--budget");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "multi_model: %s\n", e.what());
    return 1;
  }
}

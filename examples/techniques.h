// The memory techniques side by side (examples/memory_report.cpp, issue 17): N training steps of W1, W2 or W3
// (shared/WORKLOADS.md) under each technique, each in a fresh state, measured by the arena itself: the peak
// of allocated bytes (memory::stats), the bytes by category at that peak (replayed from a memory::History of
// the run), the median step time and the last loss. Shared by the program and its test. Uses the public
// header only, and the trainers' parts (fmnist.h, chargpt.h).
//
//   techniques::Workload w(techniques::Config{.model = "mlp", .steps = 20});
//   std::vector<techniques::Row> rows;
//   for (const techniques::Technique& t : techniques::techniques_for("mlp")) rows.push_back(w.run(t));
//   std::printf("%s", techniques::markdown_table(rows).c_str());
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <frugal/frugal.h>
#include "chargpt.h"
#include "fmnist.h"

namespace techniques {

using namespace frugal;

// One way to train (or run) a model. key names it in the JSON and the SVG file names; name in the table.
struct Technique {
  std::string key, name, when;
  bool sgd = false;        // SGD with momentum 0.9 (lr x 10) instead of Adam (AdamW for gpt)
  bool adafactor = false;  // Adafactor (torch's defaults: lr 1e-2, a relative step) instead of Adam
  bool adam8bit = false;   // Adam8bit (AdamW8bit for gpt) at Adam's lr: both moments in 8 bits
  bool recompute = false;
  bool selective_recompute = false;  // gpt: every block keeps its GEMMs' results (Note [selective recompute])
  bool step_in_backward = false;     // optim::StepInBackward: each gradient freed once its update is done
  std::optional<DType> autocast = std::nullopt;  // f16 also brings a GradScaler
  int accum = 1;                                 // micro-batches per step, each batch / accum
  bool bf16_parameters = false;                  // model->to(BF16), the optimizer with f32 master weights
  bool sparse_adam = false;                      // gpt: sparse token-embedding gradients, SparseAdam for them
  // The loader's batches in this dtype (f32 otherwise). An f32 model's matmul refuses f16/bf16 inputs (the
  // library does not promote across dtypes), so 16-bit batches go with autocast or 16-bit parameters.
  std::optional<DType> data_dtype = std::nullopt;
  bool inference = false;  // forward only, under InferenceMode
};

inline bool is_gpt(const std::string& model) { return model == "gpt"; }

// The techniques that apply to `model` ("mlp", "cnn" or "gpt"), the baseline first. SparseAdam is for
// embeddings (gpt only); 16-bit data loading is for floating inputs (not gpt's token ids).
inline std::vector<Technique> techniques_for(const std::string& model) {
  FRUGAL_CHECK(model == "mlp" || model == "cnn" || model == "gpt", "--model ", model,
               ": unknown model; valid: mlp (W1), cnn (W2), gpt (W3)");
  const bool gpt = is_gpt(model);
  std::vector<Technique> all;
  all.push_back({.key = "baseline",
                 .name = gpt ? "baseline (f32, AdamW)" : "baseline (f32, Adam)",
                 .when = "the reference: f32 everywhere, Adam's two moments per parameter"});
  all.push_back({.key = "sgd_momentum",
                 .name = "SGD with momentum",
                 .when = "one state tensor per parameter instead of Adam's two; needs its own lr (here 10x)",
                 .sgd = true});
  all.push_back({.key = "adafactor",
                 .name = "Adafactor",
                 .when = "optimizer state O(rows + columns) a matrix instead of Adam's two full moments; "
                         "relative step sizes",
                 .adafactor = true});
  all.push_back({.key = "adam8bit",
                 .name = gpt ? "AdamW 8-bit" : "Adam 8-bit",
                 .when =
                     "Adam's two moments as 8-bit codes with an f32 scale per 2048 (bitsandbytes' block-wise "
                     "dynamic quantisation): about a quarter of Adam's state",
                 .adam8bit = true});
  all.push_back({.key = "recompute",
                 .name = "recompute segments",
                 .when = "activations dominate: keeps segment inputs only, pays a second forward in backward",
                 .recompute = true});
  if (gpt)
    all.push_back({.key = "selective_recompute",
                   .name = "selective recompute",
                   .when = "keeps the GEMMs' results, runs the norms, activations and adds again: saves "
                           "where those keep more than the GEMMs' inputs (not in this GPT, whose fused ops "
                           "keep only those)",
                   .selective_recompute = true});
  all.push_back({.key = "step_in_backward",
                 .name = "step in backward",
                 .when =
                     "each update runs as soon as its gradient is complete, which is freed then: lowers a "
                     "peak that falls at the end of backward",
                 .step_in_backward = true});
  all.push_back({.key = "recompute_step_in_backward",
                 .name = "recompute + step in backward",
                 .when = "both: once recompute has removed most activations, the parameters' gradients "
                         "can be much of the peak, and are freed one by one (bench/workloads W4rg)",
                 .recompute = true,
                 .step_in_backward = true});
  all.push_back({.key = "bf16_autocast",
                 .name = "bf16 autocast",
                 .when = "bf16 matmuls where the hardware has them; the GEMM outputs kept for backward halve",
                 .autocast = DType::BF16});
  all.push_back({.key = "f16_autocast_grad_scaler",
                 .name = "f16 autocast + GradScaler",
                 .when = "hardware with fast f16 but not bf16 (older GPUs); the scaler guards the gradients",
                 .autocast = DType::F16});
  all.push_back({.key = "grad_accumulation",
                 .name = "gradient accumulation (batch/4 x 4)",
                 .when = "the batch's activations do not fit: a quarter at a time, same gradient; .grad "
                         "stays live all step",
                 .accum = 4});
  all.push_back({.key = "bf16_parameters_master_weights",
                 .name = "bf16 parameters, f32 master weights",
                 .when = "halves parameters, gradients and activations; the f32 copy moves to the optimizer",
                 .bf16_parameters = true});
  if (gpt)
    all.push_back({.key = "sparse_adam",
                   .name = "SparseAdam for the embeddings",
                   .when = "large vocabularies: the embedding's gradient holds only the rows a batch uses",
                   .sparse_adam = true});
  if (!gpt)
    all.push_back({.key = "bf16_data",
                   .name = "f16/bf16 data loading",
                   .when = "input batches made in bf16, not f32, under bf16 autocast: compare with that row",
                   .autocast = DType::BF16,
                   .data_dtype = DType::BF16});
  all.push_back({.key = "inference",
                 .name = "inference (InferenceMode)",
                 .when = "serving or evaluation only: forward under InferenceMode, no backward, no optimizer",
                 .inference = true});
  all.push_back({.key = "recompute_bf16_accumulation",
                 .name = "recompute + bf16 + accumulation",
                 .when = "the tightest fit: the three savings together, at the cost of each",
                 .recompute = true,
                 .autocast = DType::BF16,
                 .accum = 4});
  return all;
}

// A technique's figures, all from its own run.
struct Row {
  Technique technique;
  int64_t steps = 0;
  int64_t peak = 0;  // memory::stats().allocated.peak after the run (exact bytes)
  std::array<int64_t, memory::kNumCategories> at_peak{};         // by category at that peak; adds up to it
  std::array<int64_t, memory::kNumCategories> category_peaks{};  // each category's own peak
  double median_step_ms = 0;  // over the steps after the first (the first when it is the only one)
  double loss = 0;            // of the last step
  std::vector<double> losses;
  int64_t estimated_peak = -1;  // the dry run's prediction of `peak` (Workload::estimate); -1: not made
};

// The sizes and the seed. The defaults are the workloads' (W1 batch 128, W2 64, W3 32 windows of 64 bytes,
// 4 blocks of width 128); tests shrink them.
struct Config {
  std::string model = "mlp";
  int64_t steps = 20;
  int64_t batch = 0;  // 0: the workload's
  uint64_t seed = 0;
  double lr = 1e-3;
  int64_t layers = 4, width = 128, heads = 4, context = 64;  // gpt
  std::string data_dir;                                      // "": the Debian package's folder
};

// A workload's data, loaded once (tagged "dataset", so it shows as data in every run that it stays live
// through), and the runs of techniques on it.
class Workload {
 public:
  explicit Workload(Config config) : cfg_(std::move(config)) {
    std::ignore = techniques_for(cfg_.model);  // checks the model's name
    FRUGAL_CHECK(cfg_.steps >= 1, "--steps ", cfg_.steps, ": give at least 1 step");
    if (cfg_.batch == 0) cfg_.batch = is_gpt(cfg_.model) ? 32 : cfg_.model == "mlp" ? 128 : 64;
    FRUGAL_CHECK(cfg_.batch % 4 == 0, "batch ", cfg_.batch,
                 " must be a multiple of 4 (gradient accumulation splits it in 4)");
    memory::Tag tag("dataset");
    if (is_gpt(cfg_.model)) {
      text_ = std::make_unique<data::TextDataset>(
          data::TextDatasetOptions()
              .root(cfg_.data_dir.empty() ? std::string(data::kFortunesRoot) : cfg_.data_dir)
              .context(cfg_.context));
    } else {
      images_ = std::make_shared<data::FashionMNIST>(
          cfg_.data_dir.empty() ? std::string(data::kFashionMNISTRoot) : cfg_.data_dir);
      const auto [mean, std] = images_->pixel_stats();
      images_->normalize(mean, std);
    }
  }

  const Config& config() const { return cfg_; }

  // The peak run(t) will measure, predicted by a dry run of the same steps on the meta device
  // (core/estimate.h) from the same fresh state, the data's batches stand-ins of their shapes
  // (fmnist::dry_loader, chargpt::dry_sample_batch). Milliseconds, nothing trained.
  int64_t estimate(const Technique& t) const {
    memory::empty_cache();
    std::vector<double> losses, step_ms;
    const memory::Estimate e = memory::estimate(
        [&](Device) {
          if (is_gpt(cfg_.model))
            run_gpt(t, losses, step_ms);
          else
            run_fmnist(t, losses, step_ms);
        },
        memory::EstimateOptions().from(kCPU));
    return std::max(e.source_peak, e.peak_allocated);
  }

  // Runs cfg.steps steps of `t` in a fresh state (the cache emptied, the peaks reset, the same seed and data
  // order, model and optimizer made inside) while a memory::History records; `record` receives it.
  Row run(const Technique& t, memory::HistoryRecord* record = nullptr) const {
    memory::empty_cache();
    memory::reset_peak();
    memory::allocator(kCPU).reset_tag_peaks();
    Row row;
    row.technique = t;
    std::vector<double> step_ms;
    {
      memory::History history(kCPU);
      FRUGAL_CHECK(history.owns(),
                   "techniques::Workload::run: a memory history is already recording; its "
                   "events would mix with this run's");
      if (is_gpt(cfg_.model))
        run_gpt(t, row.losses, step_ms);
      else
        run_fmnist(t, row.losses, step_ms);
    }
    const memory::HistoryRecord r = memory::history(kCPU);
    const memory::PeakBreakdown peak = memory::peak_by_category(r);
    row.steps = int64_t(row.losses.size());
    row.peak = memory::stats().allocated.peak;
    FRUGAL_CHECK(peak.total == row.peak, "techniques: the history's peak (", peak.total,
                 " bytes) is not the allocator's (", row.peak, ")");
    row.at_peak = peak.by_category;
    row.category_peaks = peak.category_peaks;
    row.loss = row.losses.empty() ? 0.0 : row.losses.back();
    std::vector<double> timed(step_ms.begin() + (step_ms.size() > 1 ? 1 : 0), step_ms.end());
    std::sort(timed.begin(), timed.end());
    row.median_step_ms = timed.empty() ? 0.0 : timed[timed.size() / 2];
    if (record) *record = r;
    return row;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static double ms_since(Clock::time_point& t0) {
    const Clock::time_point now = Clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - t0).count();
    t0 = now;
    return ms;
  }

  // W1/W2 through the trainer's own epoch loop (fmnist::train_epoch), epochs after epochs until cfg.steps.
  void run_fmnist(const Technique& t, std::vector<double>& losses, std::vector<double>& step_ms) const {
    manual_seed(cfg_.seed);
    nn::Sequential model{nullptr};
    {
      memory::Tag tag("parameters");
      model = cfg_.model == "mlp" ? fmnist::make_mlp() : fmnist::make_cnn();
      if (t.bf16_parameters) model->to(DType::BF16);
    }
    if (t.recompute) model->recompute_every(2);
    // prefetch(0): the batches are made in this thread, so the peak does not depend on a worker's timing.
    // bf16 parameters take bf16 inputs. A dry run (estimate) reads stand-ins of the same shapes.
    const DType input = t.data_dtype.value_or(t.bf16_parameters ? DType::BF16 : DType::F32);
    data::DataLoader real(images_, data::DataLoaderOptions()
                                       .batch_size(cfg_.batch / t.accum)
                                       .shuffle(true)
                                       .seed(cfg_.seed)
                                       .drop_last(true)
                                       .prefetch(0)
                                       .dtype(input));
    const bool dry = model->parameters().front().device().is_meta();
    const std::unique_ptr<data::DataLoader> stand_in = dry ? fmnist::dry_loader(real) : nullptr;
    data::DataLoader& loader = dry ? *stand_in : real;
    Clock::time_point t0 = Clock::now();
    if (t.inference) {
      InferenceMode no_record;
      model->eval();
      int64_t epoch = 0;
      loader.begin_epoch(epoch);
      for (int64_t s = 0; s < cfg_.steps; ++s) {
        std::optional<data::Batch> b = loader.next();
        if (!b) {
          loader.begin_epoch(++epoch);
          b = loader.next();
        }
        memory::Tag tag("activations");
        losses.push_back(
            memory::item_or(nn::functional::cross_entropy(model->forward(b->input), b->target), 0.0));
        step_ms.push_back(ms_since(t0));
      }
      return;
    }
    std::unique_ptr<optim::Optimizer> opt;
    if (t.sgd)
      opt = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions(cfg_.lr * 10).momentum(0.9));
    else if (t.adafactor)
      opt = std::make_unique<optim::Adafactor>(model->parameters(), optim::AdafactorOptions());
    else if (t.adam8bit)
      opt = std::make_unique<optim::Adam8bit>(model->parameters(), optim::Adam8bitOptions(cfg_.lr));
    else
      opt = std::make_unique<optim::Adam>(model->parameters(),
                                          optim::AdamOptions(cfg_.lr).master_weights(t.bf16_parameters));
    std::optional<optim::StepInBackward> in_backward;
    if (t.step_in_backward) in_backward.emplace(*opt);
    fmnist::Precision precision(t.autocast);
    for (int64_t epoch = 0; int64_t(losses.size()) < cfg_.steps; ++epoch) {
      const std::vector<double> l = fmnist::train_epoch(
          *model, *opt, loader, epoch, cfg_.steps - int64_t(losses.size()), t.accum,
          [&](int64_t, int64_t, const fmnist::StepResult&) { step_ms.push_back(ms_since(t0)); }, &precision);
      FRUGAL_CHECK(!l.empty(), "techniques: an epoch of ", loader.num_batches(), " batches makes no step");
      losses.insert(losses.end(), l.begin(), l.end());
    }
  }

  // W3: the model and the step of chargpt::Trainer (its optimizer swapped where the technique says), without
  // its learning-rate schedule.
  void run_gpt(const Technique& t, std::vector<double>& losses, std::vector<double>& step_ms) const {
    manual_seed(cfg_.seed);
    nn::GPTConfig gc;
    gc.vocab = text_->vocab_size();
    gc.d_model = cfg_.width;
    gc.n_layers = cfg_.layers;
    gc.n_heads = cfg_.heads;
    gc.context = cfg_.context;
    gc.sparse_embeddings = t.sparse_adam;
    nn::GPT model{nullptr};
    {
      memory::Tag tag("parameters");
      model = nn::GPT(gc);
      if (t.bf16_parameters) model->to(DType::BF16);
    }
    model->recompute(t.recompute);
    if (t.selective_recompute) model->recompute_blocks(0, cfg_.layers);
    Generator batches(cfg_.seed + 1);
    // A dry run (estimate) draws stand-ins of the batches' shapes.
    const bool dry = model->head->weight.device().is_meta();
    auto sample = [&](int64_t n) {
      return dry ? chargpt::dry_sample_batch(*text_, n, batches) : text_->sample_batch(n, batches);
    };
    Clock::time_point t0 = Clock::now();
    if (t.inference) {
      InferenceMode no_record;
      model->eval();
      for (int64_t s = 0; s < cfg_.steps; ++s) {
        const data::Batch b = sample(cfg_.batch);
        memory::Tag tag("activations");
        losses.push_back(memory::item_or(chargpt::lm_loss(model->forward(b.input), b.target), 0.0));
        step_ms.push_back(ms_since(t0));
      }
      return;
    }
    std::vector<Tensor> dense, sparse;
    for (auto& [name, p] : model->named_parameters())
      (t.sparse_adam && name == "tok_emb.weight" ? sparse : dense).push_back(p);
    std::unique_ptr<optim::Optimizer> opt, sparse_opt;
    if (t.sgd)
      opt = std::make_unique<optim::SGD>(dense, optim::SGDOptions(cfg_.lr * 10).momentum(0.9));
    else if (t.adafactor)
      opt = std::make_unique<optim::Adafactor>(dense, optim::AdafactorOptions());
    else if (t.adam8bit)
      opt = std::make_unique<optim::AdamW8bit>(dense, optim::AdamW8bitOptions(cfg_.lr));
    else
      opt = std::make_unique<optim::AdamW>(dense,
                                           optim::AdamWOptions(cfg_.lr).master_weights(t.bf16_parameters));
    if (!sparse.empty())
      sparse_opt = std::make_unique<optim::SparseAdam>(sparse, optim::SparseAdamOptions(cfg_.lr));
    amp::GradScaler scaler(amp::GradScalerOptions().enabled(t.autocast == DType::F16));
    std::optional<optim::StepInBackward> in_backward;
    if (t.step_in_backward) in_backward.emplace(*opt);
    for (int64_t s = 0; s < cfg_.steps; ++s) {
      opt->zero_grad();
      if (sparse_opt) sparse_opt->zero_grad();
      double loss_sum = 0;
      for (int m = 0; m < t.accum; ++m) {
        const data::Batch b = sample(cfg_.batch / t.accum);
        Tensor loss;
        {
          memory::Tag tag("activations");
          amp::Autocast autocast(t.autocast.value_or(DType::BF16), t.autocast.has_value());
          loss = chargpt::lm_loss(model->forward(b.input), b.target) * (1.0 / double(t.accum));
        }
        memory::Tag tag("backward");
        scaler.scale(loss).backward();
        loss_sum += memory::item_or(loss, 0.0);
      }
      {
        memory::Tag tag("optimizer step");
        scaler.step(*opt);
        if (sparse_opt) scaler.step(*sparse_opt);
        scaler.update();
      }
      losses.push_back(loss_sum);
      step_ms.push_back(ms_since(t0));
    }
  }

  Config cfg_;
  std::shared_ptr<data::FashionMNIST> images_;
  std::unique_ptr<data::TextDataset> text_;
};

// The figures as the table prints them (the test reads them back the same way).
inline std::string bytes_cell(int64_t bytes) { return memory::format_bytes(bytes); }
inline std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}
inline const Row& baseline_of(const std::vector<Row>& rows) {
  FRUGAL_CHECK(!rows.empty() && rows.front().technique.key == "baseline",
               "techniques: the first row must be the baseline");
  return rows.front();
}
inline double peak_ratio(const Row& r, const Row& base) { return double(r.peak) / double(base.peak); }
inline double time_ratio(const Row& r, const Row& base) {
  return base.median_step_ms > 0 ? r.median_step_ms / base.median_step_ms : 0.0;
}

// A Markdown table, one line per row; the baseline (rows[0]) gives the ratios and the loss beside.
inline std::string markdown_table(const std::vector<Row>& rows) {
  const Row& base = baseline_of(rows);
  std::string s = "| technique |";
  auto cell = [&s](const std::string& v) {
    s += ' ';
    s += v;
    s += " |";
  };
  cell("peak");
  cell("peak ÷ baseline");
  for (int c = 0; c < memory::kNumCategories; ++c) cell(memory::category_name(memory::Category(c)));
  for (const char* h : {"step ms", "time ÷ baseline", "loss", "baseline loss", "when to use"}) cell(h);
  s += "\n|---|";
  for (int c = 0; c < memory::kNumCategories + 7; ++c)
    s += c == memory::kNumCategories + 6 ? "---|" : "---:|";
  s += "\n";
  for (const Row& r : rows) {
    s += '|';
    cell(r.technique.name);
    cell(bytes_cell(r.peak));
    cell(fixed(peak_ratio(r, base), 2));
    for (int64_t b : r.at_peak) cell(bytes_cell(b));
    cell(fixed(r.median_step_ms, 1));
    cell(fixed(time_ratio(r, base), 2));
    cell(fixed(r.loss, 4));
    cell(fixed(base.loss, 4));
    cell(r.technique.when);
    s += '\n';
  }
  return s;
}

// Note [timing drift]
// The techniques run one after another, so a change in the machine's load between two runs (another program
// starting) moves their time ratios. The program runs the baseline once more after the others: when its
// median step differs from the first run's by more than kTimingDrift, the report says that the time ratios
// are unreliable. Its bytes must be the same (each run starts fresh); the note says so if not.
inline constexpr double kTimingDrift = 0.2;
inline std::string timing_note(const Row& first, const Row& again) {
  std::string note;
  if (again.peak != first.peak)
    note += "the baseline's peak was " + std::to_string(first.peak) + " bytes first and " +
            std::to_string(again.peak) + " bytes again: a run did not start fresh (a bug). ";
  const double drift = first.median_step_ms > 0 ? again.median_step_ms / first.median_step_ms - 1 : 0;
  if (drift > kTimingDrift || drift < -kTimingDrift)
    note += "the baseline's median step was " + fixed(first.median_step_ms, 1) + " ms first and " +
            fixed(again.median_step_ms, 1) +
            " ms again, after the others: the machine's load changed, and the time ratios are unreliable.";
  return note;
}

// What the dry runs predicted: "dry run: the estimated peak equals the measured one for all N techniques", or
// the techniques whose estimate differs, with both figures.
inline std::string estimate_line(const std::vector<Row>& rows) {
  std::string differ;
  for (const Row& r : rows)
    if (r.estimated_peak != r.peak)
      differ += frugal::detail::str_cat(differ.empty() ? "" : ", ", r.technique.key, " (estimated ",
                                        r.estimated_peak, ", measured ", r.peak, ")");
  return differ.empty()
             ? frugal::detail::str_cat("dry run: the estimated peak equals the measured one for all ",
                                       rows.size(), " techniques")
             : "dry run: the estimate differs for " + differ;
}

// The same figures for machines: exact bytes, unrounded times and losses; with `again` (the baseline run
// once more, Note [timing drift]), its figures and the note.
inline nlohmann::json to_json(const std::vector<Row>& rows, const Config& cfg, const Row* again = nullptr) {
  const Row& base = baseline_of(rows);
  nlohmann::json out = {{"model", cfg.model}, {"steps", cfg.steps}, {"batch", cfg.batch}, {"seed", cfg.seed}};
  if (again)
    out["baseline_again"] = {{"peak_bytes", again->peak},
                             {"median_step_ms", again->median_step_ms},
                             {"note", timing_note(base, *again)}};
  out["techniques"] = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json cats = nlohmann::json::object(), own = nlohmann::json::object();
    for (int c = 0; c < memory::kNumCategories; ++c) {
      cats[memory::category_name(memory::Category(c))] = r.at_peak[size_t(c)];
      own[memory::category_name(memory::Category(c))] = r.category_peaks[size_t(c)];
    }
    out["techniques"].push_back({{"key", r.technique.key},
                                 {"name", r.technique.name},
                                 {"when", r.technique.when},
                                 {"steps", r.steps},
                                 {"peak_bytes", r.peak},
                                 {"estimated_peak_bytes", r.estimated_peak},
                                 {"peak_by_category", cats},
                                 {"category_peaks", own},
                                 {"peak_ratio", peak_ratio(r, base)},
                                 {"median_step_ms", r.median_step_ms},
                                 {"step_time_ratio", time_ratio(r, base)},
                                 {"loss", r.loss},
                                 {"baseline_loss", base.loss},
                                 {"losses", r.losses}});
  }
  return out;
}

}  // namespace techniques

// train_chargpt: trains workload W3 of shared/WORKLOADS.md, a character-level GPT, on the English fortunes
// (Debian's `fortunes`), with a progress line, a validation loss on the held-out tail of the corpus, a sample
// of generated text at the end, and where the memory went; its last lines are `peak_allocated_bytes=N` (the
// arena's exact peak) and `validation_loss=X.XXXX` (the last validation loss).
//
//   build/examples/train_chargpt --steps 2000
//   build/examples/train_chargpt --steps 200 --recompute --sparse-embeddings
//   build/examples/train_chargpt --steps 200 --amp bf16
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

#include "chargpt.h"

using namespace frugal;

namespace {

// The start line's words for a plan's recompute: ", recompute 2 blocks + 1 selectively", or "" for none.
std::string recompute_summary(int64_t whole, int64_t selective) {
  std::string s;
  if (whole > 0) s += ", recompute " + std::to_string(whole) + (whole == 1 ? " block" : " blocks");
  if (selective > 0)
    s += (whole > 0 ? " + " : ", selective recompute of ") + std::to_string(selective) +
         (whole > 0 ? " selectively" : (selective == 1 ? " block" : " blocks"));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train workload W3 (a character-level GPT) on the fortunes corpus with frugal"};
  chargpt::Options o;
  int64_t eval_every = 100, sample_bytes = 200, top_k = 20;
  int threads = 0;
  bool profile = false;
  double temperature = 0.8;
  std::string memory_limit, save, resume, memory_trace, data_dir = data::kFortunesRoot, amp_name = "f32";
  const CLI::Validator byte_count(examples::check_byte_count, "BYTES");
  const CLI::Validator finite_positive(examples::check_finite_positive, "POSITIVE");
  const CLI::Validator positive(examples::integer_in(1, INT32_MAX), "INT >= 1");
  app.add_option("--layers", o.layers, "transformer blocks")->check(positive);
  app.add_option("--width", o.width, "model width d")->check(positive);
  app.add_option("--heads", o.heads, "attention heads (must divide the width)")->check(positive);
  app.add_option("--context", o.context, "tokens per window")->check(positive);
  app.add_option("--batch", o.batch, "windows per step")->check(positive);
  app.add_option("--steps", o.steps, "optimizer steps")
      ->check(CLI::Validator(examples::integer_in(1, 1000000000), "[1, 10^9]"));
  app.add_option("--lr", o.lr, "learning rate (finite, > 0; Adafactor's largest relative step)")
      ->check(finite_positive);
  app.add_option(
         "--optimizer", o.optimizer,
         "adamw, adafactor (factored second moment: O(rows + columns) state a matrix), adamw8bit "
         "(both moments in 8 bits: about 2 bytes of state a parameter), or adamw8bit-float8 (the same "
         "in the float8 codes: a faster update)")
      ->check(CLI::IsMember({"adamw", "adafactor", "adamw8bit", "adamw8bit-float8"}));
  app.add_option("--accum", o.accum, "micro-batches per step (gradient accumulation)")->check(positive);
  CLI::Option* whole = app.add_flag("--recompute", o.recompute,
                                    "run each block as a recompute segment (less activation memory)");
  app.add_flag(
         "--selective-recompute", o.selective_recompute,
         "run each block as a recompute segment that keeps its GEMMs' results: backward recomputes only "
         "norms, activations and adds (saves memory where those keep more than the GEMMs' inputs; this "
         "GPT's fused ops keep only those, so here it keeps a little more than no recompute)")
      ->excludes(whole);
  app.add_flag(
      "--ddp", o.ddp,
      "data-parallel over the processes mpirun starts (mpirun -np N train_chargpt --ddp): --batch is "
      "the global batch, each rank trains on its share and the gradients are averaged; only rank 0 "
      "prints");
  app.add_option(
         "--bucket-mb", o.bucket_mb,
         "with --ddp: MiB of gradients reduced at once; smaller buckets start during backward, sooner")
      ->check(CLI::PositiveNumber);
  app.add_flag("--zero", o.zero,
               "with --ddp and --optimizer adamw: each rank keeps only its 1/N share of the optimizer state "
               "(ZeRO-1)");
  app.add_flag("--step-in-backward", o.step_in_backward,
               "update each parameter during backward as soon as its gradient is complete, and free that "
               "gradient at once (optim::StepInBackward; not with --accum, --clip, --sparse-embeddings or "
               "--amp f16)");
  app.add_flag("--sparse-embeddings", o.sparse_embeddings,
               "sparse gradients for the token embedding, updated by SparseAdam (AdamW for the rest)");
  app.add_option("--amp", amp_name,
                 "mixed precision: bf16 or f16 autocast (f16 with a loss scaler), or f32 (off)")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}));
  app.add_option("--clip", o.clip, "clip the gradient norm to this (0: off)")->check(CLI::NonNegativeNumber);
  app.add_option("--memory-limit", memory_limit, "arena limit, e.g. 64M: beyond it, OutOfMemoryError")
      ->check(byte_count);
  app.add_option("--save", save,
                 "write the weights here (and the training state to <path>.state) at the end");
  app.add_option("--resume", resume, "continue from a checkpoint written by --save");
  app.add_option("--threads", threads, "CPU threads (default, or 0: all cores)")
      ->check(CLI::Validator(examples::integer_in(0, INT32_MAX), "INT >= 0"));
  app.add_option("--seed", o.seed, "seed for the initial weights and the batches")
      ->check(CLI::Validator(examples::check_seed, "[0, 2^64 - 1]"));
  app.add_option("--data", data_dir, "folder of text files (default: Debian's fortunes)");
  app.add_option("--eval-every", eval_every, "steps between validation losses (and one after the last step)")
      ->check(CLI::Validator(examples::integer_in(1, INT64_MAX), "INT >= 1"));
  app.add_option("--sample", sample_bytes, "bytes of text to generate at the end (0: none, at most 100000)")
      ->check(CLI::Validator(examples::integer_in(0, 100000), "[0, 100000]"));
  app.add_option("--temperature", temperature, "sampling temperature (finite, > 0)")->check(finite_positive);
  app.add_option("--top-k", top_k, "sample among the k likeliest bytes (0, or more than the vocabulary: all)")
      ->check(CLI::Validator(examples::integer_in(0, INT64_MAX), "INT >= 0"));
  app.add_option("--memory-trace", memory_trace,
                 "write the memory history of steps 3-5 as a Chrome trace here (ui.perfetto.dev) and an SVG "
                 "picture beside it (the extension replaced by .svg)");
  app.add_flag("--profile", profile, "time every op (forward and backward) and print the table at the end");
  bool estimate = false, allow_low_precision = false;
  std::string memory_budget;
  app.add_option(
         "--memory-budget", memory_budget,
         "train within this many bytes (e.g. 48M): a dry run per candidate picks the fastest mix of "
         "micro-batches, recomputed blocks and stepping in backward (where --clip, --sparse-embeddings and "
         "--amp f16 are off) that fits (memory::plan), prints it, then trains under it with the arena "
         "limit set to the budget; overrides --accum and --recompute")
      ->check(CLI::Validator(examples::check_byte_count, "BYTES"));
  app.add_flag("--allow-low-precision", allow_low_precision,
               "with --memory-budget: the plan may also choose bf16 autocast");
  app.add_flag("--estimate", estimate,
               "predict the run's peak memory with a dry run on the meta device (no training, no model in "
               "memory): print it by category and a last line estimated_peak_bytes=N, then exit");
  CLI11_PARSE(app, argc, argv);
  examples::line_buffered_stdout();
  // Under --ddp: one process of several (dist/dist.h); only rank 0 prints, an error on any rank stops all.
  std::optional<dist::Guard> dist_guard;
  if (o.ddp && !examples::start_ddp(dist_guard)) return 1;

  // Made before the try: the out-of-memory handler below plans a run that fits, which needs the corpus.
  std::unique_ptr<data::TextDataset> train, val;
  std::function<memory::Plan(int64_t)> plan_for;
  try {
    if (threads > 0) set_num_threads(threads);
    if (!memory_limit.empty()) memory::set_memory_limit(kCPU, memory::parse_bytes(memory_limit));
    // The budget holds from the start, the data's loading included, as a --memory-limit of that size would.
    if (!memory_budget.empty()) memory::set_memory_limit(kCPU, memory::parse_bytes(memory_budget));
    if (!save.empty()) examples::check_can_write("--save", save);
    examples::MemoryTrace trace(memory_trace);
    examples::RunProfile run_profile(profile);
    FRUGAL_CHECK(!o.ddp || (!estimate && memory_budget.empty()),
                 "--estimate and --memory-budget size one process: not with --ddp yet");
    FRUGAL_CHECK(!o.zero || o.ddp, "--zero shards the optimizer over the --ddp ranks: add --ddp");
    if (amp_name == "bf16") o.autocast = DType::BF16;
    if (amp_name == "f16") o.autocast = DType::F16;
    {
      memory::Tag tag("dataset");
      train =
          std::make_unique<data::TextDataset>(data::TextDatasetOptions().root(data_dir).context(o.context));
      val = std::make_unique<data::TextDataset>(
          data::TextDatasetOptions().root(data_dir).context(o.context).split(data::TextSplit::Validation));
    }
    // Three steps (the second holds the optimizer's state, the third repeats it) and one validation, as the
    // run makes them, on the meta device (core/estimate.h). The sample generated at the end (--sample) is
    // not estimated: one sequence, without a tape, far below a training step.
    auto dry_run = [&](chargpt::Options opts) {
      opts.ddp = opts.zero = false;  // a dry run sizes one process (--ddp refuses --estimate and budgets)
      chargpt::Trainer dry(opts, train->vocab_size());
      for (int64_t step = 0; step < std::min<int64_t>(opts.steps, 3); ++step) dry.train_step(*train);
      chargpt::validation_loss(*dry.model, *val, opts.batch, 8, opts.autocast, opts.accum);
    };
    // The run as a plan shapes it, and the plan for a budget (memory::plan, core/plan.h).
    auto shaped = [o](const memory::PlanChoice& c) {
      chargpt::Options p = o;
      p.accum = c.micro_batches;
      p.recompute = p.selective_recompute = false;
      p.recompute_blocks = c.recompute_blocks;
      p.selective_blocks = c.selective_blocks;
      p.step_in_backward = o.step_in_backward || c.step_in_backward;
      if (c.low_precision) p.autocast = DType::BF16;
      return p;
    };
    // The plan may step in backward where the run allows it (Note [stepping in backward]).
    const bool may_step_in_backward = !o.step_in_backward && o.clip == 0 && !o.sparse_embeddings &&
                                      o.autocast != std::optional<DType>(DType::F16);
    plan_for = [=](int64_t budget) {
      return memory::plan(
          [&](Device, const memory::PlanChoice& c) { dry_run(shaped(c)); }, budget,
          memory::PlanSpace()
              // Stepping in backward: no accumulation (recompute goes with it).
              .blocks(int(o.layers))
              .micro_batches(o.step_in_backward ? std::vector<int>{1} : examples::micro_batch_counts(o.batch))
              .low_precision(allow_low_precision)
              .selective(true)
              .step_in_backward(may_step_in_backward)
              .from(kCPU));
    };
    if (!memory_budget.empty()) {
      const memory::Plan plan = plan_for(memory::parse_bytes(memory_budget));
      if (!examples::report_plan(plan, "a smaller --batch or --context")) return 1;
      o = shaped(plan.choice);
    }
    if (estimate) {
      const memory::Estimate e =
          memory::estimate([&](Device) { dry_run(o); }, memory::EstimateOptions().from(kCPU));
      std::printf("%s", e.summary().c_str());
      std::printf("estimated_peak_bytes=%lld\n",
                  static_cast<long long>(std::max(e.source_peak, e.peak_allocated)));
      return e.fits() ? 0 : 1;
    }
    chargpt::Trainer trainer(o, train->vocab_size());
    nn::GPTImpl& model = *trainer.model;
    if (!resume.empty()) {
      trainer.load(resume);
      std::printf("resumed from %s at step %lld\n", resume.c_str(), static_cast<long long>(trainer.step()));
    }
    std::printf(
        "frugal: training a GPT (%lld layers, width %lld, %lld heads, context %lld, vocab %lld; %lld "
        "parameters, %s), %s, batch %lld, accum %d%s%s, %s%s, %d threads\n",
        static_cast<long long>(o.layers), static_cast<long long>(o.width), static_cast<long long>(o.heads),
        static_cast<long long>(o.context), static_cast<long long>(train->vocab_size()),
        static_cast<long long>(model.num_parameters()), memory::format_bytes(model.parameter_bytes()).c_str(),
        o.optimizer.c_str(), static_cast<long long>(o.batch), o.accum,
        o.recompute             ? ", recompute"
        : o.selective_recompute ? ", selective recompute"
                                : recompute_summary(o.recompute_blocks, o.selective_blocks).c_str(),
        o.sparse_embeddings ? ", sparse embeddings" : "", o.autocast ? "autocast " : "",
        o.autocast ? dtype_name(*o.autocast) : "f32", num_threads());

    const bool tty = isatty(STDOUT_FILENO);
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t start = trainer.step();
    std::vector<double> step_ms;
    double loss_avg = 0;
    double validation = NAN;  // the latest validation loss, the run's last line
    for (int64_t step = start; step < o.steps; ++step) {
      const auto ts = std::chrono::steady_clock::now();
      const double loss = trainer.train_step(*train);
      examples::check_finite_loss(loss, step + 1, "try a lower --lr or --clip 1");
      step_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ts).count());
      loss_avg = step == start ? loss : 0.95 * loss_avg + 0.05 * loss;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double tok_s = double((step - start + 1) * o.batch * o.context) / secs;
      const double eta = secs / double(step - start + 1) * double(o.steps - step - 1);
      if (tty) {
        std::printf("\rstep %lld/%lld loss %.4f %.0f tokens/s ETA %.0fs   ", static_cast<long long>(step + 1),
                    static_cast<long long>(o.steps), loss_avg, tok_s, eta);
        std::fflush(stdout);
      }
      if ((step + 1) % eval_every == 0 || step + 1 == o.steps) {
        const double v = validation = chargpt::validation_loss(model, *val, o.batch, 8, o.autocast, o.accum);
        std::printf("%sstep %lld: train loss %.4f, validation loss %.4f, %.0f tokens/s\n", tty ? "\r" : "",
                    static_cast<long long>(step + 1), loss_avg, v, tok_s);
      }
      trace.after_step(step - start + 1);
    }
    trace.finish(o.steps - start);
    if (!step_ms.empty()) {
      std::vector<double> sorted(step_ms.begin() + std::min<size_t>(5, step_ms.size() - 1), step_ms.end());
      std::sort(sorted.begin(), sorted.end());
      std::printf("median step %.2f ms (after 5 warm-up steps)\n", sorted[sorted.size() / 2]);
    }
    if (!save.empty()) trainer.save(save, train->vocabulary());

    if (sample_bytes > 0) {
      memory::Tag tag("inference");  // the report counts the sample's bytes as activations, not "other"
      Generator gen(o.seed + 2);
      const Tensor prompt = train->encode("\n");
      const Tensor out =
          model.generate(prompt, sample_bytes, temperature, std::min(top_k, train->vocab_size()), &gen);
      std::printf("\nsample:\n%s\n", train->decode(out.narrow(-1, 1, sample_bytes)).c_str());
    }
    run_profile.finish();
    std::printf("\n%s", examples::memory_report().c_str());
    std::printf("peak_allocated_bytes=%lld\n", static_cast<long long>(memory::stats().allocated.peak));
    if (const dist::DistributedDataParallel* ddp = trainer.ddp()) {
      std::vector<double> waits = trainer.ddp_wait_ms();
      std::sort(waits.begin(), waits.end());
      std::printf(
          "ddp: %d ranks, %lld buckets, median wait for the reductions at the end of backward %.2f ms, "
          "reduced_bytes_per_step=%lld (gradients %lld), optimizer_state_bytes_per_rank=%lld\n",
          dist::world_size(), static_cast<long long>(ddp->num_buckets()),
          waits.empty() ? 0.0 : waits[waits.size() / 2],
          static_cast<long long>(o.zero ? model.parameter_bytes() : ddp->last_reduced_bytes()),
          static_cast<long long>(model.parameter_bytes()),
          static_cast<long long>(trainer.optimizer_state_bytes()));
    }
    if (!std::isnan(validation)) std::printf("validation_loss=%.4f\n", validation);
    return 0;
  } catch (const OutOfMemoryError& e) {
    return examples::report_out_of_memory(
        e, "train_chargpt",
        (examples::fitting_plan_hint(plan_for) +
         "--accum N (N micro-batches a step, --batch stays the step's size), --recompute, --amp bf16, a "
         "smaller --batch or --context, or a larger --memory-limit")
            .c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    if (dist::world_size() > 1) dist::abort(1, "stopping every rank after this rank's error");
    return 1;
  }
}

// train_fmnist: trains workload W1 (MLP) or W2 (CNN) of shared/WORKLOADS.md on Fashion-MNIST, shows progress,
// the test accuracy per epoch and where the memory went, and ends with the lines `peak_allocated_bytes=N`
// (the arena's exact peak) and `test_accuracy=0.XXXX`.
//
//   build/examples/train_fmnist --model mlp --epochs 5
//   build/examples/train_fmnist --batch 4096 --memory-limit 96M --accum 8   # fits where --accum 1 does not
//   build/examples/train_fmnist --amp bf16                                    # mixed precision
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <tuple>

#include "fmnist.h"

using namespace frugal;

namespace {

// One line, redrawn in place on a terminal; otherwise a plain line every tenth of the epoch.
class Progress {
 public:
  Progress(int epoch, int epochs, int64_t steps, bool tty)
      : epoch_(epoch), epochs_(epochs), steps_(steps), tty_(tty) {}
  void update(int64_t step, double loss, double acc, double samples_per_s) {
    const double eta = samples_per_s > 0 ? double(steps_ - step) * batch_ / samples_per_s : 0;
    if (tty_) {
      const int width = 30, done = int(width * step / std::max<int64_t>(steps_, 1));
      std::printf("\repoch %d/%d [%s%s] %lld/%lld loss %.4f acc %.3f %.0f samples/s ETA %.0fs ", epoch_,
                  epochs_, std::string(size_t(done), '=').c_str(),
                  std::string(size_t(width - done), ' ').c_str(), static_cast<long long>(step),
                  static_cast<long long>(steps_), loss, acc, samples_per_s, eta);
      std::fflush(stdout);
    } else if (step == steps_ || step % std::max<int64_t>(steps_ / 10, 1) == 0) {
      std::printf("epoch %d/%d step %lld/%lld loss %.4f acc %.3f %.0f samples/s\n", epoch_, epochs_,
                  static_cast<long long>(step), static_cast<long long>(steps_), loss, acc, samples_per_s);
    }
  }
  void finish() {
    if (tty_) std::printf("\n");
  }
  void set_batch(int64_t b) { batch_ = double(b); }

 private:
  int epoch_, epochs_;
  int64_t steps_;
  bool tty_;
  double batch_ = 1;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train workload W1 (mlp) or W2 (cnn) on Fashion-MNIST with frugal"};
  std::string model_name = "mlp", optimizer = "adam", memory_limit, save, resume, memory_trace,
              data_dir = data::kFashionMNISTRoot;
  int epochs = 5, accum = 1, threads = 0;
  int64_t batch = 0, max_steps = 0;
  double lr = 1e-3;
  uint64_t seed = 0;
  bool recompute = false, normalize = true, profile = false, estimate = false, allow_low_precision = false;
  std::string memory_budget;
  std::string schedule = "cosine", amp_name = "f32";
  app.add_option("--model", model_name, "mlp (W1) or cnn (W2)")->check(CLI::IsMember({"mlp", "cnn"}));
  const CLI::Validator byte_count(examples::check_byte_count, "BYTES");
  const CLI::Validator finite_positive(examples::check_finite_positive, "POSITIVE");
  app.add_option("--epochs", epochs, "epochs to train")
      ->check(CLI::Validator(examples::integer_in(1, 100000), "[1, 100000]"));
  app.add_option("--batch", batch,
                 "batch size, at most the 60000 training images (default, or 0: 128 for mlp, 64 for cnn)")
      ->check(CLI::Validator(examples::integer_in(0, 60000), "[0, 60000]"));
  app.add_option("--lr", lr, "learning rate (finite, > 0)")->check(finite_positive);
  app.add_option(
         "--optimizer", optimizer,
         "sgd (momentum 0.9), adam, adamw, adafactor (factored second moment; --lr is its largest "
         "step), adam8bit / adamw8bit (both moments in 8 bits: about 2 bytes of state a parameter), or "
         "adam8bit-float8 / adamw8bit-float8 (the same in the float8 codes: a faster update)")
      ->check(CLI::IsMember({"sgd", "adam", "adamw", "adafactor", "adam8bit", "adamw8bit", "adam8bit-float8",
                             "adamw8bit-float8"}));
  app.add_option("--schedule", schedule, "learning rate over the run: cosine (decays to 0 per step) or none")
      ->check(CLI::IsMember({"cosine", "none"}));
  app.add_option("--accum", accum, "micro-batches per step (gradient accumulation; it divides --batch)")
      ->check(CLI::Validator(examples::integer_in(1, 60000), "[1, 60000]"));
  app.add_option("--amp", amp_name,
                 "mixed precision: bf16 or f16 autocast (f16 with a loss scaler), or f32 (off)")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}));
  app.add_flag(
      "--normalize,!--no-normalize", normalize,
      "centre and scale the pixels by the training set's mean and std (default), or keep pixel / 255");
  app.add_flag("--recompute", recompute, "recompute activations in backward instead of keeping them");
  bool ddp_flag = false;
  app.add_flag(
      "--ddp", ddp_flag,
      "data-parallel over the processes mpirun starts (mpirun -np N train_fmnist --ddp): --batch is "
      "the global batch, each rank trains on its share of every epoch (data::DistributedSampler) and "
      "the gradients are averaged; only rank 0 prints");
  bool step_in_backward = false;
  app.add_flag("--step-in-backward", step_in_backward,
               "update each parameter during backward as soon as its gradient is complete, and free that "
               "gradient at once (optim::StepInBackward; not with --accum or --amp f16)");
  app.add_option("--memory-limit", memory_limit, "arena limit, e.g. 64M or 1G: beyond it, OutOfMemoryError")
      ->check(byte_count);
  app.add_option("--save", save,
                 "write the weights here (and the training state to <path>.state) each epoch");
  app.add_option("--resume", resume, "continue from a checkpoint written by --save");
  app.add_option("--threads", threads, "CPU threads (default, or 0: all cores)")
      ->check(CLI::Validator(examples::integer_in(0, INT32_MAX), "INT >= 0"));
  app.add_option("--seed", seed, "seed for the initial weights and the shuffling")
      ->check(CLI::Validator(examples::check_seed, "[0, 2^64 - 1]"));
  app.add_option("--data", data_dir, "folder with the Fashion-MNIST files");
  app.add_option("--max-steps", max_steps,
                 "stop each epoch after this many steps (for quick runs: 0, no limit)")
      ->check(CLI::Validator(examples::integer_in(0, INT64_MAX), "INT >= 0"));
  app.add_option("--memory-trace", memory_trace,
                 "write the memory history of steps 3-5 as a Chrome trace here (ui.perfetto.dev) and an SVG "
                 "picture beside it (the extension replaced by .svg)");
  app.add_flag("--profile", profile, "time every op (forward and backward) and print the table at the end");
  app.add_option(
         "--memory-budget", memory_budget,
         "train within this many bytes (e.g. 64M): a dry run per candidate picks the fastest mix of "
         "micro-batches, recompute and stepping in backward that fits (memory::plan), prints it, then "
         "trains under it with the arena limit set to the budget; overrides --accum and --recompute")
      ->check(byte_count);
  app.add_flag("--allow-low-precision", allow_low_precision,
               "with --memory-budget: the plan may also choose bf16 autocast");
  app.add_flag("--estimate", estimate,
               "predict the run's peak memory with a dry run on the meta device (no training, no model in "
               "memory): print it by category and a last line estimated_peak_bytes=N, then exit");
  CLI11_PARSE(app, argc, argv);
  examples::line_buffered_stdout();
  // Under --ddp: one process of several (dist/dist.h); only rank 0 prints, an error on any rank stops all.
  std::optional<dist::Guard> dist_guard;
  if (ddp_flag && !examples::start_ddp(dist_guard)) return 1;
  const int ranks = ddp_flag ? dist::world_size() : 1;

  // Set once the data is loaded: the out-of-memory handler below asks it which plan would fit.
  std::function<memory::Plan(int64_t)> plan_for;
  try {
    if (threads > 0) set_num_threads(threads);
    if (!memory_limit.empty()) memory::set_memory_limit(kCPU, memory::parse_bytes(memory_limit));
    // The budget holds from the start, the data's loading included, as a --memory-limit of that size would.
    if (!memory_budget.empty()) memory::set_memory_limit(kCPU, memory::parse_bytes(memory_budget));
    if (!save.empty()) examples::check_can_write("--save", save);
    examples::MemoryTrace trace(memory_trace);
    examples::RunProfile run_profile(profile);
    if (batch == 0) batch = model_name == "mlp" ? 128 : 64;
    manual_seed(seed);

    FRUGAL_CHECK(batch % (accum * ranks) == 0, "--batch ", batch, " must be a multiple of --accum ", accum,
                 ddp_flag ? " times the number of ranks " + std::to_string(ranks) : "");
    FRUGAL_CHECK(!ddp_flag || (!estimate && memory_budget.empty() && !step_in_backward),
                 "--estimate and --memory-budget size one process, and --step-in-backward updates before the "
                 "gradients are reduced: none of them goes with --ddp yet");
    std::shared_ptr<data::FashionMNIST> train_set, test_set;
    {
      memory::Tag tag("dataset");
      train_set = std::make_shared<data::FashionMNIST>(data_dir, data::Split::Train);
      test_set = std::make_shared<data::FashionMNIST>(data_dir, data::Split::Test);
    }
    fmnist::ModelInfo info{model_name};
    FRUGAL_CHECK(batch <= train_set->size(), "--batch ", batch, " is more than the ", train_set->size(),
                 " training images: not one step would run");
    if (normalize) {
      std::tie(info.input_mean, info.input_std) = train_set->pixel_stats();
      train_set->normalize(info.input_mean, info.input_std);
      test_set->normalize(info.input_mean, info.input_std);
    }
    // The loader yields micro-batches; `accum` of them make one step of `batch` examples.
    // Under --ddp each rank's loader draws its share of every epoch, batch / ranks examples a step.
    std::shared_ptr<data::DistributedSampler> sampler;
    if (ddp_flag)
      sampler = std::make_shared<data::DistributedSampler>(train_set->size(), ranks, dist::rank(),
                                                           /*shuffle=*/true, seed, /*drop_last=*/true);
    // Note [a planned run makes its batches in order]: a plan fits because its dry run did, and the dry run
    // makes the batches the loaders' workers keep ahead in this thread, in one order (fmnist::dry_loader).
    // The allocated peak does not depend on when a worker makes them, but the arena's segments do: near the
    // budget, a batch made a moment earlier can take the last free segment, or keep one that a cache flush
    // would have returned, and a larger request then finds no room (W2 at 90M: the evaluation's worker took a
    // 2 MiB segment before the convolution's 9.23 MiB Winograd scratchpad, which then did not fit, in about
    // half the runs with another process on the second core). Under --memory-budget the loaders make their
    // batches where the dry run did, at next(), so that the run allocates exactly as its plan did; their work
    // (gathering and converting a few hundred images) no longer overlaps the step's.
    const bool in_plan_order = !memory_budget.empty();
    auto train_options = [&](int micro) {
      auto o = data::DataLoaderOptions()
                   .batch_size(batch / micro / ranks)
                   .seed(seed)
                   .drop_last(true)
                   .in_caller_thread(in_plan_order);
      return sampler ? o.sampler(sampler) : o.shuffle(true);
    };
    const auto test_options = data::DataLoaderOptions().batch_size(250).in_caller_thread(in_plan_order);
    data::DataLoader test(test_set, test_options);

    auto make_model = [&](bool with_recompute) {
      nn::Sequential m{nullptr};
      memory::Tag tag("parameters");
      m = model_name == "mlp" ? fmnist::make_mlp() : fmnist::make_cnn();
      if (with_recompute) m->recompute_every(2);
      return m;
    };
    // One epoch and one evaluation as the run makes them, on the meta device (core/estimate.h): the later
    // epochs repeat the first one's peak.
    // By value: plan_for keeps it (and the datasets) for the out-of-memory handler.
    auto dry_run = [=](bool with_recompute, int micro, std::optional<DType> amp, bool in_backward_too) {
      nn::Sequential m = make_model(with_recompute);
      auto o = fmnist::make_optimizer(optimizer, m->parameters(), lr);
      std::optional<optim::StepInBackward> in_backward;
      if (step_in_backward || in_backward_too) in_backward.emplace(*o);
      fmnist::Precision p(amp);
      const data::DataLoader like(train_set, train_options(micro));  // starts no thread: never iterated
      const auto dry_train = fmnist::dry_loader(like);  // alive through evaluate, as the real one is
      fmnist::train_epoch(*m, *o, *dry_train, 0, max_steps, micro, {}, &p);
      const data::DataLoader like_test(test_set, test_options);
      fmnist::evaluate(*m, *fmnist::dry_loader(like_test), p.autocast);
    };
    std::optional<DType> autocast = fmnist::parse_amp(amp_name);
    // The model is a chain of one block here: recompute (every 2 modules) is on or off.
    plan_for = [=](int64_t budget) {
      return memory::plan(
          [&](Device, const memory::PlanChoice& c) {
            dry_run(c.recompute_blocks > 0, c.micro_batches,
                    c.low_precision ? std::optional(DType::BF16) : autocast, c.step_in_backward);
          },
          budget,
          memory::PlanSpace()
              // Stepping in backward: no accumulation (recompute goes with it).
              .blocks(1)
              .micro_batches(step_in_backward ? std::vector<int>{1} : examples::micro_batch_counts(batch))
              .low_precision(allow_low_precision)
              // The plan may step in backward where the run allows it (Note [stepping in backward]).
              .step_in_backward(!step_in_backward && autocast != std::optional<DType>(DType::F16))
              .from(kCPU));
    };
    if (!memory_budget.empty()) {
      const memory::Plan plan = plan_for(memory::parse_bytes(memory_budget));
      if (!examples::report_plan(plan, "a smaller --batch")) return 1;
      accum = plan.choice.micro_batches;
      recompute = plan.choice.recompute_blocks > 0;
      step_in_backward = step_in_backward || plan.choice.step_in_backward;
      if (plan.choice.low_precision) autocast = DType::BF16;
    }
    if (estimate) {
      const memory::Estimate e =
          memory::estimate([&](Device) { dry_run(recompute, accum, autocast, step_in_backward); },
                           memory::EstimateOptions().from(kCPU));
      std::printf("%s", e.summary().c_str());
      std::printf("estimated_peak_bytes=%lld\n",
                  static_cast<long long>(std::max(e.source_peak, e.peak_allocated)));
      return e.fits() ? 0 : 1;
    }
    data::DataLoader train(train_set, train_options(accum));
    nn::Sequential model = make_model(recompute);
    std::optional<dist::DistributedDataParallel> ddp;
    if (ddp_flag) ddp.emplace(*model);
    auto opt = fmnist::make_optimizer(optimizer, model->parameters(), lr);
    std::optional<optim::StepInBackward> in_backward;
    if (step_in_backward) {
      // Note [stepping in backward] (optim/step_in_backward.h): what needs every gradient first is refused.
      FRUGAL_CHECK(accum == 1 && autocast != std::optional<DType>(DType::F16),
                   "--step-in-backward makes each backward the optimizer's step: it cannot go with --accum "
                   "above 1 or --amp f16 (the loss scaler)");
      in_backward.emplace(*opt);
    }
    fmnist::Precision precision(autocast);
    std::printf(
        "frugal: training %s (%lld parameters, %s) on Fashion-MNIST, batch %lld, %s lr %g, accum %d%s, "
        "%s%s, %d threads%s\n",
        model_name.c_str(), static_cast<long long>(model->num_parameters()),
        memory::format_bytes(model->parameter_bytes()).c_str(), static_cast<long long>(batch),
        optimizer.c_str(), lr, accum, recompute ? ", recompute" : "", precision.autocast ? "autocast " : "",
        precision.autocast ? dtype_name(*precision.autocast) : "f32", num_threads(),
        ddp_flag ? (", " + std::to_string(ranks) + " ranks (--ddp)").c_str() : "");

    fmnist::TrainingState st;
    if (!resume.empty()) {
      st = fmnist::load_checkpoint(resume, *model, *opt, &precision.scaler);
      default_generator().set_state(st.rng);
      std::printf("resumed from %s after epoch %lld\n", resume.c_str(), static_cast<long long>(st.epoch));
    }

    const int64_t per_epoch = train.num_batches() / accum;
    const int64_t steps_per_epoch = max_steps > 0 ? std::min(max_steps, per_epoch) : per_epoch;
    std::unique_ptr<optim::CosineAnnealingLR> sched;
    if (schedule == "cosine") {
      sched = std::make_unique<optim::CosineAnnealingLR>(*opt, epochs * steps_per_epoch);
      if (st.epoch > 0) sched->step_to(st.epoch * steps_per_epoch);
    }

    const bool tty = isatty(STDOUT_FILENO);
    double accuracy = 0;
    int64_t run_steps = 0;  // of this run, for --memory-trace
    for (int64_t epoch = st.epoch; epoch < epochs; ++epoch) {
      const int64_t steps = steps_per_epoch;
      Progress bar(int(epoch + 1), epochs, steps, tty);
      bar.set_batch(batch);
      const auto t0 = std::chrono::steady_clock::now();
      double loss_sum = 0;
      int64_t correct = 0, seen = 0;
      const std::vector<double> losses = fmnist::train_epoch(
          *model, *opt, train, epoch, max_steps, accum,
          [&](int64_t step, int64_t samples, const fmnist::StepResult& r) {
            examples::check_finite_loss(r.loss, step, "try a lower --lr");
            loss_sum += r.loss;
            correct += r.correct;
            seen += samples;
            if (sched) sched->step();
            const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            bar.update(step, loss_sum / double(step), double(correct) / double(seen), double(seen) / secs);
            trace.after_step(++run_steps);
          },
          &precision, ddp ? &*ddp : nullptr);
      const int64_t step = int64_t(losses.size());
      bar.finish();
      accuracy = fmnist::evaluate(*model, test, precision.autocast);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("epoch %lld: train loss %.4f, train accuracy %.4f, test accuracy %.4f (%.1f s)\n",
                  static_cast<long long>(epoch + 1), loss_sum / double(std::max<int64_t>(step, 1)),
                  double(correct) / double(std::max<int64_t>(seen, 1)), accuracy, secs);
      st.epoch = epoch + 1;
      st.rng = default_generator().state();
      // Under --ddp every rank holds the same weights, optimizer state and generator: rank 0 writes them, and
      // every rank resumes from them (the sampler's shares follow from the seed and the epoch).
      if (!save.empty() && (!ddp_flag || dist::rank() == 0))
        fmnist::save_checkpoint(save, *model, *opt, st, info, &precision.scaler);
    }
    trace.finish(run_steps);
    run_profile.finish();
    std::printf("\n%s", fmnist::memory_report().c_str());
    std::printf("peak_allocated_bytes=%lld\n", static_cast<long long>(memory::stats().allocated.peak));
    std::printf("test_accuracy=%.4f\n", accuracy);
    return 0;
  } catch (const OutOfMemoryError& e) {
    return examples::report_out_of_memory(
        e, "train_fmnist",
        (examples::fitting_plan_hint(plan_for) +
         "--accum N (N micro-batches a step, --batch stays the step's size), --recompute, --amp bf16, a "
         "smaller --batch, or a larger --memory-limit")
            .c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    if (dist::world_size() > 1) dist::abort(1, "stopping every rank after this rank's error");
    return 1;
  }
}

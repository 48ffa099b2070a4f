// train_chargpt: trains workload W3 of shared/WORKLOADS.md, a character-level GPT, on the English fortunes
// (Debian's `fortunes`), with a progress line, a validation loss on the held-out tail of the corpus, a sample
// of generated text at the end, and where the memory went.
//
//   build/examples/train_chargpt --steps 2000
//   build/examples/train_chargpt --steps 200 --recompute --sparse-embeddings
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "examples/common.h"

using namespace frugal;

namespace {

// Mean cross-entropy of next-byte prediction over a batch, for logits [B, T, V] and targets [B, T].
Tensor lm_loss(const Tensor& logits, const Tensor& target) {
  const int64_t v = logits.size(-1);
  return nn::functional::cross_entropy(logits.reshape({-1, v}), target.reshape({-1}));
}

// Validation loss over a fixed set of windows of the held-out text (the same windows every time).
double validation_loss(nn::GPT& model, const data::TextDataset& val, int64_t batch, int batches) {
  InferenceMode no_record;
  memory::Tag tag("evaluation");
  model.eval();
  Generator gen(1234);
  double sum = 0;
  for (int i = 0; i < batches; ++i) {
    const data::Batch b = val.sample_batch(batch, gen);
    sum += lm_loss(model.forward(b.input), b.target).item<double>();
  }
  model.train();
  return sum / batches;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train workload W3 (a character-level GPT) on the fortunes corpus with frugal"};
  int64_t layers = 4, width = 128, heads = 4, context = 64, batch = 32, steps = 500, eval_every = 100,
          sample_bytes = 200, top_k = 20;
  int accum = 1, threads = 0;
  double lr = 1e-3, temperature = 0.8;
  uint64_t seed = 0;
  bool recompute = false, sparse_embeddings = false;
  std::string memory_limit, save, resume, data_dir = data::kFortunesRoot;
  app.add_option("--layers", layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--width", width, "model width d")->check(CLI::PositiveNumber);
  app.add_option("--heads", heads, "attention heads (must divide the width)")->check(CLI::PositiveNumber);
  app.add_option("--context", context, "tokens per window")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "windows per step")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "AdamW learning rate");
  app.add_option("--accum", accum, "micro-batches per step (gradient accumulation)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--recompute", recompute, "run each block as a recompute segment (less activation memory)");
  app.add_flag("--sparse-embeddings", sparse_embeddings,
               "sparse gradients for the token embedding, updated by SparseAdam (AdamW for the rest)");
  app.add_option("--memory-limit", memory_limit, "arena limit, e.g. 64M: beyond it, OutOfMemoryError");
  app.add_option("--save", save,
                 "write the weights here (and the training state to <path>.state) at the end");
  app.add_option("--resume", resume, "continue from a checkpoint written by --save");
  app.add_option("--threads", threads, "CPU threads (default: all cores)");
  app.add_option("--seed", seed, "seed for the initial weights and the batches");
  app.add_option("--data", data_dir, "folder of text files (default: Debian's fortunes)");
  app.add_option("--eval-every", eval_every, "steps between validation losses");
  app.add_option("--sample", sample_bytes, "bytes of text to generate at the end");
  app.add_option("--temperature", temperature, "sampling temperature");
  app.add_option("--top-k", top_k, "sample among the k likeliest bytes (0: all)");
  CLI11_PARSE(app, argc, argv);

  try {
    if (threads > 0) set_num_threads(threads);
    if (!memory_limit.empty()) memory::set_memory_limit(kCPU, examples::parse_bytes(memory_limit));
    FRUGAL_CHECK(batch % accum == 0, "--batch ", batch, " must be a multiple of --accum ", accum);
    manual_seed(seed);
    std::unique_ptr<data::TextDataset> train, val;
    {
      memory::Tag tag("dataset");
      train = std::make_unique<data::TextDataset>(data::TextDatasetOptions().root(data_dir).context(context));
      val = std::make_unique<data::TextDataset>(
          data::TextDatasetOptions().root(data_dir).context(context).split(data::TextSplit::Validation));
    }
    nn::GPTConfig cfg;
    cfg.vocab = train->vocab_size();
    cfg.d_model = width;
    cfg.n_layers = layers;
    cfg.n_heads = heads;
    cfg.context = context;
    cfg.sparse_embeddings = sparse_embeddings;
    std::shared_ptr<nn::GPT> model;
    {
      memory::Tag tag("parameters");
      model = std::make_shared<nn::GPT>(cfg);
    }
    model->recompute(recompute);

    // AdamW for everything, or SparseAdam for the token embedding and AdamW for the rest.
    std::vector<Tensor> dense, sparse;
    for (auto& [name, p] : model->named_parameters())
      (sparse_embeddings && name == "tok_emb.weight" ? sparse : dense).push_back(p);
    optim::AdamW adamw(dense, optim::AdamWOptions(lr));
    std::unique_ptr<optim::SparseAdam> sparse_adam;
    if (!sparse.empty())
      sparse_adam = std::make_unique<optim::SparseAdam>(sparse, optim::SparseAdamOptions(lr));
    optim::CosineAnnealingLR sched(adamw, steps, lr * 0.1);

    Generator batches(seed + 1);
    int64_t start = 0;
    if (!resume.empty()) {
      model->load_state_dict(io::load_safetensors(resume).tensors);
      const io::SafetensorsFile st = io::load_safetensors(resume + ".state");
      StateDict a, s;
      for (auto& [k, t] : st.tensors) {
        if (k.rfind("adamw.", 0) == 0) a[k.substr(6)] = t;
        if (k.rfind("sparse_adam.", 0) == 0) s[k.substr(12)] = t;
      }
      adamw.load_state_dict(a);
      if (sparse_adam) sparse_adam->load_state_dict(s);
      start = st.tensors.at("trainer.step").item<int64_t>();
      batches.set_state({uint64_t(st.tensors.at("trainer.batch_seed").item<int64_t>()),
                         uint64_t(st.tensors.at("trainer.batch_offset").item<int64_t>())});
      sched.step_to(start);
      std::printf("resumed from %s at step %lld\n", resume.c_str(), static_cast<long long>(start));
    }
    std::printf(
        "frugal: training a GPT (%lld layers, width %lld, %lld heads, context %lld, vocab %lld; %lld "
        "parameters, %s), batch %lld, accum %d%s%s, %d threads\n",
        static_cast<long long>(layers), static_cast<long long>(width), static_cast<long long>(heads),
        static_cast<long long>(context), static_cast<long long>(cfg.vocab),
        static_cast<long long>(model->num_parameters()),
        memory::format_bytes(model->parameter_bytes()).c_str(), static_cast<long long>(batch), accum,
        recompute ? ", recompute" : "", sparse_embeddings ? ", sparse embeddings" : "", num_threads());

    const bool tty = isatty(STDOUT_FILENO);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<double> step_ms;
    double loss_avg = 0;
    for (int64_t step = start; step < steps; ++step) {
      const auto ts = std::chrono::steady_clock::now();
      adamw.zero_grad();
      if (sparse_adam) sparse_adam->zero_grad();
      double loss_sum = 0;
      for (int m = 0; m < accum; ++m) {
        const data::Batch b = train->sample_batch(batch / accum, batches);
        Tensor loss;
        {
          memory::Tag tag("activations");
          loss = lm_loss(model->forward(b.input), b.target) * (1.0 / accum);
        }
        memory::Tag tag("backward");
        loss.backward();
        loss_sum += loss.item<double>();
      }
      {
        memory::Tag tag("optimizer step");
        adamw.step();
        if (sparse_adam) sparse_adam->step();
      }
      sched.step();
      step_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ts).count());
      loss_avg = step == start ? loss_sum : 0.95 * loss_avg + 0.05 * loss_sum;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double tok_s = double((step - start + 1) * batch * context) / secs;
      const double eta = secs / double(step - start + 1) * double(steps - step - 1);
      if (tty) {
        std::printf("\rstep %lld/%lld loss %.4f %.0f tokens/s ETA %.0fs   ", static_cast<long long>(step + 1),
                    static_cast<long long>(steps), loss_avg, tok_s, eta);
        std::fflush(stdout);
      }
      if ((step + 1) % eval_every == 0 || step + 1 == steps) {
        const double v = validation_loss(*model, *val, batch, 8);
        std::printf("%sstep %lld: train loss %.4f, validation loss %.4f, %.0f tokens/s\n", tty ? "\r" : "",
                    static_cast<long long>(step + 1), loss_avg, v, tok_s);
      }
    }
    if (!step_ms.empty()) {
      std::vector<double> sorted(step_ms.begin() + std::min<size_t>(5, step_ms.size() - 1), step_ms.end());
      std::sort(sorted.begin(), sorted.end());
      std::printf("median step %.2f ms (after 5 warm-up steps)\n", sorted[sorted.size() / 2]);
    }
    if (!save.empty()) {
      io::save_safetensors(save, model->state_dict(), {{"model", "gpt"}});
      StateDict st;
      for (auto& [k, t] : adamw.state_dict()) st["adamw." + k] = t;
      if (sparse_adam)
        for (auto& [k, t] : sparse_adam->state_dict()) st["sparse_adam." + k] = t;
      st["trainer.step"] = tensor<int64_t>({steps}, Shape{});
      st["trainer.batch_seed"] = tensor<int64_t>({int64_t(batches.state().seed)}, Shape{});
      st["trainer.batch_offset"] = tensor<int64_t>({int64_t(batches.state().offset)}, Shape{});
      io::save_safetensors(save + ".state", st);
    }

    if (sample_bytes > 0) {
      Generator gen(seed + 2);
      const Tensor prompt = train->encode("\n");
      const Tensor out = model->generate(prompt, sample_bytes, temperature, top_k, &gen);
      std::printf("\nsample:\n%s\n", train->decode(out.narrow(-1, 1, sample_bytes)).c_str());
    }
    std::printf("\n%s", examples::memory_report().c_str());
    return 0;
  } catch (const OutOfMemoryError& e) {
    std::fprintf(stderr, "\n%s\n%s", e.what(), memory::memory_summary(kCPU).c_str());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

// The character-level GPT trainer's parts (workload W3 of shared/WORKLOADS.md): the model and its optimizers,
// one training step with gradient accumulation, the validation loss and checkpoints, shared by
// examples/train_chargpt.cpp and its tests. Uses the public header only.
//
//   chargpt::Trainer t(chargpt::Options{}, train.vocab_size());
//   for (int64_t s = 0; s < opts.steps; ++s) double loss = t.train_step(train);
//   t.save("gpt.safetensors", train.vocabulary());  // weights; the optimizers, step and batches in .state
#pragma once

#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <frugal/frugal.h>
#include "common.h"

namespace chargpt {

using namespace frugal;

struct Options {
  int64_t layers = 4, width = 128, heads = 4, context = 64, batch = 32, steps = 500;
  int accum = 1;  // micro-batches per step
  double lr = 1e-3;
  uint64_t seed = 0;
  bool recompute = false;            // each block a recompute segment
  int64_t recompute_blocks = 0;      // or only the first this many (memory::plan's choice, --memory-budget)
  bool selective_recompute = false;  // each block a segment that keeps its GEMMs' results
  int64_t selective_blocks = 0;      // or only the next this many after recompute_blocks (memory::plan's)
  bool sparse_embeddings = false;    // SparseAdam for the token embedding, the optimizer below for the rest
  std::string optimizer = "adamw";   // dense parameters: adamw, adafactor, adamw8bit, adamw8bit-float8
  // Mixed precision: autocast to this dtype around the forward and the loss, and for f16 a loss scaler.
  std::optional<DType> autocast;
  double clip = 0;                // clip the dense gradients' norm to this (0: off)
  bool step_in_backward = false;  // each parameter updated during backward, its gradient freed at once
  // Data-parallel over the processes mpirun starts (dist::DistributedDataParallel): batch is the global
  // batch, each rank draws batch / world_size windows of its own; zero: ZeRO-1 (dist::ZeroOptimizer).
  bool ddp = false;
  bool zero = false;
  double bucket_mb = 25;  // --ddp: MiB of gradients reduced at once (Note [gradient buckets])
};

// Mean cross-entropy of next-byte prediction, for logits [B, T, V] and targets [B, T].
inline Tensor lm_loss(const Tensor& logits, const Tensor& target) {
  return nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
}

// The dry run's stand-in for TextDataset::sample_batch (--estimate): its allocations, on the meta device and
// in its order (the window starts drawn and read, then the inputs and the targets), without a byte of text.
inline data::Batch dry_sample_batch(const data::TextDataset& data, int64_t batch, Generator& gen) {
  memory::PhaseScope phase(memory::Phase::Data);
  {
    const Tensor starts = randint(0, data.size(), {batch}, TensorOptions(DType::I64).device(kMeta), &gen);
    memory::detail::read_allocations(starts, DType::I64);
  }
  const int64_t context = data.options().context_;
  data::Batch b;
  b.input = empty({batch, context}, TensorOptions(DType::I64).device(kMeta));
  b.target = empty({batch, context}, TensorOptions(DType::I64).device(kMeta));
  return b;
}

// The model, AdamW, Adafactor or AdamW8bit for every parameter (or SparseAdam for the token embedding),
// cosine schedules over opts.steps down to lr / 10, and the generator the training windows are drawn from.
// Not copyable: the schedules refer to the optimizers.
class Trainer {
 public:
  Trainer(const Options& opts, int64_t vocab)
      : scaler(amp::GradScalerOptions().enabled(opts.autocast == DType::F16)),
        opts_(opts),
        // Under --ddp each rank draws its own windows.
        batches_(opts.seed + 1 + (opts.ddp ? 1000003 * uint64_t(dist::rank()) : 0)) {
    const int64_t ranks = opts.ddp ? dist::world_size() : 1;
    FRUGAL_CHECK(opts.batch % (opts.accum * ranks) == 0, "--batch ", opts.batch,
                 " must be a multiple of --accum ", opts.accum, opts.ddp ? " times the number of ranks " : "",
                 opts.ddp ? std::to_string(ranks) : "");
    // A shape too big for this machine fails here, with its numbers, and not when the system runs out of
    // pages while the weights are initialised. A lower bound of the f32 weights (the blocks' 12 d^2 each,
    // the embeddings and the head), in double so that no product overflows.
    const double d = double(opts.width),
                 weight_bytes = 4.0 * (12.0 * double(opts.layers) * d * d +
                                       (2.0 * double(vocab) + double(opts.context)) * d);
    const double machine = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
    FRUGAL_CHECK(weight_bytes < machine, "a GPT of ", opts.layers, " layers, width ", opts.width,
                 " and context ", opts.context, " needs at least ", weight_bytes / double(1 << 30),
                 " GiB of weights, more than this machine's ", machine / double(1 << 30), " GiB of memory");
    manual_seed(opts.seed);
    nn::GPTConfig cfg;
    cfg.vocab = vocab;
    cfg.d_model = opts.width;
    cfg.n_layers = opts.layers;
    cfg.n_heads = opts.heads;
    cfg.context = opts.context;
    cfg.sparse_embeddings = opts.sparse_embeddings;
    {
      memory::Tag tag("parameters");
      model = nn::GPT(cfg);
    }
    if (opts.recompute)
      model->recompute_blocks(opts.layers);
    else if (opts.selective_recompute)
      model->recompute_blocks(0, opts.layers);
    else
      model->recompute_blocks(opts.recompute_blocks, opts.selective_blocks);
    std::vector<Tensor> dense, sparse;
    for (auto& [name, p] : model->named_parameters())
      (opts.sparse_embeddings && name == "tok_emb.weight" ? sparse : dense).push_back(p);
    if (opts.optimizer == "adamw")
      optimizer = std::make_unique<optim::AdamW>(dense, optim::AdamWOptions(opts.lr));
    else if (opts.optimizer == "adafactor")
      optimizer = std::make_unique<optim::Adafactor>(dense, optim::AdafactorOptions(opts.lr));
    else if (opts.optimizer == "adamw8bit")
      optimizer = std::make_unique<optim::AdamW8bit>(dense, optim::AdamW8bitOptions(opts.lr));
    else if (opts.optimizer == "adamw8bit-float8")
      optimizer = std::make_unique<optim::AdamW8bit>(
          dense, optim::AdamW8bitOptions(opts.lr).code(optim::Adam8bitCode::Float8));
    else
      throw Error("unknown optimizer '" + opts.optimizer +
                  "'; valid: adamw, adafactor, adamw8bit, adamw8bit-float8");
    schedules_.push_back(std::make_unique<optim::CosineAnnealingLR>(*optimizer, opts.steps, opts.lr * 0.1));
    if (!sparse.empty()) {
      sparse_adam = std::make_unique<optim::SparseAdam>(sparse, optim::SparseAdamOptions(opts.lr));
      schedules_.push_back(
          std::make_unique<optim::CosineAnnealingLR>(*sparse_adam, opts.steps, opts.lr * 0.1));
    }
    if (opts.step_in_backward) {
      // Note [stepping in backward] (optim/step_in_backward.h): what needs every gradient first is refused.
      FRUGAL_CHECK(opts.accum == 1 && opts.clip == 0 && !opts.sparse_embeddings &&
                       opts.autocast != std::optional<DType>(DType::F16),
                   "--step-in-backward makes each backward the optimizer's step: it cannot go with --accum "
                   "above 1, --clip, --sparse-embeddings or --amp f16 (the loss scaler)");
      in_backward_ = std::make_unique<optim::StepInBackward>(*optimizer);
    }
    if (opts.ddp) {
      FRUGAL_CHECK(!opts.sparse_embeddings && !opts.step_in_backward,
                   "--ddp reduces dense gradients at the end of backward: not with --sparse-embeddings or "
                   "--step-in-backward");
      ddp_ = std::make_unique<dist::DistributedDataParallel>(
          *model,
          dist::DistributedDataParallelOptions().reduce_gradients(!opts.zero).bucket_cap_mb(opts.bucket_mb));
    }
    if (opts.zero) {
      // Note [ZeRO shards] (dist/zero.h): the step reduce-scatters the gradients itself, before any norm or
      // overflow could be seen across the ranks.
      FRUGAL_CHECK(
          opts.ddp && opts.optimizer == "adamw" && opts.clip == 0 &&
              opts.autocast != std::optional<DType>(DType::F16),
          "--zero shards AdamW's state over the --ddp ranks: it needs --ddp and --optimizer adamw, and "
          "cannot go with --clip or --amp f16 (the loss scaler)");
      zero_ = std::make_unique<dist::ZeroOptimizer>(*optimizer);
    }
  }
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step over opts.batch windows of `train`, drawn as opts.accum micro-batches. Returns the
  // step's mean loss.
  // On a meta model (a dry run, --estimate) the batches are dry_sample_batch's.
  double train_step(const data::TextDataset& train) {
    const bool dry = model->head->weight.device().is_meta();
    std::vector<data::Batch> micro;
    for (int m = 0; m < opts_.accum; ++m) {
      const int64_t b = opts_.batch / opts_.accum / (opts_.ddp ? dist::world_size() : 1);
      micro.push_back(dry ? dry_sample_batch(train, b, batches_) : train.sample_batch(b, batches_));
    }
    return train_step(micro);
  }

  // One optimizer step over the given micro-batches (the gradient is their mean). Returns the mean loss.
  double train_step(const std::vector<data::Batch>& micro) {
    FRUGAL_CHECK(!micro.empty(), "train_step: no micro-batches");
    zero_grad();
    double loss_sum = 0;
    for (const data::Batch& b : micro) {
      // Under --ddp the gradients are reduced once a step, in the last micro-batch's backward.
      std::optional<dist::DistributedDataParallel::NoSync> no_sync;
      if (ddp_ && &b != &micro.back()) no_sync.emplace(*ddp_);
      Tensor loss;
      {
        memory::Tag tag("activations");
        amp::Autocast autocast(opts_.autocast.value_or(DType::BF16), opts_.autocast.has_value());
        loss = lm_loss(model->forward(b.input), b.target) * (1.0 / double(micro.size()));
      }
      memory::Tag tag("backward");
      scaler.scale(loss).backward();  // the loss itself when the scaler is disabled (f32, bf16)
      loss_sum += memory::item_or(loss, 0.0);
    }
    {
      memory::Tag tag("optimizer/step");
      if (opts_.clip > 0) {
        scaler.unscale_(*optimizer);  // clip the true gradients, not the scaled ones
        optim::clip_grad_norm_(optimizer->param_groups()[0].params, opts_.clip);
      }
      // A step whose f16 gradients overflowed is skipped (and the scale backs off).
      if (zero_)
        zero_->step();
      else
        scaler.step(*optimizer);
      if (sparse_adam) scaler.step(*sparse_adam);
      scaler.update();
    }
    // The gradients are done with: freed now rather than at the next step's start, so that what runs
    // between steps (validation, a checkpoint) has their bytes (the training itself is unchanged).
    zero_grad();
    for (auto& s : schedules_) s->step();
    if (ddp_) ddp_wait_ms_.push_back(ddp_->last_wait_seconds() * 1e3);
    ++step_;
    return loss_sum;
  }

  int64_t step() const { return step_; }
  const Options& options() const { return opts_; }
  const dist::DistributedDataParallel* ddp() const { return ddp_.get(); }
  // Each step's wait for its gradients' reduction at the end of backward (--ddp), in ms.
  const std::vector<double>& ddp_wait_ms() const { return ddp_wait_ms_; }
  // The optimizer state's bytes (this rank's, under --zero).
  int64_t optimizer_state_bytes() const {
    return zero_ ? zero_->num_state_bytes() : optimizer->num_state_bytes();
  }

  void zero_grad() {
    if (zero_)
      zero_->zero_grad();
    else
      optimizer->zero_grad();
    if (sparse_adam) sparse_adam->zero_grad();
  }

  // The weights in `path` (safetensors), with what a user of them needs in the metadata (the model's shape
  // and the vocabulary: token id -> byte; Note [the model file is the whole model] in examples/fmnist.h);
  // beside them in `path`.state the optimizers' state, the step and the batch generator's state, so that a
  // resumed run draws the same windows as an uninterrupted one. The two are one checkpoint (Note
  // [checkpoint pairs] in io/checkpoint.h).
  void save(const std::string& path, const std::vector<uint8_t>& vocabulary) const {
    FRUGAL_CHECK(int64_t(vocabulary.size()) == model->config.vocab, "Trainer::save: a vocabulary of ",
                 vocabulary.size(), " bytes for a model of ", model->config.vocab, " tokens");
    std::string bytes = "[";
    for (uint8_t b : vocabulary) bytes += (bytes.size() > 1 ? ", " : "") + std::to_string(int(b));
    StateDict st;
    // Under the optimizer's name ("adamw." as before Adafactor existed, so older checkpoints still resume).
    // Under --zero, gathered from every rank's part (every rank calls save; rank 0 writes).
    for (auto& [k, t] : zero_ ? zero_->state_dict() : optimizer->state_dict())
      st[opts_.optimizer + "." + k] = t;
    if (sparse_adam)
      for (auto& [k, t] : sparse_adam->state_dict()) st["sparse_adam." + k] = t;
    for (auto& [k, t] : scaler.state_dict()) st["scaler." + k] = t;  // nothing when disabled
    st["trainer.step"] = tensor<int64_t>({step_}, Shape{});
    st["trainer.batch_seed"] = tensor<int64_t>({int64_t(batches_.state().seed)}, Shape{});
    st["trainer.batch_offset"] = tensor<int64_t>({int64_t(batches_.state().offset)}, Shape{});
    if (opts_.ddp) {
      // Each rank's window generator, [ranks, 2]: (seed, offset).
      const Tensor mine =
          tensor<int64_t>({int64_t(batches_.state().seed), int64_t(batches_.state().offset)}, Shape{1, 2});
      st["trainer.batch_states"] = dist::all_gather(mine);
      if (dist::rank() != 0) return;
    }
    io::save_checkpoint(path, model->state_dict(),
                        {{"format", "frugal"},
                         {"model", "gpt"},
                         {"layers", std::to_string(opts_.layers)},
                         {"width", std::to_string(opts_.width)},
                         {"heads", std::to_string(opts_.heads)},
                         {"context", std::to_string(opts_.context)},
                         {"vocabulary", bytes + "]"}},
                        st, {});
  }

  // Continues from a checkpoint written by save() with the same options. Everything that can be checked
  // before anything changes is (the pair, the SparseAdam and scaler states, the trainer's keys); the model,
  // then the optimizers, then the scaler each change nothing when they refuse.
  void load(const std::string& path) {
    const io::Checkpoint ckpt = io::load_checkpoint(path);
    const std::string state_path = io::checkpoint_state_path(path);
    StateDict a, s, sc;
    const std::string prefix = opts_.optimizer + ".";
    for (auto& [k, t] : ckpt.state.tensors) {
      if (k.rfind(prefix, 0) == 0) a[k.substr(prefix.size())] = t;
      if (k.rfind("sparse_adam.", 0) == 0) s[k.substr(12)] = t;
      if (k.rfind("scaler.", 0) == 0) sc[k.substr(7)] = t;
    }
    FRUGAL_CHECK(!a.empty(), "resume: '", state_path, "' has no ", opts_.optimizer,
                 " state; was it saved with another --optimizer?");
    FRUGAL_CHECK(!sparse_adam || !s.empty(), "resume: '", state_path,
                 "' has no SparseAdam state; was it saved without --sparse-embeddings?");
    FRUGAL_CHECK(!scaler.is_enabled() || !sc.empty(), "resume: '", state_path,
                 "' has no loss scaler state; was it saved without --amp f16?");
    auto get = [&](const char* key) {
      auto it = ckpt.state.tensors.find(key);
      FRUGAL_CHECK(it != ckpt.state.tensors.end(), "resume: '", state_path, "' has no '", key, "'");
      return it->second.item<int64_t>();
    };
    const int64_t step = get("trainer.step");
    Generator::State batches{uint64_t(get("trainer.batch_seed")), uint64_t(get("trainer.batch_offset"))};
    if (opts_.ddp) {
      // Each rank continues its own windows when the checkpoint has as many ranks; with another number of
      // ranks, each starts its own generator again past rank 0's offset (the run goes on, with other windows
      // than an uninterrupted one would draw).
      auto it = ckpt.state.tensors.find("trainer.batch_states");
      if (it != ckpt.state.tensors.end() && it->second.dim() == 2 &&
          it->second.size(0) == dist::world_size()) {
        const std::vector<int64_t> v = it->second.to_vector<int64_t>();
        batches = {uint64_t(v[size_t(2 * dist::rank())]), uint64_t(v[size_t(2 * dist::rank() + 1)])};
      } else {
        batches.seed = opts_.seed + 1 + 1000003 * uint64_t(dist::rank());
      }
    }
    model->load_state_dict(ckpt.weights.tensors);
    if (zero_)
      zero_->load_state_dict(a);  // this rank's part of the whole state
    else
      optimizer->load_state_dict(a);
    if (sparse_adam) sparse_adam->load_state_dict(s);
    scaler.load_state_dict(sc);  // a no-op when disabled
    step_ = step;
    batches_.set_state(batches);
    for (auto& sched : schedules_) sched->step_to(step_);
  }

  nn::GPT model{nullptr};
  std::unique_ptr<optim::Optimizer> optimizer;  // AdamW, Adafactor or AdamW8bit, for the dense parameters
  std::unique_ptr<optim::SparseAdam> sparse_adam;
  amp::GradScaler scaler;  // enabled for f16 autocast only

 private:
  Options opts_;
  Generator batches_;
  std::vector<std::unique_ptr<optim::LRScheduler>> schedules_;
  std::unique_ptr<optim::StepInBackward> in_backward_;  // --step-in-backward
  int64_t step_ = 0;
  // Declared last, destroyed first: they refer to the model and the optimizer.
  std::unique_ptr<dist::DistributedDataParallel> ddp_;  // under --ddp
  std::vector<double> ddp_wait_ms_;            // each step's wait for its reductions at the end of backward
  std::unique_ptr<dist::ZeroOptimizer> zero_;  // under --zero: steps `optimizer` on this rank's part
};

// Loss over a fixed set of windows of the held-out text (the same windows every time), under autocast to
// `autocast` if given.
// Each batch runs through the model in `chunks` equal pieces (the training's micro-batches: a run planned
// to fit a budget validates within it too); the loss is the mean over the pieces either way.
inline double validation_loss(nn::GPTImpl& model, const data::TextDataset& val, int64_t batch, int batches,
                              std::optional<DType> autocast = {}, int chunks = 1) {
  FRUGAL_CHECK(chunks >= 1 && batch % chunks == 0, "validation_loss: ", chunks,
               " chunks must divide the batch of ", batch);
  InferenceMode no_record;
  memory::Tag tag("evaluation");
  amp::Autocast guard(autocast.value_or(DType::BF16), autocast.has_value());
  model.eval();
  Generator gen(1234);
  const bool dry = model.head->weight.device().is_meta();  // a dry run (--estimate)
  double sum = 0;
  for (int i = 0; i < batches; ++i) {
    const data::Batch b = dry ? dry_sample_batch(val, batch, gen) : val.sample_batch(batch, gen);
    const int64_t piece = batch / chunks;
    for (int c = 0; c < chunks; ++c)
      sum += memory::item_or(lm_loss(model.forward(b.input.narrow(0, c * piece, piece)),
                                     b.target.narrow(0, c * piece, piece)),
                             0.0) /
             chunks;
  }
  model.train();
  return sum / batches;
}

}  // namespace chargpt

// A GPT language model (GPT-2 / nanoGPT shape, W3 in WORKLOADS.md): token and learned position embeddings,
// n_layers pre-norm TransformerBlocks, a final LayerNorm and a linear head giving vocabulary logits. Not
// here: the blocks themselves (nn/attention.h) and the data (data/).
//
//   nn::GPT gpt(nn::GPTConfig{.vocab = 114});  // d_model 128, 4 layers, 4 heads, context 64
//   gpt->recompute(true);                      // keep only each block's input until backward
//   Tensor logits = gpt(tokens);               // tokens i64 [B, T], T <= 64; logits [B, T, 114]
//   Tensor loss = F::cross_entropy(logits.view({-1, 114}), targets.view({-1}));
//   Generator g(7);
//   Tensor out = gpt->generate(prompt, 100, 0.8, 20, &g);  // prompt i64 [B, T0] -> [B, T0 + 100]
#pragma once

#include <memory>

#include "../core/rng.h"
#include "attention.h"
#include "containers.h"

namespace frugal::nn {

struct GPTConfig {
  int64_t vocab = 0;
  int64_t d_model = 128;
  int64_t n_layers = 4;
  int64_t n_heads = 4;
  int64_t context = 64;  // the longest sequence forward() takes (rows of the position embedding)
  double dropout = 0;
  bool sparse_embeddings = false;  // the token embedding's gradient is sparse (for optim::SparseAdam)
};

class GPTImpl : public Module {
 public:
  explicit GPTImpl(const GPTConfig& config);

  // tokens: i64 [B, T] with T <= context, each in [0, vocab); logits [B, T, vocab].
  Tensor forward(const Tensor& tokens) override;

  // With recompute on (and grad mode on), each block runs as an autograd::recompute segment: its activations
  // are computed again in backward instead of being kept. Gradients are bit-identical either way.
  GPTImpl& recompute(bool on);
  bool recompute() const { return recompute_blocks_ > 0 && recompute_blocks_ == int64_t(blocks->size()); }
  // Only the first n blocks as recompute segments (0: none; n_layers: all, as recompute(true)). The first
  // ones, because backward reaches them last, when the later blocks' activations are gone: their re-run
  // then adds to the least memory. memory::plan chooses n (core/plan.h).
  // With `selective`, the next that many blocks run as segments that keep their GEMMs' results
  // (autograd::RecomputePolicy::keep_matmuls, Note [selective recompute]): backward recomputes only their
  // activations and residual adds, and the norms outside autocast (which keep nothing the GEMMs do not: the
  // blocks' norms and GELU run fused with the Linear after them, so a selective block keeps a little more
  // than a plain one, and memory::plan, which measures, does not choose it). n + selective is at most
  // n_layers.
  GPTImpl& recompute_blocks(int64_t n, int64_t selective = 0);
  int64_t recompute_blocks() const { return recompute_blocks_; }
  int64_t selective_blocks() const { return selective_blocks_; }

  // Samples n_new tokens after prompt (i64 [B, T0] or [T0], T0 >= 1) without recording, feeding the model at
  // most the last `context` tokens: logits of the last position / temperature, restricted to the top_k
  // largest (top_k 0: all), softmax, one draw per row from gen (the default generator when null). Dropout is
  // off while sampling. Returns the prompt followed by the new tokens, with the prompt's rank.
  Tensor generate(const Tensor& prompt, int64_t n_new, double temperature = 1.0, int64_t top_k = 0,
                  Generator* gen = nullptr);

  GPTConfig config;
  Embedding tok_emb{nullptr}, pos_emb{nullptr};
  ModuleList blocks{nullptr};  // of TransformerBlock
  LayerNorm ln_f{nullptr};
  Linear head{nullptr};

 private:
  int64_t recompute_blocks_ = 0, selective_blocks_ = 0;
};
FRUGAL_MODULE(GPT);

}  // namespace frugal::nn

// nn::GPT: embeddings, the block stack (optionally as recompute segments), the head, and sampling.
#include "nn/gpt.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "autograd/recompute.h"
#include "nn/functional.h"

namespace frugal::nn {

namespace F = functional;

GPTImpl::GPTImpl(const GPTConfig& c) : Module("GPT"), config(c) {
  FRUGAL_CHECK(c.vocab > 0 && c.d_model > 0 && c.n_layers >= 0 && c.n_heads > 0 && c.context > 0,
               "GPT: vocab, d_model, n_heads and context must be positive and n_layers >= 0, got vocab ",
               c.vocab, ", d_model ", c.d_model, ", n_layers ", c.n_layers, ", n_heads ", c.n_heads,
               ", context ", c.context);
  FRUGAL_CHECK(c.d_model % c.n_heads == 0, "GPT: d_model (", c.d_model, ") must be a multiple of n_heads (",
               c.n_heads, ")");
  tok_emb =
      register_module("tok_emb", Embedding(EmbeddingOptions(c.vocab, c.d_model).sparse(c.sparse_embeddings)));
  pos_emb = register_module("pos_emb", Embedding(c.context, c.d_model));
  blocks = register_module("blocks", ModuleList());
  for (int64_t i = 0; i < c.n_layers; ++i)
    blocks->push_back(TransformerBlock(c.d_model, c.n_heads, c.dropout));
  ln_f = register_module("ln_f", LayerNorm(Shape{c.d_model}));
  head = register_module("head", Linear(c.d_model, c.vocab));
}

GPTImpl& GPTImpl::recompute(bool on) { return recompute_blocks(on ? int64_t(blocks->size()) : 0); }

GPTImpl& GPTImpl::recompute_blocks(int64_t n, int64_t selective) {
  FRUGAL_CHECK(n >= 0 && n <= int64_t(blocks->size()), "GPT.recompute_blocks: ", n,
               " blocks asked for, the model has ", blocks->size(), "; valid: 0 to ", blocks->size());
  FRUGAL_CHECK(selective >= 0 && n + selective <= int64_t(blocks->size()), "GPT.recompute_blocks: ", n,
               " blocks and ", selective, " selective ones asked for, the model has ", blocks->size(),
               "; valid: selective from 0 to ", int64_t(blocks->size()) - n);
  recompute_blocks_ = n;
  selective_blocks_ = selective;
  return *this;
}

Tensor GPTImpl::forward(const Tensor& tokens) {
  FRUGAL_CHECK_SHAPE(tokens.defined() && tokens.dtype() == DType::I64 && tokens.dim() == 2,
                     "GPT: expected "
                     "tokens i64 [B, T], got ",
                     tokens.defined() ? dtype_name(tokens.dtype()) : "undefined", " ",
                     tokens.defined() ? tokens.shape() : Shape{});
  const int64_t t = tokens.size(1);
  FRUGAL_CHECK_SHAPE(t >= 1 && t <= config.context,
                     "GPT: the sequence length must be in [1, context = ", config.context,
                     "], got tokens of shape ", tokens.shape(), " (crop to the last context tokens)");
  Tensor x = add(tok_emb->forward(tokens),
                 pos_emb->forward(arange(t, TensorOptions(DType::I64).device(tokens.device()))));
  x = F::dropout(x, config.dropout, is_training());
  const bool record = autograd::grad_mode_enabled();
  int64_t index = 0;
  for (const auto& m : *blocks) {
    const int64_t i = index++;
    static const autograd::RecomputePolicy keep = autograd::RecomputePolicy::keep_matmuls();
    const auto block = [m](const std::vector<Tensor>& in) { return m->forward(in[0]); };
    if (record && i < recompute_blocks_)
      x = autograd::recompute(block, {x});
    else if (record && i < recompute_blocks_ + selective_blocks_)
      x = autograd::recompute(block, {x}, keep);
    else
      x = m->forward(x);
  }
  return layer_norm_then_linear(*ln_f, *head, x);  // as one op
}

Tensor GPTImpl::generate(const Tensor& prompt, int64_t n_new, double temperature, int64_t top_k,
                         Generator* gen) {
  const char* op = "GPT::generate";
  FRUGAL_CHECK_SHAPE(prompt.defined() && prompt.dtype() == DType::I64 &&
                         (prompt.dim() == 1 || prompt.dim() == 2) && prompt.size(-1) >= 1,
                     op, ": expected a prompt i64 [B, T0] or [T0] with T0 >= 1, got ",
                     prompt.defined() ? dtype_name(prompt.dtype()) : "undefined", " ",
                     prompt.defined() ? prompt.shape() : Shape{});
  FRUGAL_CHECK(n_new >= 0, op, ": n_new must be >= 0, got ", n_new);
  FRUGAL_CHECK(temperature > 0, op, ": temperature must be > 0, got ", temperature);
  FRUGAL_CHECK(top_k >= 0 && top_k <= config.vocab, op, ": top_k must be in [0, vocab = ", config.vocab,
               "], got ", top_k);
  NoGradGuard no_grad;
  const bool was_training = is_training();
  eval();
  struct RestoreMode {
    GPTImpl* self;
    bool training;
    ~RestoreMode() { self->train(training); }
  } restore{this, was_training};

  const Tensor p2 = prompt.dim() == 1 ? prompt.unsqueeze(0) : prompt;
  const int64_t b = p2.size(0), t0 = p2.size(1), v = config.vocab;
  std::vector<int64_t> seq = p2.contiguous().to_vector<int64_t>();  // [b, len], grown row by row
  int64_t len = t0;
  std::vector<double> probs(size_t(v), 0.0);
  for (int64_t step = 0; step < n_new; ++step) {
    const int64_t tc = std::min(len, config.context);
    std::vector<int64_t> window(size_t(b * tc));
    for (int64_t r = 0; r < b; ++r)
      std::copy_n(seq.begin() + r * len + (len - tc), tc, window.begin() + r * tc);
    const Tensor logits = forward(tensor(window, {b, tc})).select(1, tc - 1);  // [b, vocab]
    const std::vector<double> lv = logits.to_vector<double>();
    const std::vector<double> u = rand({b}, DType::F64, gen).to_vector<double>();
    std::vector<int64_t> next(static_cast<size_t>(b));
    for (int64_t r = 0; r < b; ++r) {
      const double* row = lv.data() + r * v;
      double cut = -INFINITY;  // logits below the k-th largest are dropped
      if (top_k > 0 && top_k < v) {
        std::vector<double> sorted(row, row + v);
        std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<>());
        cut = sorted[size_t(top_k - 1)];
      }
      const double m = *std::max_element(row, row + v);
      double total = 0;
      for (int64_t j = 0; j < v; ++j) {
        probs[size_t(j)] = row[j] >= cut ? std::exp((row[j] - m) / temperature) : 0.0;
        total += probs[size_t(j)];
      }
      // Inverse CDF; the last token with nonzero probability catches rounding at the top end.
      const double target = u[size_t(r)] * total;
      int64_t pick = -1;
      double acc = 0;
      for (int64_t j = 0; j < v; ++j) {
        if (probs[size_t(j)] == 0) continue;
        pick = j;
        acc += probs[size_t(j)];
        if (acc > target) break;
      }
      next[size_t(r)] = pick;
    }
    std::vector<int64_t> grown(size_t(b * (len + 1)));
    for (int64_t r = 0; r < b; ++r) {
      std::copy_n(seq.begin() + r * len, len, grown.begin() + r * (len + 1));
      grown[size_t(r * (len + 1) + len)] = next[size_t(r)];
    }
    seq.swap(grown);
    ++len;
  }
  Tensor out = tensor(seq, {b, len});
  return prompt.dim() == 1 ? out.squeeze(0) : out;
}

}  // namespace frugal::nn

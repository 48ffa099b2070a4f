// The part of an OutOfMemoryError's message that explains the failure from the state at that moment
// (core/allocator_base.h): what holds the bytes, how much of the cache is free but in pieces, and what each
// technique would free.
#include <algorithm>
#include <map>

#include "core/allocator_base.h"

namespace frugal::memory::detail {

// Note [an out-of-memory message that explains itself]
// Everything in it comes from the live blocks and the statistics when the allocation failed (the allocator's
// mutex is held; nothing is allocated from the arena that failed):
//   - the live bytes by category (Note [memory categories]: each block's tag, then the phase it was allocated
//     in), by tag (the five largest), and the three largest blocks with their tag, op and phase;
//   - the cache: bytes held free, the largest free piece and the fragmentation, when any is free;
//   - for each technique that applies to what is live, the bytes it would free, estimated from the same
//     accounting: recompute segments up to the activations (a segment keeps only its inputs), mixed precision
//     half of them (16-bit activations instead of 32-bit ones), accumulation over k micro-batches the
//     activations times (1 - 1/k) (k = 4 is shown), SGD with momentum instead of Adam half of the optimizer
//     state (one buffer a parameter instead of two), and the data loader's prefetched batches (tag "data")
//     as they stand. An estimate names its basis; the last line is what always applies. With no activation
//     live, the activation techniques get one line without a figure: the failing request may be one.
std::string explain_out_of_memory(const std::vector<Block*>& live, const Stats& stats) {
  int64_t by_category[kNumCategories] = {};
  std::map<uint32_t, int64_t> by_tag;
  int64_t data_loader = 0;
  const uint32_t data_tag = intern_tag("data");
  for (const Block* b : live) {
    const Category c = category_of(tag_name(b->tag), b->phase);
    by_category[int(c)] += b->size;
    by_tag[b->tag] += b->size;
    if (b->tag == data_tag) data_loader += b->size;
  }
  auto bytes = [](int64_t n) { return format_bytes(n); };
  std::string out;
  if (!live.empty()) {
    out += "\n  live by category:";
    std::vector<int> order(kNumCategories);
    for (int c = 0; c < kNumCategories; ++c) order[c] = c;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return by_category[a] > by_category[b]; });
    const char* sep = " ";
    for (int c : order) {
      if (by_category[c] == 0) continue;
      out += frugal::detail::str_cat(sep, category_name(Category(c)), " ", bytes(by_category[c]));
      sep = ", ";
    }
    std::vector<std::pair<int64_t, uint32_t>> tags;
    for (const auto& [id, n] : by_tag) tags.push_back({n, id});
    std::sort(tags.begin(), tags.end(), std::greater<>());
    out += "\n  largest tags:";
    sep = " ";
    for (size_t i = 0; i < tags.size() && i < 5; ++i) {
      const std::string name = tag_name(tags[i].second);
      out += frugal::detail::str_cat(sep, name.empty() ? "(untagged)" : name, " ", bytes(tags[i].first));
      sep = ", ";
    }
    std::vector<const Block*> largest(live.begin(), live.end());
    const size_t n = std::min<size_t>(3, largest.size());
    std::partial_sort(largest.begin(), largest.begin() + ptrdiff_t(n), largest.end(),
                      [](const Block* a, const Block* b) { return a->size > b->size; });
    out += "\n  largest live blocks:";
    sep = " ";
    for (size_t i = 0; i < n; ++i) {
      const Block* b = largest[i];
      const std::string name = tag_name(b->tag);
      out += frugal::detail::str_cat(sep, bytes(b->size), " (tag ", name.empty() ? "(none)" : name, ", op ",
                                     *b->op ? b->op : "(none)", ", ", phase_name(b->phase), ")");
      sep = ", ";
    }
  }
  if (stats.free_bytes > 0)
    out += frugal::detail::str_cat("\n  cached and free: ", bytes(stats.free_bytes), ", the largest piece ",
                                   bytes(stats.largest_free_block), " (fragmentation ",
                                   int(stats.fragmentation * 100 + 0.5),
                                   "%): a request larger than the largest piece needs a new segment");

  out += "\n  to fit:";
  const int64_t activations = by_category[int(Category::Activations)];
  const int64_t optimizer = by_category[int(Category::OptimizerState)];
  if (activations > 0) {
    out += frugal::detail::str_cat(
        "\n  - recompute activations in backward (autograd::recompute, nn::Sequential::recompute_every): up "
        "to ",
        bytes(activations), ", the activations live now, less the inputs each segment keeps");
    out += frugal::detail::str_cat("\n  - run in mixed precision (amp::Autocast, bf16 or f16): about ",
                                   bytes(activations / 2), ", half of the activations if they are f32");
    out += frugal::detail::str_cat(
        "\n  - accumulate gradients over smaller micro-batches (k of them: backward() on each, then one "
        "optimizer step): the activations times (1 - 1/k), ",
        bytes(activations - activations / 4), " for k = 4");
  } else {
    out +=
        "\n  - accumulate gradients over smaller micro-batches, or recompute activations in backward "
        "(autograd::recompute): no activations are live now, but the request may be one";
  }
  if (optimizer > 0)
    out += frugal::detail::str_cat("\n  - SGD with momentum instead of Adam (optim::SGD): about ",
                                   bytes(optimizer / 2),
                                   ", half of the optimizer state (one buffer a parameter instead of two)");
  if (data_loader > 0)
    out += frugal::detail::str_cat(
        "\n  - prefetch fewer batches (data::DataLoaderOptions::prefetch): the "
        "loader's batches hold ",
        bytes(data_loader));
  out +=
      "\n  - free tensors you no longer need, lower the batch size, or raise the limit with "
      "memory::set_memory_limit";
  return out;
}

}  // namespace frugal::memory::detail

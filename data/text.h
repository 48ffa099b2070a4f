// A byte-level text corpus for character models: by default the English fortunes of Debian's `fortunes`
// package (every file without an extension in /usr/share/games/fortunes, concatenated in sorted file order,
// about 2.58 MB). Tokens are bytes; the vocabulary is the distinct bytes of the corpus, sorted (about 114).
// The corpus stays in memory as u8 token ids; the last val_fraction of it is the validation split.
//
//   data::TextDataset train(data::TextDatasetOptions().context(64));
//   Generator gen(42);
//   data::Batch b = train.sample_batch(32, gen);  // input, target: i64 [32, 64]; target: input shifted
//   std::string s = train.decode(b.input.select(0, 0));
//   data::TextDataset val(data::TextDatasetOptions().context(64).split(data::TextSplit::Validation));
//   // or as a Dataset whose indices are window starts, for a data::DataLoader
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../core/rng.h"
#include "../core/tensor.h"
#include "dataset.h"

namespace frugal::data {

inline constexpr const char* kFortunesRoot = "/usr/share/games/fortunes";

enum class TextSplit { Train, Validation };

struct TextDatasetOptions {
  std::string root_ = kFortunesRoot;  // a folder of text files
  double val_fraction_ = 0.1;         // the last fraction of the corpus, held out for validation
  int64_t context_ = 64;              // tokens per window
  TextSplit split_ = TextSplit::Train;

  TextDatasetOptions& root(std::string v) { return root_ = std::move(v), *this; }
  TextDatasetOptions& val_fraction(double v) { return val_fraction_ = v, *this; }
  TextDatasetOptions& context(int64_t v) { return context_ = v, *this; }
  TextDatasetOptions& split(TextSplit v) { return split_ = v, *this; }
};

// The corpus files of a folder: regular files whose name has no '.' (so not fortune's .dat indexes or .u8
// links), sorted by name. Throws Error naming the folder when it is missing or holds none.
std::vector<std::string> text_corpus_files(const std::string& root);

class TextDataset : public Dataset {
 public:
  explicit TextDataset(const TextDatasetOptions& options = {});

  // Windows in the split: one per start position with context + 1 tokens after it (input and target).
  int64_t size() const override;
  // input [B, context] and target [B, context] (i64 token ids) of the windows starting at `indices`
  // (positions in the split, each in [0, size())); target is input shifted by one token. dtype is ignored.
  Batch get_batch(std::span<const int64_t> indices, DType dtype = DType::I64) const override;
  // A batch of windows at random starts drawn from gen.
  Batch sample_batch(int64_t batch, Generator& gen) const;

  int64_t vocab_size() const { return int64_t(vocab_.size()); }
  const std::vector<uint8_t>& vocabulary() const { return vocab_; }  // token id -> byte, ascending
  // Token ids (i64 [n]) of a text; throws Error naming a byte that is not in the vocabulary.
  Tensor encode(std::string_view text) const;
  // The text of token ids (an integer tensor of any shape, read in order); throws for an id out of range.
  std::string decode(const Tensor& ids) const;

  const Tensor& tokens() const { return tokens_; }  // the whole corpus, u8 token ids [n]
  Tensor split_tokens() const;                      // this split's part of tokens() (a view)
  int64_t train_tokens() const { return train_tokens_; }
  const std::vector<std::string>& files() const { return files_; }
  const TextDatasetOptions& options() const { return options_; }

 private:
  TextDatasetOptions options_;
  std::vector<std::string> files_;
  std::vector<uint8_t> vocab_;
  int16_t id_of_[256];  // byte -> token id, -1 when absent
  Tensor tokens_;
  int64_t train_tokens_ = 0;
};

}  // namespace frugal::data

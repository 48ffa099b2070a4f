// data::TextDataset: reading the corpus folder, the byte vocabulary, the train/validation split and windows.
#include "data/text.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/memory_history.h"
#include "core/ops.h"

namespace frugal::data {

namespace fs = std::filesystem;

std::vector<std::string> text_corpus_files(const std::string& root) {
  std::error_code ec;
  FRUGAL_CHECK(fs::is_directory(root, ec), "TextDataset: the corpus folder ", root,
               " does not exist; install Debian's fortunes (apt-get install fortunes) or pass another folder "
               "with TextDatasetOptions().root(...)");
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (name.find('.') != std::string::npos || !entry.is_regular_file()) continue;
    names.push_back(name);
  }
  FRUGAL_CHECK(!names.empty(), "TextDataset: the corpus folder ", root,
               " holds no text files (regular files without an extension); install Debian's fortunes "
               "(apt-get install fortunes) or pass another folder with TextDatasetOptions().root(...)");
  std::sort(names.begin(), names.end());
  std::vector<std::string> paths;
  for (const auto& n : names) paths.push_back((fs::path(root) / n).string());
  return paths;
}

TextDataset::TextDataset(const TextDatasetOptions& options) : options_(options) {
  memory::PhaseScope phase(memory::Phase::Data);  // Note [memory phases]
  FRUGAL_CHECK(options.val_fraction_ >= 0 && options.val_fraction_ < 1,
               "TextDataset: val_fraction must lie in [0, 1), got ", options.val_fraction_);
  FRUGAL_CHECK(options.context_ > 0, "TextDataset: context must be positive, got ", options.context_);
  files_ = text_corpus_files(options.root_);
  std::vector<uint8_t> bytes;
  for (const auto& path : files_) {
    std::ifstream in(path, std::ios::binary);
    FRUGAL_CHECK(in, "TextDataset: cannot read ", path);
    bytes.insert(bytes.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  FRUGAL_CHECK(!bytes.empty(), "TextDataset: the corpus files in ", options.root_, " are all empty");

  bool present[256] = {};
  for (uint8_t b : bytes) present[b] = true;
  std::fill(std::begin(id_of_), std::end(id_of_), int16_t(-1));
  for (int b = 0; b < 256; ++b)
    if (present[b]) {
      id_of_[b] = int16_t(vocab_.size());
      vocab_.push_back(uint8_t(b));
    }
  for (uint8_t& b : bytes) b = uint8_t(id_of_[b]);  // at most 256 distinct bytes: ids fit in u8
  const int64_t n = int64_t(bytes.size());
  tokens_ = from_buffer(bytes.data(), {n}, DType::U8);
  train_tokens_ = n - int64_t(double(n) * options.val_fraction_);

  const int64_t len = split_tokens().numel();
  FRUGAL_CHECK(len > options.context_, "TextDataset: the ",
               options.split_ == TextSplit::Train ? "training" : "validation", " split has ", len,
               " tokens, too few for one window of context ", options.context_, " (", options.context_ + 1,
               " tokens); use a larger corpus, a smaller context or another val_fraction");
}

Tensor TextDataset::split_tokens() const {
  return options_.split_ == TextSplit::Train
             ? ops::narrow(tokens_, 0, 0, train_tokens_)
             : ops::narrow(tokens_, 0, train_tokens_, tokens_.numel() - train_tokens_);
}

int64_t TextDataset::size() const { return split_tokens().numel() - options_.context_; }

Batch TextDataset::get_batch(std::span<const int64_t> indices, DType) const {
  memory::PhaseScope phase(memory::Phase::Data);  // Note [memory phases]
  const int64_t b = int64_t(indices.size()), c = options_.context_, n = size();
  const Tensor part = split_tokens();
  const uint8_t* tok = part.data<uint8_t>();
  std::vector<int64_t> input(size_t(b * c)), target(size_t(b * c));
  for (int64_t i = 0; i < b; ++i) {
    const int64_t start = indices[size_t(i)];
    FRUGAL_CHECK_INDEX(start >= 0 && start < n, "TextDataset.get_batch: window start ", start,
                       " is out of range; this split has ", n, " windows of context ", c);
    for (int64_t j = 0; j < c; ++j) {
      input[size_t(i * c + j)] = tok[start + j];
      target[size_t(i * c + j)] = tok[start + j + 1];
    }
  }
  return {tensor(input, {b, c}), tensor(target, {b, c})};
}

Batch TextDataset::sample_batch(int64_t batch, Generator& gen) const {
  memory::PhaseScope phase(memory::Phase::Data);  // Note [memory phases]
  FRUGAL_CHECK(batch > 0, "TextDataset.sample_batch: batch must be positive, got ", batch);
  const std::vector<int64_t> starts = randint(0, size(), {batch}, DType::I64, &gen).to_vector<int64_t>();
  return get_batch(starts);
}

Tensor TextDataset::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const uint8_t b = uint8_t(text[i]);
    FRUGAL_CHECK(id_of_[b] >= 0, "TextDataset.encode: byte ", int(b), " at position ", i,
                 " is not in the corpus's vocabulary of ", vocab_.size(), " bytes");
    ids.push_back(id_of_[b]);
  }
  return tensor(ids, {int64_t(ids.size())});
}

std::string TextDataset::decode(const Tensor& ids) const {
  std::string out;
  for (int64_t id : ids.to_vector<int64_t>()) {
    FRUGAL_CHECK_INDEX(id >= 0 && id < vocab_size(), "TextDataset.decode: token id ", id,
                       " is out of range for a vocabulary of ", vocab_size());
    out.push_back(char(vocab_[size_t(id)]));
  }
  return out;
}

}  // namespace frugal::data

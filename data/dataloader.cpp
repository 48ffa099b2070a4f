// DataLoader: per-epoch order (Fisher-Yates over a counter-based generator) and the prefetching worker.
#include "data/dataloader.h"

#include <algorithm>
#include <numeric>

#include "core/memory.h"
#include "core/memory_history.h"
#include "core/rng.h"

namespace frugal::data {

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  FRUGAL_CHECK(dataset_ != nullptr, "DataLoader: the dataset is null");
  FRUGAL_CHECK(options_.batch_size_ >= 1, "DataLoader: batch_size must be at least 1, got ",
               options_.batch_size_);
  FRUGAL_CHECK(options_.prefetch_ >= 0, "DataLoader: prefetch must be >= 0 (0 = no worker thread), got ",
               options_.prefetch_);
  if (options_.sampler_) {
    FRUGAL_CHECK(
        !options_.shuffle_,
        "DataLoader: with a sampler, the sampler shuffles (DistributedSampler(..., shuffle)); leave the "
        "loader's shuffle off");
    FRUGAL_CHECK_SHAPE(options_.sampler_->dataset_size() == dataset_->size(),
                       "DataLoader: the sampler is for ", options_.sampler_->dataset_size(),
                       " examples, the dataset has ", dataset_->size());
  }
}

DataLoader::~DataLoader() { stop_worker(); }

int64_t DataLoader::num_batches() const {
  const int64_t n = options_.sampler_ ? options_.sampler_->num_samples() : dataset_->size();
  const int64_t b = options_.batch_size_;
  return options_.drop_last_ ? n / b : (n + b - 1) / b;
}

// Note [epoch order] is the DataLoader's and the DistributedSampler's.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  FRUGAL_CHECK(epoch >= 0, "epoch must be >= 0, got ", epoch);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t(0));
  // Note [epoch order]: each epoch draws from its own stretch of the generator's counter (2^32 blocks, enough
  // for 2^33 examples), so its order depends on (seed, epoch) only, never on how many epochs ran before.
  Generator gen(seed);
  gen.set_state({seed, uint64_t(epoch) << 32});
  uint32_t words[4];
  int used = 4;
  const auto next_u64 = [&] {
    if (used == 4) {
      Generator::block(gen.seed(), gen.reserve(1), words);
      used = 0;
    }
    const uint64_t v = uint64_t(words[used]) << 32 | words[used + 1];
    used += 2;
    return v;
  };
  // Fisher-Yates; j = floor(r * (i + 1) / 2^64) is uniform on [0, i] up to a bias below 2^-30.
  for (size_t i = order.size(); i-- > 1;) {
    const size_t j = size_t((unsigned __int128)next_u64() * (i + 1) >> 64);
    std::swap(order[i], order[j]);
  }
  return order;
}

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const {
  FRUGAL_CHECK(epoch >= 0, "DataLoader: epoch must be >= 0, got ", epoch);
  if (options_.sampler_) return options_.sampler_->indices(epoch);
  if (options_.shuffle_) return epoch_permutation(dataset_->size(), options_.seed_, epoch);
  std::vector<int64_t> order(size_t(dataset_->size()));
  std::iota(order.begin(), order.end(), int64_t(0));
  return order;
}

Batch DataLoader::make_batch(int64_t b) const {
  const int64_t begin = b * options_.batch_size_;
  const int64_t end = std::min<int64_t>(begin + options_.batch_size_, int64_t(order_.size()));
  return dataset_->get_batch(std::span<const int64_t>(order_.data() + begin, size_t(end - begin)),
                             options_.dtype_);
}

void DataLoader::begin_epoch(int64_t epoch) {
  stop_worker();
  order_ = epoch_order(epoch);
  started_ = true;
  delivered_ = 0;
  made_ = 0;
  if (options_.prefetch_ > 0 && !options_.in_caller_thread_ && num_batches() > 0)
    worker_ = std::thread([this, n = num_batches()] { run_worker(n); });
}

void DataLoader::run_worker(int64_t num_batches) {
  // Tags are per thread: the batches this thread allocates count under "data" in memory::tag_stats().
  memory::Tag tag("data");
  memory::PhaseScope phase(memory::Phase::Data);  // Note [memory phases]
  for (int64_t b = 0; b < num_batches; ++b) {
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || int64_t(queue_.size()) < options_.prefetch_; });
      if (stop_) return;
    }
    Slot slot;
    try {
      slot.batch = make_batch(b);
    } catch (...) {
      slot.error = std::current_exception();
    }
    const bool failed = slot.error != nullptr;
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(slot));
    }
    cv_.notify_all();
    if (failed) return;  // next() rethrows it and ends the epoch
  }
}

std::optional<Batch> DataLoader::next() {
  FRUGAL_CHECK(started_, "DataLoader::next: call begin_epoch(epoch) first (or iterate over loader.epoch(e))");
  if (delivered_ >= num_batches()) return std::nullopt;
  if (options_.prefetch_ == 0) {
    memory::Tag tag("data");
    memory::PhaseScope phase(memory::Phase::Data);
    const int64_t b = delivered_;
    delivered_ = num_batches();  // an exception below ends the epoch, as it does with the worker
    Batch batch = make_batch(b);
    delivered_ = b + 1;
    return batch;
  }
  if (options_.in_caller_thread_) {
    // What a worker that keeps up has made by now: this batch and `prefetch` after it.
    memory::Tag tag("data");
    memory::PhaseScope phase(memory::Phase::Data);
    while (made_ < num_batches() && made_ <= delivered_ + options_.prefetch_) {
      const int64_t b = made_++;
      try {
        queue_.push_back({make_batch(b), nullptr});
      } catch (...) {
        queue_.push_back({std::nullopt, std::current_exception()});
        made_ = num_batches();
      }
    }
  }
  Slot slot;
  {
    std::unique_lock lock(mutex_);
    // The worker pushes every batch of the epoch, or stops after pushing an error, so this wait ends.
    cv_.wait(lock, [&] { return !queue_.empty(); });
    slot = std::move(queue_.front());
    queue_.pop_front();
  }
  cv_.notify_all();
  ++delivered_;
  if (slot.error) {
    delivered_ = num_batches();
    std::rethrow_exception(slot.error);
  }
  return std::move(slot.batch);
}

void DataLoader::stop_worker() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard lock(mutex_);
  queue_.clear();
  stop_ = false;
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  FRUGAL_CHECK(dataset_size >= 0, "DistributedSampler: the dataset size must be >= 0, got ", dataset_size);
  FRUGAL_CHECK(num_replicas >= 1, "DistributedSampler: num_replicas must be at least 1, got ", num_replicas);
  FRUGAL_CHECK(rank >= 0 && rank < num_replicas, "DistributedSampler: rank ", rank, " is not in [0, ",
               num_replicas, ")");
}

int64_t DistributedSampler::num_samples() const {
  return drop_last_ ? dataset_size_ / num_replicas_ : (dataset_size_ + num_replicas_ - 1) / num_replicas_;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order;
  if (shuffle_) {
    order = epoch_permutation(dataset_size_, seed_, epoch);
  } else {
    FRUGAL_CHECK(epoch >= 0, "DistributedSampler: epoch must be >= 0, got ", epoch);
    order.resize(size_t(dataset_size_));
    std::iota(order.begin(), order.end(), int64_t(0));
  }
  const int64_t per_rank = num_samples(), total = per_rank * num_replicas_;
  // Padded by repeating the order from its start, so that every rank has as many (PyTorch's rule).
  for (size_t i = 0; int64_t(order.size()) < total && !order.empty(); ++i) order.push_back(order[i]);
  std::vector<int64_t> mine;
  mine.reserve(size_t(per_rank));
  for (int64_t i = rank_; i < total; i += num_replicas_) mine.push_back(order[size_t(i)]);
  return mine;
}

}  // namespace frugal::data

// DataLoader: batches from a Dataset, in order or shuffled per epoch (reproducibly), optionally prepared one
// or two batches ahead by a background thread. Not a multi-process loader: one worker thread is enough when a
// batch is a table look-up per pixel.
//
//   auto train = std::make_shared<data::FashionMNIST>();
//   data::DataLoader loader(train, data::DataLoaderOptions().batch_size(128).shuffle(true).seed(42));
//   for (int64_t epoch = 0; epoch < 10; ++epoch)
//     for (data::Batch& b : loader.epoch(epoch)) { ... b.input, b.target ... }
//   // or: loader.begin_epoch(e); while (auto b = loader.next()) { ... }
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "dataset.h"

namespace frugal::data {

// The example order of an epoch when shuffled: a permutation of [0, n) that depends only on (seed, epoch)
// (Note [epoch order]).
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

// Data-parallel training's share of each epoch (dist::DistributedDataParallel): the ranks' shares are
// disjoint, each num_samples() long, and together the whole epoch, in an order fixed by (seed, epoch) that
// every rank computes alike. The epoch's order (shuffled or not) is padded by repeating its start to a
// multiple of num_replicas (drop_last: cut to one), and rank r takes its elements r, r + num_replicas, ...,
// as torch.utils.data.DistributedSampler does.
//
//   auto sampler = std::make_shared<data::DistributedSampler>(train->size(), dist::world_size(),
//   dist::rank(),
//                                                              /*shuffle=*/true, seed);
//   data::DataLoader loader(train, data::DataLoaderOptions().batch_size(64).sampler(sampler));
class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  // This rank's example indices in epoch `epoch`.
  std::vector<int64_t> indices(int64_t epoch) const;
  int64_t num_samples() const;
  int64_t dataset_size() const { return dataset_size_; }

 private:
  int64_t dataset_size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
};

struct DataLoaderOptions {
  int64_t batch_size_ = 64;
  bool shuffle_ = false;
  bool drop_last_ = false;    // drop the last, smaller batch
  DType dtype_ = DType::F32;  // of the inputs (f32, f16, bf16, f64)
  int prefetch_ = 2;          // batches a background thread prepares ahead; 0 = in the caller's thread
  // Prepare the `prefetch` batches ahead in the caller's thread, at next(), instead of in a worker: the same
  // batches are alive as with a worker that keeps up (the one in use and `prefetch` ahead), made in one order
  // every run. A dry run (core/estimate.h) uses it to see what the worker's queue holds, and a run under a
  // memory::plan should use it too, so that it allocates in its dry run's order: a worker's batch made at
  // another moment can take a segment the plan counted on (Note [a planned run makes its batches in order],
  // examples/train_fmnist.cpp).
  bool in_caller_thread_ = false;
  uint64_t seed_ = 0;  // with the epoch number, fixes the shuffled order
  // Draws each epoch's indices from it (it shuffles; shuffle must be off).
  std::shared_ptr<const DistributedSampler> sampler_;

  DataLoaderOptions& batch_size(int64_t v) { return batch_size_ = v, *this; }
  DataLoaderOptions& shuffle(bool v) { return shuffle_ = v, *this; }
  DataLoaderOptions& drop_last(bool v) { return drop_last_ = v, *this; }
  DataLoaderOptions& dtype(DType v) { return dtype_ = v, *this; }
  DataLoaderOptions& prefetch(int v) { return prefetch_ = v, *this; }
  DataLoaderOptions& seed(uint64_t v) { return seed_ = v, *this; }
  DataLoaderOptions& in_caller_thread(bool v) { return in_caller_thread_ = v, *this; }
  DataLoaderOptions& sampler(std::shared_ptr<const DistributedSampler> v) {
    return sampler_ = std::move(v), *this;
  }
};

class DataLoader {
 public:
  explicit DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  ~DataLoader();  // stops and joins the worker, also in the middle of an epoch
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts epoch `epoch` (>= 0), abandoning any epoch in progress. With shuffle, the order is a permutation
  // that depends only on (seed, epoch): a run resumed at epoch e sees the batches it would have seen.
  void begin_epoch(int64_t epoch);
  // The next batch of the epoch, or nullopt when it is over. An exception thrown while a batch was made (in
  // the worker thread too) is rethrown here, and ends the epoch.
  std::optional<Batch> next();
  int64_t num_batches() const;
  // The example indices of an epoch, in the order the batches take them.
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  const DataLoaderOptions& options() const { return options_; }
  const Dataset& dataset() const { return *dataset_; }

  // for (Batch& b : loader.epoch(e)): begin_epoch(e), then next() until the epoch is over.
  class Iterator {
   public:
    using difference_type = std::ptrdiff_t;
    using value_type = Batch;
    Batch& operator*() { return *batch_; }
    Iterator& operator++() {
      batch_.reset();  // the batch in use goes before the next one is taken: one batch fewer alive
      batch_ = loader_->next();
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(std::default_sentinel_t) const { return !batch_.has_value(); }

   private:
    friend class DataLoader;
    explicit Iterator(DataLoader* loader) : loader_(loader), batch_(loader->next()) {}
    DataLoader* loader_;
    std::optional<Batch> batch_;
  };
  struct EpochRange {
    DataLoader* loader;
    Iterator begin() { return Iterator(loader); }
    std::default_sentinel_t end() { return {}; }
  };
  EpochRange epoch(int64_t e) {
    begin_epoch(e);
    return {this};
  }

 private:
  // A finished batch, or the exception that making it threw.
  struct Slot {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };
  Batch make_batch(int64_t b) const;  // batch b of the current epoch
  void run_worker(int64_t num_batches);
  void stop_worker();

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  std::vector<int64_t> order_;  // the current epoch's indices
  bool started_ = false;
  int64_t delivered_ = 0;  // batches next() has returned this epoch
  int64_t made_ = 0;       // batches made this epoch (in_caller_thread)

  // Shared with the worker thread (guarded by mutex_).
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Slot> queue_;  // at most prefetch_ batches
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace frugal::data

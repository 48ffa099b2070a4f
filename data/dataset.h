// The dataset interface the DataLoader draws batches from: a size and a way to assemble a batch from indices.
//
//   class Squares : public data::Dataset {
//     int64_t size() const override { return 100; }
//     data::Batch get_batch(std::span<const int64_t> idx, DType dtype) const override { ... }
//   };
#pragma once

#include <cstdint>
#include <span>

#include "../core/tensor.h"

namespace frugal::data {

struct Batch {
  Tensor input;   // [B, ...]
  Tensor target;  // [B, ...]
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // The examples at `indices` (each in [0, size())) stacked along a new first dim. dtype is the floating type
  // asked for inputs a dataset converts (pixels, say); datasets whose inputs are integers (tokens) may ignore
  // it. Called from the DataLoader's worker thread, so it must not change the dataset.
  virtual Batch get_batch(std::span<const int64_t> indices, DType dtype) const = 0;
};

}  // namespace frugal::data

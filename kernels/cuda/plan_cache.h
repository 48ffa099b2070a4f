// A small bounded cache, least recently used out first, and the key of a cuBLASLt GEMM plan (its descriptors,
// layouts and the algorithm the heuristic chose: kernels/cuda/gemm.cu). Host logic only, so that it is tested
// on machines without a GPU (tests/cuda/test_plan_cache.cpp).
//
//   LruCache<GemmPlanKey, std::unique_ptr<Plan>, GemmPlanKeyHash> plans(256);
//   if (auto* hit = plans.find(key)) use(**hit);
//   else use(*plans.insert(key, make_plan(key)));  // may evict (destroy) the least recently used plan
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <unordered_map>
#include <utility>

#include "core/error.h"

namespace frugal::gpu {

// Everything a cuBLASLt plan depends on, in cuBLAS's terms (column-major; "a" and "b" are cuBLAS's operands,
// our B^T and A^T): the device, the data types, transposes, sizes, leading dimensions, batch count and
// strides, the operands' address alignments (the heuristic's choice depends on them), whether beta is zero,
// the epilogue and the workspace the algorithm may use. Enums are kept as their integer values, so that this
// header needs no CUDA header.
struct GemmPlanKey {
  int device = 0;
  int ab_type = 0, c_type = 0;  // cudaDataType_t
  int op_a = 0, op_b = 0;       // cublasOperation_t
  int64_t m = 0, n = 0, k = 0;  // cuBLAS's: c is m x n
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  uint32_t align_a = 0, align_b = 0, align_c = 0;
  bool beta_nonzero = false;
  int epilogue = 0;  // cublasLtEpilogue_t
  int64_t workspace_bytes = 0;

  friend bool operator==(const GemmPlanKey&, const GemmPlanKey&) = default;
};

struct GemmPlanKeyHash {
  size_t operator()(const GemmPlanKey& k) const {
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](int64_t v) {  // boost's hash_combine, widened to 64 bits
      h ^= std::hash<int64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    for (int64_t v : {int64_t(k.device),
                      int64_t(k.ab_type),
                      int64_t(k.c_type),
                      int64_t(k.op_a),
                      int64_t(k.op_b),
                      k.m,
                      k.n,
                      k.k,
                      k.lda,
                      k.ldb,
                      k.ldc,
                      k.batch,
                      k.stride_a,
                      k.stride_b,
                      k.stride_c,
                      int64_t(k.align_a),
                      int64_t(k.align_b),
                      int64_t(k.align_c),
                      int64_t(k.beta_nonzero),
                      int64_t(k.epilogue),
                      k.workspace_bytes})
      mix(v);
    return size_t(h);
  }
};

// At most `capacity` values; find() makes an entry the most recently used; insert() of a new key evicts the
// least recently used one when full. Values are destroyed on eviction, so a value that owns resources
// (cuBLASLt descriptors) releases them then. Not thread-safe: the caller holds its own lock.
template <typename Key, typename Value, typename Hash = std::hash<Key>>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity) {
    FRUGAL_CHECK(capacity > 0, "LruCache: the capacity must be positive");
  }

  // The value for key, or null; a hit becomes the most recently used.
  Value* find(const Key& key) {
    auto it = index_.find(key);
    if (it == index_.end()) {
      ++misses_;
      return nullptr;
    }
    ++hits_;
    items_.splice(items_.begin(), items_, it->second);
    return &it->second->second;
  }

  // Stores value under key (replacing any value there) as the most recently used, evicting the least
  // recently used entry when the cache is full. The reference stays valid until that entry is evicted.
  Value& insert(const Key& key, Value value) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      it->second->second = std::move(value);
      items_.splice(items_.begin(), items_, it->second);
      return it->second->second;
    }
    if (items_.size() == capacity_) {
      index_.erase(items_.back().first);
      items_.pop_back();
      ++evictions_;
    }
    items_.emplace_front(key, std::move(value));
    index_.emplace(key, items_.begin());
    return items_.front().second;
  }

  bool contains(const Key& key) const { return index_.count(key) != 0; }
  size_t size() const { return items_.size(); }
  size_t capacity() const { return capacity_; }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  uint64_t evictions() const { return evictions_; }
  void clear() {
    index_.clear();
    items_.clear();
  }

 private:
  size_t capacity_;
  std::list<std::pair<Key, Value>> items_;  // most recently used first
  std::unordered_map<Key, typename std::list<std::pair<Key, Value>>::iterator, Hash> index_;
  uint64_t hits_ = 0, misses_ = 0, evictions_ = 0;
};

}  // namespace frugal::gpu

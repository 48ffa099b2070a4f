// Random numbers: a counter-based Philox4x32-10 generator (Random123). Its whole state is (seed, offset), so
// it saves, restores and replays exactly (recompute segments rely on this), and element i of a draw depends
// only on (seed, offset, i): results do not change with the number of threads.
//
//   manual_seed(42);
//   auto state = default_generator().state();  Tensor a = rand({3});
//   default_generator().set_state(state);      Tensor b = rand({3});  // equal to a
#pragma once

#include <atomic>
#include <cstdint>

namespace frugal {

class Generator {
 public:
  struct State {
    uint64_t seed = 0;
    uint64_t offset = 0;  // 128-bit Philox blocks already used
    friend bool operator==(const State&, const State&) = default;
  };

  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  void manual_seed(uint64_t seed);
  uint64_t seed() const { return seed_; }
  State state() const { return {seed_, offset_.load()}; }
  void set_state(State s);
  // Reserves n_blocks blocks of four 32-bit values and returns the first block's counter.
  uint64_t reserve(uint64_t n_blocks) { return offset_.fetch_add(n_blocks); }
  // The four 32-bit values of block `counter` under `seed`.
  static void block(uint64_t seed, uint64_t counter, uint32_t out[4]);

 private:
  uint64_t seed_;
  std::atomic<uint64_t> offset_{0};
};

// The generator factories use when none is given. Its seed is 0 until manual_seed() is called.
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace frugal

// Philox through Random123, and the default generator.
#include "core/rng.h"

#include <Random123/philox.h>

namespace frugal {

void Generator::manual_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

void Generator::set_state(State s) {
  seed_ = s.seed;
  offset_ = s.offset;
}

void Generator::block(uint64_t seed, uint64_t counter, uint32_t out[4]) {
  r123::Philox4x32 philox;
  r123::Philox4x32::ctr_type ctr = {{uint32_t(counter), uint32_t(counter >> 32), 0, 0}};
  r123::Philox4x32::key_type key = {{uint32_t(seed), uint32_t(seed >> 32)}};
  const auto r = philox(ctr, key);
  for (int i = 0; i < 4; ++i) out[i] = r[i];
}

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace frugal

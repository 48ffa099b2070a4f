// The thread pool's size: FRUGAL_NUM_THREADS at load, set_num_threads() after.
#include "core/parallel.h"

#include <cstdlib>

#include "core/error.h"

namespace frugal {

namespace {
// Applies FRUGAL_NUM_THREADS once, when the library loads, before any parallel region runs.
const bool kEnvApplied = [] {
  if (const char* s = std::getenv("FRUGAL_NUM_THREADS")) {
    const int n = std::atoi(s);
    if (n >= 1) omp_set_num_threads(n);
  }
  return true;
}();
}  // namespace

int num_threads() { return omp_get_max_threads(); }

void set_num_threads(int n) {
  FRUGAL_CHECK(n >= 1, "set_num_threads: expected at least 1 thread, got ", n);
  omp_set_num_threads(n);
}

}  // namespace frugal

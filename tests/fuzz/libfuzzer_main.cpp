// The libFuzzer entry point of one target (tests/fuzz/targets.h), chosen by FRUGAL_FUZZ_TARGET_NAME.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const frugal::fuzz::Target& t = frugal::fuzz::target(FRUGAL_FUZZ_TARGET_NAME);
  t.run(data, size);
  return 0;
}

// frugal's fuzz targets: every reader of bytes that come from elsewhere, driven by arbitrary input, and the
// op layer driven by programs of calls with arbitrary arguments ("ops") and by programs of valid calls whose
// results are compared with naive references ("kernels"). A target returns when the reader accepted the bytes
// or refused them with frugal::Error; anything else (a crash, a sanitizer report, another exception, such as
// the kernels target's std::logic_error for a wrong result, a hang) is a finding. Built as libFuzzer programs
// fuzz_<name> with clang and -DFRUGAL_FUZZ=ON, and run over the seed corpus and the regression files by the
// test program test_fuzz_regressions in every build.
//
//   build-fuzz/tests/fuzz_safetensors -max_total_time=30 corpus/     (seeds: build-fuzz/tests/fuzz_seeds DIR)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace frugal::fuzz {

struct Target {
  const char* name;
  void (*run)(const uint8_t* data, size_t size);
  // Writes a few valid inputs, as frugal itself writes them, into `dir` (an existing folder).
  void (*write_seeds)(const std::string& dir);
};

const std::vector<Target>& targets();
// The "ops" target's run and seeds (tests/fuzz/ops_target.cpp), and the "kernels" target's
// (tests/fuzz/kernels_target.cpp).
void run_ops(const uint8_t* data, size_t size);
void seeds_ops(const std::string& dir);
void run_kernels(const uint8_t* data, size_t size);
void seeds_kernels(const std::string& dir);
const Target& target(const std::string& name);  // throws std::invalid_argument for an unknown name

}  // namespace frugal::fuzz

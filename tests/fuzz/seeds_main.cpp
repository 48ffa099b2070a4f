// fuzz_seeds DIR: writes every target's seed inputs into DIR/<target>/, as frugal writes them.
#include <cstdio>
#include <filesystem>

#include "tests/fuzz/targets.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  for (const frugal::fuzz::Target& t : frugal::fuzz::targets()) {
    const std::filesystem::path dir = std::filesystem::path(argv[1]) / t.name;
    std::filesystem::create_directories(dir);
    t.write_seeds(dir.string());
  }
  return 0;
}

// A run whose rank fails, for tests/CMakeLists.txt's failure tests under mpirun -np 2: the other rank waits
// in an all_reduce that will never complete, and the run must still end, with a clear message, in bounded
// time (Note [the communication thread], dist/dist.h).
//   dist_failure throw: the last rank throws out of the dist::Guard's scope;
//   dist_failure hang:  the last rank sleeps instead of reducing; the others' wait runs out
//                       (FRUGAL_DIST_TIMEOUT);
//   dist_failure die:   the last rank is killed (SIGKILL: nothing of it runs on).
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "dist/dist.h"

int main(int argc, char** argv) {
  using namespace frugal;
  const bool hang = argc > 1 && std::strcmp(argv[1], "hang") == 0;
  const bool die = argc > 1 && std::strcmp(argv[1], "die") == 0;
  try {
    dist::Guard guard;  // its destructor sees the exception leave and stops every rank
    const bool failing = dist::rank() == dist::world_size() - 1;
    if (failing && die) std::raise(SIGKILL);
    if (failing && !hang) throw Error("a rank's own error");
    if (failing && hang) std::this_thread::sleep_for(std::chrono::seconds(600));
    Tensor t = ones({4});
    dist::all_reduce(t);
    std::printf("the all_reduce finished, which it must not\n");
  } catch (const Error& e) {
    std::printf("not reached: %s\n", e.what());
  }
  return 0;
}

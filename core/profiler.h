// The profiler: how long each op takes, forward and backward, on which shapes and dtype, and how many bytes
// it allocates; a table of the ops by total time (as PyTorch's key_averages().table()), and the op slices in
// the Chrome trace the memory history writes (core/memory_history.h), so Perfetto shows each op above the
// bytes it moved.
//
//   {
//     profiler::Profile p("step.trace.json");  // records from here...
//     train_step();
//   }                                           // ...to here, and writes the trace
//   std::cout << profiler::summary();           // op, phase, calls, total, mean, bytes
//
// Note [what the profiler times]
// The ops time themselves: the outermost memory::OpScope of each op function of core/ (Note [op names in
// the history]) and of each backward rule the engine runs is one record, with its wall time on the calling
// thread (kernels that run on the thread pool count inside it), the shapes and dtype of its inputs (a
// backward rule's input is the gradient it receives), the phase (Note [memory phases]: a backward rule's
// record is in phase backward), and the bytes allocated inside it (rounded blocks, on any device; the ops it
// calls count in it). What is no op is not timed: views, the tape's bookkeeping, the optimizer's loop between
// its ops. While no profile records, an op pays one relaxed load of a flag. While one records, an op pays two
// clock reads, its input shapes and a short locked append (bench/bench_history.cpp measures it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtype.h"
#include "memory_history.h"

namespace frugal::profiler {

inline constexpr int kMaxInputs = 3;  // the shapes of an op's first three inputs are kept
inline constexpr int kMaxDims = 4;    // and of each its first four sizes

struct OpRecord {
  const char* name = "";  // the op's (a string that lives for the program)
  memory::Phase phase = memory::Phase::Other;
  DType dtype = DType::F32;  // of its first input (F32 when it has none)
  uint8_t num_inputs = 0;    // inputs it named (shapes kept for the first kMaxInputs)
  int8_t ndim[kMaxInputs] = {};
  uint32_t thread = 0;      // a small number per thread (the memory history's)
  int64_t start_ns = 0;     // steady clock, nanoseconds since its epoch
  int64_t duration_ns = 0;  // wall time
  int64_t bytes = 0;        // allocated inside it (rounded), freed or not
  int64_t dims[kMaxInputs][kMaxDims] = {};

  std::string shapes() const;  // "[64, 784], [256, 784]" ("[8, 3, 32, 32, ...]" beyond kMaxDims sizes)
};

// Every record of one (op, phase): calls, wall times and bytes. Ops are told apart by name.
struct OpStats {
  std::string name;
  memory::Phase phase = memory::Phase::Other;
  int64_t calls = 0;
  int64_t total_ns = 0;
  int64_t min_ns = 0;
  int64_t max_ns = 0;
  int64_t bytes = 0;  // allocated by all its calls
};

// Note [profile bounds]
// The statistics of every op call are exact however long the profile runs. The records themselves (for the
// trace; about 150 bytes each) stop at max_records, as the memory history does (Note [history bounds]):
// the trace then says how many were dropped.
inline constexpr size_t kDefaultMaxRecords = size_t(1) << 18;

// Records while alive. If no profile records, it starts a fresh one (dropping the previous profile's
// records and statistics) and stops it when it dies or at stop(); then, when trace_path is not empty, it
// writes the trace there (write_trace). If one already records, it joins that one and neither clears nor
// stops it.
class Profile {
 public:
  explicit Profile(std::string trace_path = "", size_t max_records = kDefaultMaxRecords);
  // Stops and writes as stop() does; a trace that cannot be written is reported on stderr (a destructor
  // does not throw).
  ~Profile();
  Profile(const Profile&) = delete;
  Profile& operator=(const Profile&) = delete;
  // Stops the recording this guard started and writes the trace; throws Error when it cannot be written.
  // Nothing when it joined another recording or has stopped already.
  void stop();
  bool owns() const { return generation_ != 0; }

 private:
  std::string path_;
  uint64_t generation_ = 0;  // of the recording it started, 0 when it joined one or has stopped
};

bool recording();
// The latest profile's (so far, while it records): the records in the order the ops ended, and the
// statistics per (op, phase), largest total time first.
std::vector<OpRecord> records();
std::vector<OpStats> op_stats();
// How many records the bound dropped (Note [profile bounds]).
int64_t dropped_records();
// The statistics as a table, largest total time first: op, phase, calls, total ms, mean us, % of the
// ops' time, bytes; at most max_rows rows, then one line for the rest.
std::string summary(size_t max_rows = 30);
// The latest profile as a Chrome trace: its op slices ("ph":"X", one track per thread) and, when the memory
// history of the CPU recorded in the same time span, that history's counters and events (Note [memory
// trace format]). Throws Error naming the path when it cannot be written.
void write_trace(const std::string& path);

}  // namespace frugal::profiler

namespace frugal::profiler::detail {
// The storage layer counts each allocation here while a profile records, for the op that makes it.
void count_allocation(int64_t bytes);
}  // namespace frugal::profiler::detail

// What the example trainers share: reading byte sizes from the command line and the memory report by
// category from the arena's tags. Uses the public header only.
#pragma once

#include <cstdio>
#include <map>
#include <string>

#include <frugal/frugal.h>

namespace examples {

using namespace frugal;

// "64M", "1.5G", "512K", "1000": bytes.
inline int64_t parse_bytes(const std::string& s) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    throw Error("--memory-limit: cannot read '" + s + "'; use bytes or a suffix K, M, G (e.g. 64M)");
  }
  const std::string unit = s.substr(used);
  double scale = 1;
  if (unit == "K" || unit == "k" || unit == "KiB")
    scale = 1024.0;
  else if (unit == "M" || unit == "m" || unit == "MiB")
    scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "g" || unit == "GiB")
    scale = 1024.0 * 1024 * 1024;
  else if (!unit.empty())
    throw Error("--memory-limit: unknown unit '" + unit + "'; use K, M or G");
  FRUGAL_CHECK(v > 0, "--memory-limit must be positive, got ", s);
  return int64_t(v * scale);
}

// Standard output goes a line at a time even into a pipe or a file, so that what a run printed before an
// error (the banner, the epochs) comes before the error on stderr, as it happened.
inline void line_buffered_stdout() { std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ); }

// A run that ran out of memory ends here: the library's error, whose advice names library calls, then the
// flags of this program that do the same (`flags`), then the arena's summary. Returns the exit status, 2.
inline int report_out_of_memory(const OutOfMemoryError& e, const char* program, const char* flags) {
  std::fflush(stdout);
  std::fprintf(stderr, "\n%s\n\n%s: to fit, try %s\n\n%s", e.what(), program, flags,
               memory::memory_summary(kCPU).c_str());
  return 2;
}

// Peak and current bytes per category, from the arena's tags: parameters, gradients (the leaves' .grad),
// optimizer state, activations (what the forward keeps for backward, and its recomputation), data (the
// dataset held in memory and the batches made from it), and other (backward temporaries, evaluation,
// untagged). A category's peak adds up the peaks of its tags, an upper bound when it spans several tags.
inline std::string memory_report() {
  struct Row {
    int64_t current = 0, peak = 0;
  };
  std::map<std::string, Row> rows;
  const char* order[] = {"parameters", "gradients", "optimizer state", "activations", "data", "other"};
  for (const char* c : order) rows[c];
  for (const auto& t : memory::tag_stats()) {
    std::string cat = "other";
    if (t.tag == "parameters")
      cat = "parameters";
    else if (t.tag == "gradients")
      cat = "gradients";
    else if (t.tag == "optimizer")
      cat = "optimizer state";
    else if (t.tag.rfind("activations", 0) == 0 || t.tag.find("recompute") != std::string::npos)
      cat = "activations";
    else if (t.tag == "data" || t.tag == "dataset")
      cat = "data";
    rows[cat].current += t.allocated.current;
    rows[cat].peak += t.allocated.peak;
  }
  std::string out = "memory by category (arena tags)          current            peak\n";
  char line[160];
  for (const char* c : order) {
    std::snprintf(line, sizeof line, "  %-34s %12s %15s\n", c, memory::format_bytes(rows[c].current).c_str(),
                  memory::format_bytes(rows[c].peak).c_str());
    out += line;
  }
  const memory::Stats s = memory::stats();
  std::snprintf(line, sizeof line, "  %-34s %12s %15s\n  %-34s %12s %15s\n", "all allocated (exact)",
                memory::format_bytes(s.allocated.current).c_str(),
                memory::format_bytes(s.allocated.peak).c_str(), "reserved from the system",
                memory::format_bytes(s.reserved.current).c_str(),
                memory::format_bytes(s.reserved.peak).c_str());
  out += line;
  return out;
}

}  // namespace examples

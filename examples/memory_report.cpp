// memory_report: where the bytes go under each memory technique. Runs N steps of W1 (mlp), W2 (cnn) or W3
// (gpt) of shared/WORKLOADS.md under each technique and the useful combination, each in a fresh state, and
// prints one Markdown table (or JSON) of what the arena measured: peak bytes in total and by category at the
// peak, the ratio to the baseline's peak, the step-time ratio, the loss beside the baseline's, and when to
// use it. The measuring is examples/techniques.h.
//
//   build/examples/memory_report --model gpt --steps 10
//   build/examples/memory_report --model mlp --json
//   build/examples/memory_report --model cnn --steps 5 --svg-dir /tmp/svg   # one timeline per technique
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "techniques.h"

using namespace frugal;

namespace {

// --svg-dir must be a folder that exists and can be written, checked before any run.
std::string check_svg_dir(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return "the folder '" + dir + "' does not exist";
  if (::access(dir.c_str(), W_OK) != 0)
    return "the folder '" + dir + "' is not writable (" + std::strerror(errno) + ")";
  return "";
}

const char* workload_id(const std::string& model) {
  return model == "mlp" ? "W1" : model == "cnn" ? "W2" : "W3";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Peak memory by category of W1 (mlp), W2 (cnn) or W3 (gpt) under each memory technique"};
  techniques::Config cfg;
  bool json = false;
  std::string svg_dir;
  app.add_option("--model", cfg.model, "mlp (W1), cnn (W2) or gpt (W3)")
      ->check(CLI::IsMember({"mlp", "cnn", "gpt"}));
  app.add_option("--steps", cfg.steps, "training steps per technique (the first is not timed)")
      ->check(CLI::Validator(examples::integer_in(1, 1000000), "[1, 10^6]"));
  app.add_flag("--json", json, "print JSON (exact bytes) instead of the Markdown table");
  app.add_option("--svg-dir", svg_dir, "write each technique's memory timeline here, <model>-<technique>.svg")
      ->check(CLI::Validator(check_svg_dir, "DIR"));
  CLI11_PARSE(app, argc, argv);
  examples::line_buffered_stdout();

  try {
    const techniques::Workload workload(cfg);
    cfg = workload.config();
    std::vector<techniques::Row> rows;
    for (const techniques::Technique& t : techniques::techniques_for(cfg.model)) {
      std::fprintf(stderr, "memory_report: %s, %lld steps of %s\n", workload_id(cfg.model),
                   static_cast<long long>(cfg.steps), t.name.c_str());
      memory::HistoryRecord record;
      rows.push_back(workload.run(t, svg_dir.empty() ? nullptr : &record));
      rows.back().estimated_peak = workload.estimate(t);
      if (!svg_dir.empty())
        memory::write_svg((std::filesystem::path(svg_dir) / (cfg.model + "-" + t.key + ".svg")).string(),
                          record);
    }
    // The baseline again, for Note [timing drift] in techniques.h.
    std::fprintf(stderr, "memory_report: %s, the baseline again (a check of the timing)\n",
                 workload_id(cfg.model));
    const techniques::Row again = workload.run(techniques::techniques_for(cfg.model).front());
    const std::string note = techniques::timing_note(rows.front(), again);
    if (json) {
      std::printf("%s\n", techniques::to_json(rows, cfg, &again).dump(2).c_str());
    } else {
      std::printf(
          "%s (%s), %lld steps per technique, batch %lld, %d threads; bytes at the peak of allocated bytes "
          "(exact, from the arena), time the median step after the first\n\n%s",
          workload_id(cfg.model), cfg.model.c_str(), static_cast<long long>(cfg.steps),
          static_cast<long long>(cfg.batch), num_threads(), techniques::markdown_table(rows).c_str());
      std::printf("\n%s\n", techniques::estimate_line(rows).c_str());
      if (!note.empty()) std::printf("\nnote: %s\n", note.c_str());
    }
    if (!svg_dir.empty())
      std::fprintf(stderr, "memory_report: %zu timelines in %s\n", rows.size(), svg_dir.c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

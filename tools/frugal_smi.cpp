// frugal-smi: what `nvidia-smi` shows for a GPU, for every running frugal process of this user on any
// device: its allocators' allocated, peak, reserved and limit bytes and the tags that hold the most, read
// from the pages the processes publish (Note [frugal-smi page] in core/smi_page.h). Needs nothing from the
// processes it lists, nor the library itself.
//
//   frugal-smi            # one table
//   frugal-smi -l 1       # refreshed every second, like watch -n 1 nvidia-smi
//   frugal-smi --json     # one JSON object per process and line
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "core/smi_page.h"

namespace {

using namespace frugal;

// "1.50 MiB", "512 B", as memory::format_bytes writes them (not linked: this program does without the
// library).
std::string format_bytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = double(bytes) / 1024;
  int unit = 0;
  while (v >= 1024 && unit < 3) v /= 1024, ++unit;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[unit]);
  return buf;
}

std::string format_uptime(double seconds) {
  const auto s = int64_t(seconds);
  char buf[32];
  if (s >= 86400)
    std::snprintf(buf, sizeof buf, "%lldd %02lld:%02lld", (long long)(s / 86400), (long long)(s / 3600 % 24),
                  (long long)(s / 60 % 60));
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)(s / 3600), (long long)(s / 60 % 60),
                  (long long)(s % 60));
  return buf;
}

nlohmann::ordered_json to_json(const smi::Process& p) {
  nlohmann::ordered_json devices = nlohmann::ordered_json::array();
  for (const smi::DeviceFigures& d : p.devices) {
    nlohmann::ordered_json tags = nlohmann::ordered_json::array();
    for (const smi::TagBytes& t : d.top_tags) tags.push_back({{"tag", t.tag}, {"bytes", t.bytes}});
    devices.push_back({{"device", d.device},
                       {"allocator", d.allocator},
                       {"allocated", d.figures.allocated},
                       {"peak", d.figures.peak},
                       {"reserved", d.figures.reserved},
                       {"reserved_peak", d.figures.reserved_peak},
                       {"limit", d.figures.limit},
                       {"top_tags", tags}});
  }
  return {{"pid", p.pid},
          {"program", p.program},
          {"uptime_s", int64_t(p.uptime_s)},
          {"devices", devices},
          {"dropped_devices", p.dropped_devices}};
}

void print_table(const smi::Scan& scan) {
  char when[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  std::printf("frugal-smi  %s  %zu process%s of user %u\n", when, scan.processes.size(),
              scan.processes.size() == 1 ? "" : "es", unsigned(getuid()));
  if (scan.processes.empty()) return;
  std::printf("%8s  %-16s %10s  %-9s %-6s %11s %11s %11s %11s  %s\n", "PID", "PROGRAM", "UPTIME", "DEVICE",
              "KIND", "ALLOCATED", "PEAK", "RESERVED", "LIMIT", "TOP TAGS (live bytes)");
  for (const smi::Process& p : scan.processes) {
    bool first = true;
    auto lead = [&] {
      if (first)
        std::printf("%8lld  %-16.16s %10s  ", (long long)p.pid, p.program.c_str(),
                    format_uptime(p.uptime_s).c_str());
      else
        std::printf("%8s  %-16s %10s  ", "", "", "");
      first = false;
    };
    if (p.devices.empty()) {
      lead();
      std::printf("(no device yet)\n");
    }
    for (const smi::DeviceFigures& d : p.devices) {
      std::string tags;
      for (const smi::TagBytes& t : d.top_tags)
        tags += (tags.empty() ? "" : ", ") + t.tag + " " + format_bytes(t.bytes);
      lead();
      const smi::Figures& f = d.figures;
      std::printf("%-9s %-6s %11s %11s %11s %11s  %s\n", d.device.c_str(), d.allocator.c_str(),
                  format_bytes(f.allocated).c_str(), format_bytes(f.peak).c_str(),
                  format_bytes(f.reserved).c_str(), f.limit > 0 ? format_bytes(f.limit).c_str() : "none",
                  tags.c_str());
    }
    if (p.dropped_devices > 0) {
      lead();
      std::printf("(%lld more devices: no slot left in the page)\n", (long long)p.dropped_devices);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "List the running frugal processes of this user and their memory per device: allocated (live blocks), "
      "peak (of allocated), reserved (held from the system) and limit (0 or none: no limit), in bytes, with "
      "the memory tags holding the most. Each process publishes them in /dev/shm/frugal-<uid>-<pid> "
      "(FRUGAL_SMI=0 turns that off); pages of processes that died are removed here."};
  double interval = 0;
  bool json = false;
  app.add_option("-l,--loop", interval,
                 "refresh every SECONDS (clearing the screen, like watch) until Ctrl-C; with --json, print "
                 "every SECONDS without clearing")
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", json,
               "one JSON object per process and line (JSON Lines): pid, program, uptime_s, dropped_devices, "
               "and devices: [{device, allocator, allocated, peak, reserved, reserved_peak, limit (0: none), "
               "top_tags: [{tag, bytes}]}], all sizes in bytes");
  CLI11_PARSE(app, argc, argv);

  const bool clear = interval > 0 && !json && isatty(STDOUT_FILENO);
  for (;;) {
    const smi::Scan scan = smi::scan();
    if (clear) std::printf("\033[H\033[2J");
    if (json) {
      for (const smi::Process& p : scan.processes) std::printf("%s\n", to_json(p).dump().c_str());
    } else {
      print_table(scan);
    }
    std::fflush(stdout);
    for (const std::string& note : scan.notes) std::fprintf(stderr, "frugal-smi: %s\n", note.c_str());
    if (interval <= 0) return 0;
    if (!clear && !json) std::printf("\n");
    std::this_thread::sleep_for(std::chrono::duration<double>(interval));
  }
}

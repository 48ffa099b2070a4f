// Device parsing and printing.
#include "core/device.h"

#include <atomic>
#include <charconv>

#include "core/error.h"

namespace frugal {

Device Device::parse(std::string_view s) {
  if (s == "cpu") return kCPU;
  if (s == "meta") return kMeta;
  if (s.substr(0, 4) == "cuda") {
    if (s.size() == 4) return cuda(0);
    int idx = -1;
    auto rest = s.substr(5);
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), idx);
    if (s[4] == ':' && ec == std::errc() && p == rest.data() + rest.size() && idx >= 0 && idx < 1024)
      return cuda(idx);
  }
  throw DeviceError(detail::str_cat("unknown device '", s, "'; expected 'cpu', 'cuda', 'cuda:N' or 'meta'"));
}

std::string Device::str() const {
  if (is_meta()) return "meta";
  return is_cpu() ? "cpu" : "cuda:" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& os, Device d) { return os << d.str(); }

namespace {
// Set by a backend's static initialisers while it loads, which may be on any thread (load_backend): atomic.
using CountFn = int (*)();
constinit std::atomic<CountFn> g_device_count[kNumDeviceTypes] = {};
}  // namespace

int device_count(DeviceType type) {
  if (type == DeviceType::CPU || type == DeviceType::Meta) return 1;
  if (!g_device_count[int(type)].load(std::memory_order_acquire)) load_backend(type);
  const CountFn count = g_device_count[int(type)].load(std::memory_order_acquire);
  return count ? count() : 0;
}

void register_device_count(DeviceType type, int (*count)()) {
  g_device_count[int(type)].store(count, std::memory_order_release);
}

}  // namespace frugal

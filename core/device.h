// Device: where a tensor's bytes live (cpu, or cuda:N).
//
//   Device d = Device::parse("cuda:1");  // {DeviceType::CUDA, 1}
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace frugal {

enum class DeviceType : uint8_t { CPU, CUDA };
inline constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::CPU;
  int16_t index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(int16_t(i)) {}  // NOLINT: Device d = kCPU
  static Device parse(std::string_view s);  // "cpu", "cuda", "cuda:1"; throws DeviceError
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  friend bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
};

inline constexpr Device kCPU{DeviceType::CPU, 0};
inline Device cuda(int index = 0) { return Device(DeviceType::CUDA, index); }

std::ostream& operator<<(std::ostream& os, Device d);

// How many devices of a type are usable: 1 for the cpu; for cuda, 0 unless frugal was built with CUDA and a
// GPU answers (no driver, no device or any error counts as none).
int device_count(DeviceType type);
inline bool cuda_is_available() { return device_count(DeviceType::CUDA) > 0; }
// Installs the function that counts a device type's devices; the CUDA backend calls it when it loads.
void register_device_count(DeviceType type, int (*count)());

}  // namespace frugal

// Device: where a tensor's bytes live (cpu, or cuda:N), or meta: tensors with a shape and no bytes, for
// the dry run of core/estimate.h.
//
//   Device d = Device::parse("cuda:1");  // {DeviceType::CUDA, 1}
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace frugal {

enum class DeviceType : uint8_t { CPU, CUDA, Meta };
inline constexpr int kNumDeviceTypes = 3;

struct Device {
  DeviceType type = DeviceType::CPU;
  int16_t index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(int16_t(i)) {}  // NOLINT: Device d = kCPU
  static Device parse(std::string_view s);  // "cpu", "cuda", "cuda:1", "meta"; throws DeviceError
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool is_meta() const { return type == DeviceType::Meta; }
  std::string str() const;
  friend bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
};

inline constexpr Device kCPU{DeviceType::CPU, 0};
// Note [the meta device]
// A meta tensor has a shape, dtype and strides, and storage whose address points nowhere: its allocator is a
// caching arena running the real algorithm over virtual addresses (core/estimate.cpp), and every op table
// row of the meta device runs no arithmetic (core/op_table.h). An op on meta tensors therefore checks its
// inputs and allocates its outputs exactly as it does on the cpu (the meta device follows the cpu's op
// paths), which is what makes the dry run's peak the real one. Reading a meta tensor's values (item,
// to_vector, a copy to another device, printing its values) is an error.
inline constexpr Device kMeta{DeviceType::Meta, 0};
inline Device cuda(int index = 0) { return Device(DeviceType::CUDA, index); }

std::ostream& operator<<(std::ostream& os, Device d);

// How many devices of a type are usable: 1 for the cpu; for cuda, 0 unless frugal was built with CUDA and a
// GPU answers (no driver, no device or any error counts as none). Asking loads the CUDA backend.
int device_count(DeviceType type);
inline bool cuda_is_available() { return device_count(DeviceType::CUDA) > 0; }
// Installs the function that counts a device type's devices; the CUDA backend calls it when it loads.
void register_device_count(DeviceType type, int (*count)());

// Note [the CUDA backend loads on demand]
// The CUDA kernels are a library of their own, libfrugal_cuda.so beside libfrugal.so, that frugal loads
// (dlopen) the first time CUDA is asked for: a device count, a CUDA allocator (the first tensor on cuda:N),
// or load_backend itself. Loading it fills the op tables' CUDA rows and registers the arena's CUDA backing
// from its static initialisers. A program that stays on the CPU never maps it, nor cudart, cuBLAS or cuDNN
// behind it (together about 160 MB of resident memory). FRUGAL_CUDA_BACKEND=<path> loads another file.
//
// Loads the backend of a device type once per process (thread-safe; the cpu's is always there). True when
// it is loaded; false when frugal was built without it or it cannot load: backend_error says why.
bool load_backend(DeviceType type);
// Why a device type's backend is not loaded, as a sentence for an error message; empty when it is loaded.
std::string backend_error(DeviceType type);

}  // namespace frugal

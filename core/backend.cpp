// Loading the CUDA backend on demand (Note [the CUDA backend loads on demand] in core/device.h): finding
// libfrugal_cuda.so beside libfrugal.so, dlopen once, and the reason when it cannot be had.
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/device.h"
#include "core/device_collectives.h"
#include "core/error.h"

namespace frugal {
namespace {

struct BackendState {
  std::once_flag once;
  bool loaded = false;
  std::string error;  // why it is not loaded
};

BackendState& cuda_state() {
  static BackendState* s = new BackendState;  // leaked: the backend stays loaded until the process ends
  return *s;
}

#ifdef FRUGAL_CUDA_BACKEND_FILE
// The folder libfrugal.so was loaded from, with a trailing '/' ("" when the loader cannot say).
std::string library_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&load_backend), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string self = info.dli_fname;
  const std::string::size_type slash = self.rfind('/');
  return slash == std::string::npos ? "" : self.substr(0, slash + 1);
}
#endif

void load_cuda(BackendState& s) {
  const char* env = std::getenv("FRUGAL_CUDA_BACKEND");
#ifdef FRUGAL_CUDA_BACKEND_FILE
  const std::string path = env && *env ? std::string(env) : library_folder() + FRUGAL_CUDA_BACKEND_FILE;
#else
  if (!env || !*env) {
    s.error = "frugal was built without CUDA (configured with -DFRUGAL_CUDA=OFF, or no nvcc was found)";
    return;
  }
  const std::string path = env;
#endif
  // Never closed: its kernels sit in the op tables and its backing under the arena for the process's life.
  if (dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL) == nullptr) {
    const char* why = dlerror();
    s.error = detail::str_cat("the CUDA backend ", path, " cannot be loaded: ", why ? why : "unknown error",
                              env && *env ? " (the path comes from FRUGAL_CUDA_BACKEND)" : "");
    return;
  }
  s.loaded = true;
}

}  // namespace

bool load_backend(DeviceType type) {
  if (type != DeviceType::CUDA) return true;  // the cpu's and the meta device's kernels are always there
  BackendState& s = cuda_state();
  std::call_once(s.once, [&] { load_cuda(s); });
  return s.loaded;
}

std::string backend_error(DeviceType type) {
  if (load_backend(type)) return "";
  return cuda_state().error;
}

namespace {
std::atomic<const DeviceCollectives*> g_cuda_collectives{nullptr};
}  // namespace

void register_device_collectives(DeviceType type, const DeviceCollectives* table) {
  if (type == DeviceType::CUDA) g_cuda_collectives.store(table);
}

const DeviceCollectives* device_collectives(DeviceType type) {
  return type == DeviceType::CUDA ? g_cuda_collectives.load() : nullptr;
}

}  // namespace frugal

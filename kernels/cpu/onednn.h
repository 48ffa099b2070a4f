// The oneDNN engine and streams the CPU kernels share (include only under FRUGAL_HAVE_ONEDNN).
#pragma once

#include <dnnl.hpp>

namespace frugal::cpu {

inline dnnl::engine& onednn_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// One stream per thread: kernels run from several threads at once (the convolutions' per-image loops).
inline dnnl::stream& onednn_stream() {
  thread_local dnnl::stream stream(onednn_engine());
  return stream;
}

}  // namespace frugal::cpu

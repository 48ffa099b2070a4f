// CPU indexing kernels over [outer, dim_size, inner] layouts (see IndexArgs in core/op_table.h).
#include <cstring>

#include "core/op_table_index.h"
#include "core/parallel.h"
#include "kernels/cpu/register.h"
#include "kernels/math.h"

namespace frugal {
namespace {

using cpu::for_types;

template <typename T>
void index_select_cpu(const IndexArgs& a) {
  const T* x = static_cast<const T*>(a.x);
  T* out = static_cast<T*>(a.out);
  parallel_for(0, a.outer * a.n_index, items_per_grain(a.inner), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t o = r / a.n_index, i = r % a.n_index;
      std::memcpy(out + r * a.inner, x + (o * a.dim_size + a.index[i]) * a.inner,
                  size_t(a.inner) * sizeof(T));
    }
  });
}

template <typename T>
void gather_cpu(const IndexArgs& a) {
  const T* x = static_cast<const T*>(a.x);
  T* out = static_cast<T*>(a.out);
  const int64_t total = a.outer * a.n_index * a.inner;
  parallel_for(0, total, parallel_grain(), [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const int64_t j = p % a.inner, o = p / (a.n_index * a.inner);
      out[p] = x[(o * a.dim_size + a.index[p]) * a.inner + j];
    }
  });
}

// Serial: two source elements may land on the same output element.
template <typename T>
void scatter_add_cpu(const IndexArgs& a) {
  const T* src = static_cast<const T*>(a.src);
  T* out = static_cast<T*>(a.out);
  const int64_t total = a.outer * a.n_index * a.inner;
  for (int64_t p = 0; p < total; ++p) {
    const int64_t j = p % a.inner, o = p / (a.n_index * a.inner);
    T& dst = out[(o * a.dim_size + a.index[p]) * a.inner + j];
    dst = T(math::Add{}(acc_t<T>(dst), acc_t<T>(src[p])));  // integers wrap (Note [integer overflow wraps])
  }
}

// Parallel over the outer slices only: two index entries may name the same row.
template <typename T>
void index_add_cpu(const IndexArgs& a) {
  using C = acc_t<T>;
  const T* src = static_cast<const T*>(a.src);
  T* out = static_cast<T*>(a.out);
  const int64_t slice = a.n_index * a.inner;
  parallel_for(0, a.outer, items_per_grain(slice), [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o)
      for (int64_t i = 0; i < a.n_index; ++i) {
        const T* s = src + (o * a.n_index + i) * a.inner;
        T* dst = out + (o * a.dim_size + a.index[i]) * a.inner;
#pragma omp simd
        for (int64_t j = 0; j < a.inner; ++j) dst[j] = T(math::Add{}(C(dst[j]), C(s[j])));
      }
  });
}

const bool kRegistered = [] {
  for_types<float, double, Half, BFloat16, int64_t, int32_t, uint8_t, bool>([](auto t) {
    using T = decltype(t);
    op_index_select.set(DeviceType::CPU, dtype_v<T>, index_select_cpu<T>);
    op_gather.set(DeviceType::CPU, dtype_v<T>, gather_cpu<T>);
  });
  for_types<float, double, Half, BFloat16, int64_t, int32_t, uint8_t>([](auto t) {
    op_scatter_add.set(DeviceType::CPU, dtype_v<decltype(t)>, scatter_add_cpu<decltype(t)>);
    op_index_add.set(DeviceType::CPU, dtype_v<decltype(t)>, index_add_cpu<decltype(t)>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal

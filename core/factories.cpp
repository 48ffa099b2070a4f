// Factories: tensors made from a shape and a value, a range, random draws, or a copied buffer.
#include <cmath>
#include <cstring>

#include "core/memory_history.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "core/rng.h"

namespace frugal {

Tensor empty(const Shape& shape, TensorOptions opts) {
  memory::OpScope op_scope("empty");  // Note [op names in the history]
  const int64_t nbytes = checked_nbytes(shape, dtype_size(opts.dtype_), "empty");  // Note [checked sizes]
  auto storage = std::make_shared<Storage>(nbytes, opts.device_);
  return Tensor(std::move(storage), 0, shape, contiguous_strides(shape), opts.dtype_);
}

Tensor full(const Shape& shape, Scalar value, TensorOptions opts) {
  memory::OpScope op_scope("full");  // Note [op names in the history]
  Tensor t = empty(shape, opts);
  ops::fill_(t, value);
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions opts) { return full(shape, 0, opts); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1, opts); }
Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.options()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.options()); }
Tensor full_like(const Tensor& t, Scalar value) { return full(t.shape(), value, t.options()); }
Tensor scalar_tensor(Scalar value, TensorOptions opts) { return full({}, value, opts); }

namespace {
// Makes a cpu tensor of n values value(i) computed in double, converted to opts' dtype and moved to its
// device.
template <typename F>
Tensor from_function(int64_t n, TensorOptions opts, F value) {
  if (opts.device_.is_meta())
    return empty({n}, opts);  // the one tensor the cpu makes (Note [the meta device])
  Tensor t = empty({n}, TensorOptions(opts.dtype_).device(kCPU));
  visit_dtype(opts.dtype_, [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = T(value(i));
  });
  return ops::to(t, opts.device_);
}
}  // namespace

Tensor arange(Scalar end, TensorOptions opts) { return arange(0, end, 1, opts); }

Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions opts) {
  memory::OpScope op_scope("arange");  // Note [op names in the history]
  FRUGAL_CHECK(step != 0 && std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
               "arange: start, end and step must be finite and step non-zero; got start=", start,
               " end=", end, " step=", step);
  const double count = std::ceil((end - start) / step);
  // Converting a double beyond int64 would be undefined; empty() refuses what does not fit in memory.
  FRUGAL_CHECK(count < 0x1p62, "arange: start=", start, " end=", end, " step=", step, " give ", count,
               " elements, more than a tensor can hold");
  const int64_t n = count > 0 ? int64_t(count) : 0;
  return from_function(n, opts, [&](int64_t i) { return start + double(i) * step; });
}

Tensor linspace(Scalar start, Scalar end, int64_t steps, TensorOptions opts) {
  memory::OpScope op_scope("linspace");  // Note [op names in the history]
  FRUGAL_CHECK(steps >= 0, "linspace: steps must be non-negative, got ", steps);
  const double step = steps > 1 ? (end - start) / double(steps - 1) : 0;
  // Fill from both ends so that the last value is exactly `end`, as PyTorch does (one step gives `start`).
  return from_function(steps, opts, [&](int64_t i) {
    return steps == 1 || i < steps / 2 ? start + step * double(i) : end - step * double(steps - 1 - i);
  });
}

namespace {
constexpr double kTwoPi = 6.283185307179586476925286766559;

inline double u01(uint32_t hi, uint32_t lo) {  // 53 random bits in [0, 1)
  return double((uint64_t(hi) << 21) ^ (lo >> 11)) * 0x1.0p-53;
}

// Draws t's values (t: a contiguous tensor of T on the cpu) with `per_block(words, out)` turning one Philox
// block of four 32-bit words into kPerBlock values (four 32-bit or two 64-bit ones); elements depend only on
// (seed, offset, index). On the meta device it draws nothing (Note [the meta device]).
template <typename T, int kPerBlock, typename F>
void draw_into(Tensor& t, Generator* gen, F per_block) {
  if (t.device().is_meta()) return;
  Generator& g = gen ? *gen : default_generator();
  const int64_t n = t.numel(), blocks = (n + kPerBlock - 1) / kPerBlock;
  const uint64_t seed = g.seed(), base = g.reserve(uint64_t(blocks));
  T* p = t.data<T>();
  parallel_for(0, blocks, 4096, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      uint32_t w[4];
      T v[kPerBlock];
      Generator::block(seed, base + uint64_t(j), w);
      per_block(w, v);
      for (int k = 0; k < kPerBlock && kPerBlock * j + k < n; ++k) p[kPerBlock * j + k] = v[k];
    }
  });
}
// A new tensor of `shape` drawn by draw_into (on the meta device: the tensor the cpu would draw into).
template <typename T, int kPerBlock, typename F>
Tensor draw(const Shape& shape, Device device, Generator* gen, F per_block) {
  Tensor t = empty(shape, TensorOptions(dtype_v<T>).device(device.is_meta() ? kMeta : kCPU));
  draw_into<T, kPerBlock>(t, gen, per_block);
  return t;
}

// One Philox block into four f32 or two f64 values: rand's, and randn's by Box-Muller (1 - u keeps the
// logarithm's argument in (0, 1]).
void uniform_f32(const uint32_t* w, float* v) {
  for (int k = 0; k < 4; ++k) v[k] = float(w[k] >> 8) * 0x1.0p-24f;
}
void uniform_f64(const uint32_t* w, double* v) {
  v[0] = u01(w[0], w[1]);
  v[1] = u01(w[2], w[3]);
}
template <typename T>
void box_muller(double u1, double u2, T* v) {
  const double r = std::sqrt(-2.0 * std::log(1.0 - u1));
  v[0] = T(r * std::cos(kTwoPi * u2));
  v[1] = T(r * std::sin(kTwoPi * u2));
}
void normal_f32(const uint32_t* w, float* v) {
  box_muller(w[0] * 0x1.0p-32, w[1] * 0x1.0p-32, v);
  box_muller(w[2] * 0x1.0p-32, w[3] * 0x1.0p-32, v + 2);
}
void normal_f64(const uint32_t* w, double* v) { box_muller(u01(w[0], w[1]), u01(w[2], w[3]), v); }

void check_float(TensorOptions opts, const char* op) {
  FRUGAL_CHECK_DTYPE(is_floating(opts.dtype_), op, ": expected a floating dtype (f32, f64, f16, bf16), got ",
                     dtype_name(opts.dtype_), "; use randint for integers");
}
}  // namespace

Tensor rand(const Shape& shape, TensorOptions opts, Generator* gen) {
  memory::OpScope op_scope("rand");  // Note [op names in the history]
  check_float(opts, "rand");
  if (opts.dtype_ == DType::F64)
    return ops::to(draw<double, 2>(shape, opts.device_, gen, uniform_f64), opts.device_);
  // As many random bits as the dtype has significand bits (24, 11, 8), so that every value is exact in it and
  // rounding never reaches 1.0 (f32 values near 1 would round up to 1 in f16 / bf16). PyTorch does the same.
  const int bits = opts.dtype_ == DType::F16 ? 11 : opts.dtype_ == DType::BF16 ? 8 : 24;
  const float scale = std::ldexp(1.0f, -bits);
  Tensor t = draw<float, 4>(shape, opts.device_, gen, [&](const uint32_t* w, float* v) {
    for (int k = 0; k < 4; ++k) v[k] = float(w[k] >> (32 - bits)) * scale;
  });
  return ops::to(ops::to(t, opts.dtype_), opts.device_);
}

Tensor randn(const Shape& shape, TensorOptions opts, Generator* gen) {
  memory::OpScope op_scope("randn");  // Note [op names in the history]
  check_float(opts, "randn");
  Tensor t = opts.dtype_ == DType::F64 ? draw<double, 2>(shape, opts.device_, gen, normal_f64)
                                       : draw<float, 4>(shape, opts.device_, gen, normal_f32);
  return ops::to(ops::to(t, opts.dtype_), opts.device_);
}

bool can_draw_into(const Tensor& t) {
  return t.defined() && (t.dtype() == DType::F32 || t.dtype() == DType::F64) &&
         (t.device().is_meta() || (t.device().is_cpu() && t.is_contiguous()));
}

namespace {
template <typename F32, typename F64>
Tensor& draw_into_checked(Tensor& t, Generator* gen, const char* op, F32 f32, F64 f64) {
  memory::OpScope op_scope(op);  // Note [op names in the history]
  FRUGAL_CHECK(t.defined(), op, "_into: the tensor is undefined");
  FRUGAL_CHECK(can_draw_into(t), op, "_into: expected a contiguous f32 or f64 tensor on the cpu, got ",
               dtype_name(t.dtype()), " on ", t.device(), t.is_contiguous() ? "" : " (not contiguous)");
  if (t.dtype() == DType::F64)
    draw_into<double, 2>(t, gen, f64);
  else
    draw_into<float, 4>(t, gen, f32);
  if (t.storage()) t.storage()->bump_version();
  return t;
}
}  // namespace

Tensor& rand_into(Tensor& t, Generator* gen) {
  return draw_into_checked(t, gen, "rand", uniform_f32, uniform_f64);
}
Tensor& randn_into(Tensor& t, Generator* gen) {
  return draw_into_checked(t, gen, "randn", normal_f32, normal_f64);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts, Generator* gen) {
  memory::OpScope op_scope("randint");  // Note [op names in the history]
  FRUGAL_CHECK(low < high, "randint: expected low < high, got low=", low, " high=", high);
  const uint64_t range = uint64_t(high - low);
  Tensor t = draw<int64_t, 2>(shape, opts.device_, gen, [&](const uint32_t* w, int64_t* v) {
    // 64 random bits per pair of words: the modulo bias is below 2^-32 for any range under 2^32.
    v[0] = low + int64_t(((uint64_t(w[0]) << 32) | w[1]) % range);
    v[1] = low + int64_t(((uint64_t(w[2]) << 32) | w[3]) % range);
  });
  return ops::to(ops::to(t, opts.dtype_), opts.device_);
}

Tensor from_buffer(const void* data, const Shape& shape, DType dtype) {
  memory::OpScope op_scope("from_buffer");  // Note [op names in the history]
  Tensor t = empty(shape, TensorOptions(dtype).device(kCPU));
  if (t.nbytes() > 0) std::memcpy(t.raw_data(), data, size_t(t.nbytes()));
  return t;
}

template <typename T>
Tensor tensor(const std::vector<T>& values, const Shape& shape) {
  memory::OpScope op_scope("tensor");  // Note [op names in the history]
  FRUGAL_CHECK_SHAPE(int64_t(values.size()) == shape.numel(), "tensor: ", values.size(),
                     " values do not fill shape ", shape, " (", shape.numel(), " elements)");
  if constexpr (std::is_same_v<T, bool>) {  // std::vector<bool> packs bits: copy one by one
    Tensor t = empty(shape, TensorOptions(DType::Bool).device(kCPU));
    for (size_t i = 0; i < values.size(); ++i) t.data<bool>()[i] = values[i];
    return t;
  } else {
    return from_buffer(values.data(), shape, dtype_v<T>);
  }
}

template Tensor tensor(const std::vector<float>&, const Shape&);
template Tensor tensor(const std::vector<double>&, const Shape&);
template Tensor tensor(const std::vector<Half>&, const Shape&);
template Tensor tensor(const std::vector<BFloat16>&, const Shape&);
template Tensor tensor(const std::vector<int64_t>&, const Shape&);
template Tensor tensor(const std::vector<int32_t>&, const Shape&);
template Tensor tensor(const std::vector<uint8_t>&, const Shape&);
template Tensor tensor(const std::vector<bool>&, const Shape&);

}  // namespace frugal

// The "ops" fuzz target (tests/fuzz/targets.h): the input is a little program of op calls on small tensors,
// most of them with bad arguments (shapes that do not fit, dims out of range, wrong dtypes, negative sizes,
// strides past the storage, integers at their extremes, inf and NaN). Every call must return a tensor whose
// every element can be read, or throw frugal::Error; a crash, a sanitizer report (signed overflow, an
// out-of-bounds read) or another exception is a finding. Random calls of this kind found signed integer
// overflow in the integer kernels (Note [integer overflow wraps], kernels/math.h).
//
// The program, byte by byte (a missing byte reads as 0): four tensors, each
//   ndim (mod 4), that many sizes (mod 5), dtype (mod 8), view (mod 4: as made, transposed, every other
//   element of dim 0, or broadcast along a new leading dim), then one byte per element choosing its value
//   from kValues;
// then up to kMaxSteps steps, each an op (mod the ops' count) and the bytes that op reads for its operands
// (a byte mod 4 picks one of the four tensors) and its arguments. A step's result, when it has at most
// kMaxElements elements, replaces the tensor its first operand came from. The bytes of one call are read in
// statements of their own, left to right: as arguments of one call their order was unspecified, and GCC's
// builds replayed the regression inputs (found under clang, which reads left to right) as other programs.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "frugal.h"
#include "tests/fuzz/program.h"
#include "tests/fuzz/targets.h"

namespace frugal::fuzz {
namespace {

namespace F = nn::functional;

constexpr int kMaxSteps = 12;
constexpr int64_t kMaxElements = 1024;

Shape shape_of(Program& p, int max_dims) {
  std::vector<int64_t> sizes(size_t(p.in(0, max_dims)));
  for (int64_t& s : sizes) s = p.in(0, 4);
  return Shape(sizes);
}
Shape dims_of(Program& p, int ndim) {  // a few dims, some out of range or repeated
  std::vector<int64_t> d(size_t(p.in(0, 3)));
  for (int64_t& v : d) v = p.in(-ndim - 1, ndim);
  return Shape(d);
}

const DType kDTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16,
                         DType::I64, DType::I32, DType::U8,  DType::Bool};

// The values an element may take: small ones, the integer extremes, and the floats' special values.
int64_t integer_value(uint8_t b) {
  constexpr int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  constexpr int64_t table[] = {lo, hi, lo + 1, hi - 1, int64_t(1) << 31, -(int64_t(1) << 31), 255, 256};
  return b < 8 ? table[b] : int64_t(b) - 128;
}
double float_value(uint8_t b) {
  const double inf = std::numeric_limits<double>::infinity();
  const double table[] = {inf, -inf, std::nan(""), 1e300, -1e300, 1e-300, 65504, 3.4e38};
  return b < 8 ? table[b] : (double(b) - 128) / 8;
}

Tensor make_tensor(Program& p) {
  const Shape shape = shape_of(p, 3);
  const DType dtype = kDTypes[p.in(0, 7)];
  const int64_t view = p.in(0, 3);
  std::vector<int64_t> ints;
  std::vector<double> floats;
  for (int64_t i = 0; i < shape.numel(); ++i) {
    const uint8_t b = p.byte();
    ints.push_back(integer_value(b));
    floats.push_back(float_value(b));
  }
  Tensor t =
      is_floating(dtype) ? tensor<double>(floats, shape).to(dtype) : tensor<int64_t>(ints, shape).to(dtype);
  if (view == 1 && t.dim() >= 2) return t.transpose(0, t.dim() - 1);
  if (view == 2 && t.dim() >= 1) return t.slice(0, 0, t.size(0), 2);
  if (view == 3) {
    std::vector<int64_t> sizes{2};
    for (int64_t d = 0; d < t.dim(); ++d) sizes.push_back(t.size(d));
    return t.expand(Shape(sizes));
  }
  return t;
}

// Reads every element, so that a result that claims more than its storage holds is caught (under ASan).
void touch(const Tensor& t) {
  if (t.defined() && t.numel() > 0) (void)ops::sum(t.to(DType::F64)).item<double>();
}

// One step: an op on operands and arguments the program chooses; returns its result, or an undefined tensor.
Tensor step(Program& p, std::vector<Tensor>& pool, size_t& slot) {
  auto pick = [&] { return pool[size_t(p.in(0, 3))]; };
  slot = size_t(p.in(0, 3));
  const Tensor x = pool[slot];
  const int nd = int(x.dim());
  const int64_t op = p.in(0, 39);
  switch (op) {
    case 0:
      return add(x, pick());
    case 1:
      return sub(x, pick());
    case 2:
      return mul(x, pick());
    case 3:
      return div(x, pick());
    case 4:
      return pow(x, pick());
    case 5:
      return maximum(x, pick());
    case 6: {
      const Tensor a = pick(), b = pick();
      return where(x, a, b);
    }
    case 7: {
      const double lo = double(p.in(-3, 3)), hi = double(p.in(-3, 3));
      return clamp(x, lo, hi);
    }
    case 8:
      return neg(x);
    case 9:
      return abs(x);
    case 10:
      return relu(x);
    case 11:
      return exp(x);
    case 12:
      return x.view(shape_of(p, 4));
    case 13:
      return x.reshape(shape_of(p, 4));
    case 14:
      return x.permute(dims_of(p, nd));
    case 15: {
      const int64_t dim = p.in(-4, 3), start = p.in(-6, 6), end = p.in(-6, 6), step = p.in(-1, 3);
      return x.slice(dim, start, end, step);
    }
    case 16: {
      const int64_t dim = p.in(-4, 3), index = p.in(-5, 5);
      return x.select(dim, index);
    }
    case 17:
      return x.expand(shape_of(p, 4));
    case 18:
    case 19:
    case 20: {
      const Shape dims = dims_of(p, nd);
      const bool keepdim = p.in(0, 1);
      return op == 18 ? x.sum(dims, keepdim) : op == 19 ? x.mean(dims, keepdim) : x.max(dims, keepdim);
    }
    case 21: {
      const Shape dims = dims_of(p, nd);
      const int64_t correction = p.in(-1, 2);
      const bool keepdim = p.in(0, 1);
      return x.var(dims, correction, keepdim);
    }
    case 22: {
      const int64_t dim = p.in(-4, 3);
      const bool keepdim = p.in(0, 1);
      return x.argmax(dim, keepdim);
    }
    case 23:
      return x.softmax(p.in(-4, 3));
    case 24:
      return matmul(x, pick());
    case 25:
    case 26: {
      const int64_t dim = p.in(-4, 3);
      const Tensor index = pick();
      return op == 25 ? index_select(x, dim, index) : gather(x, dim, index);
    }
    case 27:
    case 28: {
      const int64_t dim = p.in(-4, 3);
      const Tensor index = pick(), src = pick();
      return op == 27 ? scatter_add(x, dim, index, src) : ops::index_add(x, dim, index, src);
    }
    case 29:
      return one_hot(x, p.in(-2, 6));
    case 30: {
      const Tensor other = pick();
      return cat({x, other}, p.in(-4, 3));
    }
    case 31:
      return x.to(kDTypes[p.in(0, 7)]);
    case 32: {
      const Shape shape = shape_of(p, 3);
      std::vector<int64_t> strides(size_t(shape.size()));
      for (int64_t& s : strides) s = p.in(-2, 8);
      return ops::as_strided(x, shape, Shape(strides), p.in(-2, 12));
    }
    case 33: {
      Tensor out = pick();
      ops::copy_(out, x);
      return out;
    }
    case 34: {
      const Tensor weight = pick(), bias = p.in(0, 1) ? pick() : Tensor();
      return F::linear(x, weight, bias);
    }
    case 35: {
      const Tensor weight = pick(), bias = p.in(0, 1) ? pick() : Tensor();
      const int stride = int(p.in(0, 2)), padding = int(p.in(-1, 2));
      return ops::conv2d(x, weight, bias, stride, padding);
    }
    case 36: {
      const int kernel = int(p.in(0, 3)), padding = int(p.in(-1, 2));
      return ops::max_pool2d(x, kernel, std::nullopt, padding);
    }
    case 37: {
      const Shape shape = shape_of(p, 2);
      const Tensor weight = p.in(0, 1) ? pick() : Tensor();
      return F::layer_norm(x, shape, weight, Tensor());
    }
    case 38:
      return F::cross_entropy(x, pick());
    default: {  // backward through a floating result
      if (!is_floating(x.dtype())) return Tensor();
      const Tensor leaf = x.detach().requires_grad_();
      Tensor y = mul(relu(leaf), leaf).sum();
      y.backward();
      return leaf.grad();
    }
  }
}

}  // namespace

void run_ops(const uint8_t* data, size_t size) {
  // A step may ask for a tensor of billions of elements (one_hot of a large class value, an expand): under
  // a limit that is an OutOfMemoryError, not the machine's memory. The limit is set back on the way out.
  struct Limit {
    int64_t before = memory::memory_limit(kCPU);
    Limit() { memory::set_memory_limit(kCPU, int64_t(256) << 20); }
    ~Limit() { memory::set_memory_limit(kCPU, before); }
  } limit;
  Program p(data, size);
  std::vector<Tensor> pool;
  for (int i = 0; i < 4; ++i) pool.push_back(make_tensor(p));
  for (int s = 0; s < kMaxSteps && !p.done(); ++s) {
    size_t slot = 0;
    try {
      const Tensor y = step(p, pool, slot);
      touch(y);
      if (y.defined() && y.numel() <= kMaxElements) pool[slot] = y;
    } catch (const Error&) {
    }
  }
}

// A few programs: every op once on tensors of each dtype.
void seeds_ops(const std::string& dir) {
  for (int op = 0; op < 40; ++op) {
    std::string b;
    for (int t = 0; t < 4; ++t) {
      b += {char(2), char(2), char(3), char((op + t) % 8), char(t)};  // [2, 3], a dtype, a view
      for (int e = 0; e < 6; ++e) b += char(8 + (op * 7 + t * 13 + e * 29) % 248);
    }
    b += {char(op % 4), char(op), char(1), char(2), char(1), char(0), char(1)};
    std::ofstream(std::filesystem::path(dir) / ("op" + std::to_string(op)), std::ios::binary) << b;
  }
}

}  // namespace frugal::fuzz

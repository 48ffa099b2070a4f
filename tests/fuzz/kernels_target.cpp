// The "kernels" fuzz target (tests/fuzz/targets.h), a differential one: the input is a little program of op
// calls with valid arguments, and each result is compared with a naive computation in f64 written here from
// the op's definition. The arguments are where the fast kernels have their special cases: shapes (a few
// rows, widths past a vector's, empty dims, 3x3 convolutions that oneDNN runs with Winograd), memory layouts
// (contiguous, transposed, a padded last dim at an offset, every other slice of dim 0), the four floating
// dtypes and bf16 autocast. Gradients are compared too (the backward of sum(y * r) for an r the program
// chooses). A result outside its error bound throws std::logic_error naming the op, its arguments and the
// element: a finding, where the "ops" target looks for crashes and undefined behaviour only.
//
// Element values are multiples of 1/4 in [-2, 2]: exact in every dtype, so that a GEMM or a convolution
// accumulated in f32 is exact whatever its order, and its only rounding is its output's. The bound of an
// element (expect()) is 8 (len + 2) u_c * mag + 2 u_o * rmag: u_c the unit roundoff of the compute type
// (f64's for f64, f32's otherwise), u_o the output's, mag the sum of the |terms| that make the element, len
// how many there are, rmag the magnitude of what is rounded last. A wrong element (a term missed, read from
// the wrong place, or from the padding, which holds NaN) is far outside it.
//
// The program, byte by byte (a missing byte reads as 0): up to kMaxSteps steps, each an op (mod the ops'
// count) and the bytes that op reads, in order, for its dtype, sizes, options and each operand's layout and
// values. Every byte is read in its own statement, so that the program means the same under every compiler.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numbers>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "frugal.h"
#include "kernels/cpu/reference.h"
#include "tests/fuzz/program.h"
#include "tests/fuzz/targets.h"

namespace frugal::fuzz {
namespace {

namespace F = nn::functional;

constexpr int kMaxSteps = 6;
const DType kFloating[] = {DType::F32, DType::F64, DType::BF16, DType::F16};

double unit_roundoff(DType t) {
  switch (t) {
    case DType::F64:
      return 0x1p-53;
    case DType::F32:
      return 0x1p-24;
    case DType::F16:
      return 0x1p-11;
    default:
      return 0x1p-8;  // bf16
  }
}

// A size: mostly small (0 .. small), sometimes up to large.
int64_t size_of(Program& p, int64_t lo, int64_t small, int64_t large) {
  const uint8_t b = p.byte();
  if (b < 192) return lo + b % (small - lo + 1);
  return small + 1 + b % (large - small);
}

std::string shape_str(const Shape& s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

// One operand: the view the op reads, its values (row-major over its shape), and the storage it views,
// whose bytes outside the view hold NaN.
struct Input {
  Tensor t, storage;
  std::vector<double> v;
  std::vector<int64_t> sizes;
  int layout = 0;
  double at(std::initializer_list<int64_t> idx) const {
    int64_t flat = 0;
    size_t d = 0;
    for (const int64_t i : idx) flat = flat * sizes[d++] + i;
    return v[size_t(flat)];
  }
};

int64_t numel_of(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (const int64_t s : sizes) n *= s;
  return n;
}

// Row-major strides of sizes.
std::vector<int64_t> strides_of(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> st(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) st[d - 1] = st[d] * sizes[d];
  return st;
}

// Layouts: 0 contiguous, 1 the last two dims transposed in memory, 2 the last dim padded (1 to 3 elements)
// and read from an offset, 3 every other slice of dim 0.
Input make(Program& p, std::vector<int64_t> sizes, DType dtype, bool layouts = true) {
  Input in;
  in.sizes = sizes;
  const int64_t n = numel_of(sizes);
  in.v.resize(size_t(n));
  for (double& x : in.v) x = double(int(p.byte() % 17) - 8) / 4;
  const size_t nd = sizes.size();
  in.layout = layouts ? int(p.in(0, 3)) : 0;
  if ((in.layout == 1 && nd < 2) || (in.layout != 0 && nd == 0)) in.layout = 0;
  std::vector<int64_t> st_sizes = sizes;
  int64_t pad = 0, offset = 0;
  if (in.layout == 1) std::swap(st_sizes[nd - 1], st_sizes[nd - 2]);
  if (in.layout == 2) {
    pad = p.in(1, 3);
    offset = p.in(0, pad);
    st_sizes[nd - 1] += pad;
  }
  if (in.layout == 3) st_sizes[0] *= 2;
  std::vector<double> st(size_t(numel_of(st_sizes)), std::nan(""));
  const std::vector<int64_t> st_strides = strides_of(st_sizes);
  std::vector<int64_t> idx(nd, 0);
  for (int64_t k = 0; k < n; ++k) {  // where logical element k lives in the storage
    std::vector<int64_t> at = idx;
    if (in.layout == 1) std::swap(at[nd - 1], at[nd - 2]);
    if (in.layout == 2) at[nd - 1] += offset;
    if (in.layout == 3) at[0] *= 2;
    int64_t flat = 0;
    for (size_t d = 0; d < nd; ++d) flat += at[d] * st_strides[d];
    st[size_t(flat)] = in.v[size_t(k)];
    for (size_t d = nd; d-- > 0;)
      if (++idx[d] < sizes[d])
        break;
      else
        idx[d] = 0;
  }
  in.storage = tensor<double>(st, Shape(st_sizes)).to(dtype);
  Tensor t = in.storage;
  if (in.layout == 1) t = t.transpose(int64_t(nd) - 1, int64_t(nd) - 2);
  if (in.layout == 2) t = t.slice(int64_t(nd) - 1, offset, offset + sizes[nd - 1]);
  if (in.layout == 3) t = t.slice(0, 0, st_sizes[0], 2);
  in.t = t;
  return in;
}

// An element of t at `offset` elements from its first, as a double.
double element(const Tensor& t, int64_t offset) {
  const void* base = t.raw_data();
  switch (t.dtype()) {
    case DType::F32:
      return static_cast<const float*>(base)[offset];
    case DType::F64:
      return static_cast<const double*>(base)[offset];
    case DType::BF16:
      return float(static_cast<const BFloat16*>(base)[offset]);
    case DType::F16:
      return float(static_cast<const Half*>(base)[offset]);
    case DType::I64:
      return double(static_cast<const int64_t*>(base)[offset]);
    default:
      throw std::logic_error("kernels target: no reader for dtype " + std::string(dtype_name(t.dtype())));
  }
}

// t's values row-major, read through its strides (no frugal kernel in between).
std::vector<double> read(const Tensor& t) {
  const int64_t nd = t.dim(), n = t.numel();
  std::vector<double> out;
  out.reserve(size_t(n));
  std::vector<int64_t> idx(size_t(nd), 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t off = 0;
    for (int64_t d = 0; d < nd; ++d) off += idx[size_t(d)] * t.strides()[d];
    out.push_back(element(t, off));
    for (int64_t d = nd; d-- > 0;)
      if (++idx[size_t(d)] < t.size(d))
        break;
      else
        idx[size_t(d)] = 0;
  }
  return out;
}

// What an output should hold: each element's value, the sum of the magnitudes of its terms and the
// magnitude of what is rounded last (Note at the top).
struct Want {
  std::vector<double> v, mag, rmag;
  explicit Want(int64_t n) : v(size_t(n)), mag(size_t(n)), rmag(size_t(n)) {}
  void set(int64_t i, double value, double magnitude) {
    v[size_t(i)] = value, mag[size_t(i)] = magnitude, rmag[size_t(i)] = std::fabs(value);
  }
};

// The sum of term(l) over l < n and the sum of their magnitudes: a GEMM-like element and its mag.
struct Sum {
  double sum = 0, mag = 0;
};
// max_pool2d(., 2) of what [planes, oh, ow] should hold: each window's largest value, and the largest bounds
// of its elements.
Want pool2_of(const Want& in, int64_t planes, int64_t oh, int64_t ow) {
  const int64_t ph = oh / 2, pw = ow / 2;
  Want out(planes * ph * pw);
  for (int64_t q = 0; q < planes; ++q)
    for (int64_t i = 0; i < ph; ++i)
      for (int64_t j = 0; j < pw; ++j) {
        const size_t e = size_t((q * ph + i) * pw + j);
        for (int64_t u = 0; u < 2; ++u)
          for (int64_t v = 0; v < 2; ++v) {
            const size_t src = size_t((q * oh + 2 * i + u) * ow + 2 * j + v);
            if ((u == 0 && v == 0) || in.v[src] > out.v[e]) out.v[e] = in.v[src];
            out.mag[e] = std::max(out.mag[e], in.mag[src]);
            out.rmag[e] = std::max(out.rmag[e], in.rmag[src]);
          }
      }
  return out;
}

template <typename Term>
Sum sum_of(int64_t n, Term term) {
  Sum s;
  for (int64_t l = 0; l < n; ++l) {
    const double t = term(l);
    s.sum += t, s.mag += std::fabs(t);
  }
  return s;
}

// Throws std::logic_error unless got has `sizes`, `dtype` and every element within its bound of want.
// u_o: the unit roundoff of the last rounding (the output dtype's, or autocast's). normwise: every element's
// accumulation term takes the largest magnitude of the output's, not its own (a Winograd convolution's
// transforms mix the elements of a tile, so that an element whose terms are all 0 comes out as a rounding of
// its neighbours': Note [Winograd convolutions]).
void expect(const std::string& what, const Tensor& got, const std::vector<int64_t>& sizes, DType dtype,
            const Want& want, double len, double u_c, double u_o, bool normwise = false) {
  if (!got.defined() || got.shape() != Shape(sizes) || got.dtype() != dtype)
    throw std::logic_error("kernels target: " + what + ": got " +
                           (got.defined() ? shape_str(got.shape()) + " " + dtype_name(got.dtype())
                                          : std::string("an undefined tensor")) +
                           ", want " + shape_str(Shape(sizes)) + " " + dtype_name(dtype));
  const std::vector<double> g = read(got);
  // Below the normal range an output is rounded to a fixed spacing (its smallest subnormal); and what the
  // compute type cannot hold as a normal number may be flushed to 0 or clamped to about its smallest normal
  // (Eigen's AVX2 exp gives 2.9e-39 for exp(-100)), which later products scale: an absolute floor far
  // below any error that matters.
  const double flush = u_c == 0x1p-24 ? 0x1p-100 : u_c == 0x1p-53 ? 0x1p-1000 : 0.0;
  const double spacing = std::max(flush, dtype == DType::F16    ? 0x1p-24
                                         : dtype == DType::BF16 ? 0x1p-133
                                                                : 0x1p-149);
  const double largest =
      normwise && !want.mag.empty() ? *std::max_element(want.mag.begin(), want.mag.end()) : 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double mag = normwise ? largest : want.mag[i];
    const double bound = 8 * (len + 2) * u_c * mag + 2 * u_o * want.rmag[i] + spacing;
    const bool ok = std::isnan(want.v[i])   ? std::isnan(g[i])
                    : std::isinf(want.v[i]) ? g[i] == want.v[i]
                                            : std::fabs(g[i] - want.v[i]) <= bound;
    if (!ok) {
      std::ostringstream o;
      o << "kernels target: " << what << ": element " << i << " of " << shape_str(got.shape()) << " is "
        << g[i] << ", want " << want.v[i] << " (bound " << bound << ")";
      throw std::logic_error(o.str());
    }
  }
}

// The NaNs around a view must still be there after an op wrote into it.
void expect_padding_kept(const std::string& what, const Input& in) {
  if (in.layout != 2 && in.layout != 3) return;
  const std::vector<double> st = read(in.storage);
  int64_t nans = 0;
  for (const double x : st) nans += std::isnan(x) ? 1 : 0;
  if (nans != int64_t(st.size()) - numel_of(in.sizes))
    throw std::logic_error("kernels target: " + what + " wrote outside its output view (layout " +
                           std::to_string(in.layout) + ")");
}

std::string describe(const char* op, DType dtype, bool autocast, std::initializer_list<const Input*> ins) {
  std::ostringstream o;
  o << op << " " << dtype_name(dtype) << (autocast ? " autocast bf16" : "");
  for (const Input* in : ins) o << " " << shape_str(Shape(in->sizes)) << "/layout" << in->layout;
  return o.str();
}

// The seed of a backward: r of y's shape and dtype, contiguous; backward of sum(y * r) gives d y = r.
Input seed_for(Program& p, const Tensor& y) {
  std::vector<int64_t> sizes(y.shape().begin(), y.shape().end());
  return make(p, sizes, y.dtype(), false);
}
void backward_with(const Tensor& y, const Input& r) { mul(y, r.t).sum().backward(); }

// ---- GEMM-like ops ----

// matmul: a [M, K] or [B, M, K] times b [K, N] or [B, K, N]; with its gradients.
void run_matmul(Program& p) {
  const DType dt = kFloating[p.in(0, 3)];
  const bool autocast = dt == DType::F32 && p.in(0, 2) == 0;
  const int64_t batch = p.in(0, 2) == 0 ? p.in(1, 3) : 0;
  const bool b_batched = batch > 0 && p.in(0, 1) == 1;
  const int64_t m = size_of(p, 0, 9, 80), k = size_of(p, 0, 9, 96), n = size_of(p, 0, 9, 80);
  const bool grad = p.in(0, 1) == 1;
  std::vector<int64_t> as{m, k}, bs{k, n};
  if (batch) as.insert(as.begin(), batch);
  if (b_batched) bs.insert(bs.begin(), batch);
  Input a = make(p, as, dt), b = make(p, bs, dt);
  if (grad) a.t.requires_grad_(), b.t.requires_grad_();
  const std::string what = describe("matmul", dt, autocast, {&a, &b});
  Tensor y;
  {
    std::optional<amp::Autocast> guard;
    if (autocast) guard.emplace(DType::BF16);
    y = matmul(a.t, b.t);
  }
  const int64_t nb = std::max<int64_t>(batch, 1);
  const double uc = unit_roundoff(dt == DType::F64 ? DType::F64 : DType::F32);
  const double uo = unit_roundoff(autocast ? DType::BF16 : dt);
  auto A = [&](int64_t s, int64_t i, int64_t l) { return batch ? a.at({s, i, l}) : a.at({i, l}); };
  auto B = [&](int64_t s, int64_t l, int64_t j) { return b_batched ? b.at({s, l, j}) : b.at({l, j}); };
  std::vector<int64_t> ys{m, n};
  if (batch) ys.insert(ys.begin(), batch);
  Want want(nb * m * n);
  for (int64_t s = 0; s < nb; ++s)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const Sum e = sum_of(k, [&](int64_t l) { return A(s, i, l) * B(s, l, j); });
        want.set((s * m + i) * n + j, e.sum, e.mag);
      }
  expect(what, y, ys, autocast ? DType::BF16 : dt, want, double(k), uc, uo);
  if (!grad) return;
  const Input r = seed_for(p, y);
  backward_with(y, r);
  auto R = [&](int64_t s, int64_t i, int64_t j) { return r.v[size_t((s * m + i) * n + j)]; };
  Want da(nb * m * k), db((b_batched ? nb : 1) * k * n);
  for (int64_t s = 0; s < nb; ++s)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t l = 0; l < k; ++l) {
        const Sum e = sum_of(n, [&](int64_t j) { return R(s, i, j) * B(s, l, j); });
        da.set((s * m + i) * k + l, e.sum, e.mag);
      }
  for (int64_t s = 0; s < (b_batched ? nb : 1); ++s)
    for (int64_t l = 0; l < k; ++l)
      for (int64_t j = 0; j < n; ++j) {
        // Over the rows of b's batch, or of every batch where b is one matrix.
        const int64_t first = b_batched ? s : 0, count = b_batched ? 1 : nb;
        const Sum e = sum_of(
            count * m, [&](int64_t q) { return A(first + q / m, q % m, l) * R(first + q / m, q % m, j); });
        db.set((s * k + l) * n + j, e.sum, e.mag);
      }
  expect(what + " d a", a.t.grad(), as, dt, da, double(n), uc, uo);
  expect(what + " d b", b.t.grad(), bs, dt, db, double(m * nb), uc, uo);
}

// F::linear / F::linear_relu: x [M, K] (or [2, M, K]), weight [N, K], bias [N] or none; with gradients.
void run_linear(Program& p) {
  const DType dt = kFloating[p.in(0, 3)];
  const bool autocast = dt == DType::F32 && p.in(0, 2) == 0;
  const bool relu = p.in(0, 1) == 1, with_bias = p.in(0, 2) != 0, three_d = p.in(0, 4) == 0;
  const int64_t m = size_of(p, 0, 9, 80), k = size_of(p, 0, 9, 96), n = size_of(p, 0, 9, 80);
  const bool grad = p.in(0, 1) == 1;
  std::vector<int64_t> xs{m, k};
  if (three_d) xs.insert(xs.begin(), 2);
  Input x = make(p, xs, dt), w = make(p, {n, k}, dt);
  Input b = with_bias ? make(p, {n}, dt) : Input();
  if (grad) {
    x.t.requires_grad_(), w.t.requires_grad_();
    if (with_bias) b.t.requires_grad_();
  }
  const std::string what =
      describe(relu ? "linear_relu" : "linear", dt, autocast, {&x, &w}) + (with_bias ? " bias" : "");
  Tensor y;
  {
    std::optional<amp::Autocast> guard;
    if (autocast) guard.emplace(DType::BF16);
    y = relu ? F::linear_relu(x.t, w.t, b.t) : F::linear(x.t, w.t, b.t);
  }
  const int64_t rows = three_d ? 2 * m : m;
  const double uc = unit_roundoff(dt == DType::F64 ? DType::F64 : DType::F32);
  const double uo = unit_roundoff(autocast ? DType::BF16 : dt);
  auto X = [&](int64_t i, int64_t l) { return x.v[size_t(i * k + l)]; };
  std::vector<int64_t> ys = xs;
  ys.back() = n;
  Want want(rows * n);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const Sum e = sum_of(k, [&](int64_t l) { return X(i, l) * w.at({j, l}); });
      const double bias = with_bias ? b.v[size_t(j)] : 0.0;
      want.set(i * n + j, relu ? std::max(e.sum + bias, 0.0) : e.sum + bias, e.mag + std::fabs(bias));
      want.rmag[size_t(i * n + j)] = std::fabs(e.sum) + std::fabs(bias);
    }
  expect(what, y, ys, autocast ? DType::BF16 : dt, want, double(k + 1), uc, uo);
  if (!grad) return;
  const Input r = seed_for(p, y);
  const std::vector<double> yv = read(y);
  backward_with(y, r);
  // d z: d y where the output (as computed) is positive, for linear_relu.
  auto Z = [&](int64_t i, int64_t j) {
    const size_t e = size_t(i * n + j);
    return relu && !(yv[e] > 0) ? 0.0 : r.v[e];
  };
  Want dx(rows * k), dw(n * k), db(n);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t l = 0; l < k; ++l) {
      const Sum e = sum_of(n, [&](int64_t j) { return Z(i, j) * w.at({j, l}); });
      dx.set(i * k + l, e.sum, e.mag);
    }
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t l = 0; l < k; ++l) {
      const Sum e = sum_of(rows, [&](int64_t i) { return Z(i, j) * X(i, l); });
      dw.set(j * k + l, e.sum, e.mag);
    }
    const Sum e = sum_of(rows, [&](int64_t i) { return Z(i, j); });
    db.set(j, e.sum, e.mag);
  }
  expect(what + " d x", x.t.grad(), xs, dt, dx, double(n), uc, uo);
  expect(what + " d weight", w.t.grad(), {n, k}, dt, dw, double(rows), uc, uo);
  if (with_bias) expect(what + " d bias", b.t.grad(), {n}, dt, db, double(rows), uc, uo);
}

// ---- Convolution ----

// conv2d / conv2d_relu (with gradients) / conv2d_relu_pool2 (forward only): x [N, C, H, W], weight
// [O, C / groups, kH, kW], bias [O] or none, stride, padding, dilation, groups.
void run_conv(Program& p) {
  const DType dt = kFloating[p.in(0, 3)];
  const bool autocast = dt == DType::F32 && p.in(0, 3) == 0;
  const int form = int(p.in(0, 2));  // 0 conv2d, 1 conv2d_relu, 2 conv2d_relu_pool2
  const bool with_bias = p.in(0, 2) != 0, grad = form != 2 && p.in(0, 1) == 1;
  const int64_t groups = p.in(0, 3) == 0 ? p.in(2, 3) : 1;
  const bool wide = p.in(0, 5) == 0;  // channels enough for Winograd
  // Winograd is off by default; a wide convolution may switch it on (Note [Winograd convolutions]).
  const bool winograd = wide && p.in(0, 1) == 1;
  set_conv_onednn_winograd(winograd);
  struct Direct {
    ~Direct() { set_conv_onednn_winograd(false); }
  } direct;
  const int64_t cg = wide ? p.in(14, 18) : p.in(1, 4), og = wide ? p.in(14, 18) : p.in(1, 4);
  // oneDNN takes Winograd from about 16 images (8 did not, on AVX-512).
  const int64_t batch = winograd ? p.in(16, 18) : p.in(1, 3);
  const int64_t kh = wide ? 3 : p.in(1, 3), kw = wide ? 3 : p.in(1, 3);
  const int64_t sh = wide ? 1 : p.in(1, 2), sw = wide ? 1 : p.in(1, 2);
  const int64_t dh = p.in(0, 4) == 0 ? 2 : 1, dw_ = p.in(0, 4) == 0 ? 2 : 1;
  const int64_t ph = p.in(0, kh / 2 * dh), pw = p.in(0, kw / 2 * dw_);
  const int64_t ekh = dh * (kh - 1) + 1, ekw = dw_ * (kw - 1) + 1;
  // At least one output row and column; two for conv2d_relu_pool2's pool.
  const int64_t h = std::max<int64_t>(1, ekh - 2 * ph) + (form == 2 ? sh : 0) + p.in(0, wide ? 10 : 7);
  const int64_t wd = std::max<int64_t>(1, ekw - 2 * pw) + (form == 2 ? sw : 0) + p.in(0, wide ? 10 : 7);
  const int64_t c = cg * groups, o = og * groups;
  const int64_t oh = (h + 2 * ph - ekh) / sh + 1, ow = (wd + 2 * pw - ekw) / sw + 1;
  Input x = make(p, {batch, c, h, wd}, dt), w = make(p, {o, cg, kh, kw}, dt);
  Input b = with_bias ? make(p, {o}, dt) : Input();
  if (grad) {
    x.t.requires_grad_(), w.t.requires_grad_();
    if (with_bias) b.t.requires_grad_();
  }
  std::ostringstream args;
  args << " stride " << sh << "," << sw << " padding " << ph << "," << pw << " dilation " << dh << "," << dw_
       << " groups " << groups << (with_bias ? " bias" : "");
  const char* names[] = {"conv2d", "conv2d_relu", "conv2d_relu_pool2"};
  const std::string what = describe(names[form], dt, autocast, {&x, &w}) + args.str();
  Tensor y;
  {
    std::optional<amp::Autocast> guard;
    if (autocast) guard.emplace(DType::BF16);
    const Size2 stride(sh, sw), padding(ph, pw), dilation(dh, dw_);
    if (form == 0) y = conv2d(x.t, w.t, b.t, stride, padding, dilation, groups);
    if (form == 1) y = conv2d_relu(x.t, w.t, b.t, stride, padding, dilation, groups);
    if (form == 2) y = ops::conv2d_relu_pool2(x.t, w.t, b.t, stride, padding, dilation, groups);
  }
  const DType out = autocast && form != 2 ? DType::BF16 : dt;
  const double uc = unit_roundoff(dt == DType::F64 ? DType::F64 : DType::F32);
  const double uo = unit_roundoff(out);
  const double len = double(cg * kh * kw + 1);
  // Each tap of output (n, oc, i, j): calls f(input channel, row, column, weight index) for every in-range
  // one.
  auto taps = [&](int64_t oc, int64_t i, int64_t j, auto&& f) {
    const int64_t g = oc / og;
    for (int64_t ci = 0; ci < cg; ++ci)
      for (int64_t u = 0; u < kh; ++u)
        for (int64_t v = 0; v < kw; ++v) {
          const int64_t r = i * sh - ph + u * dh, s = j * sw - pw + v * dw_;
          if (r >= 0 && r < h && s >= 0 && s < wd) f(g * cg + ci, r, s, ((oc * cg + ci) * kh + u) * kw + v);
        }
  };
  Want conv(batch * o * oh * ow);
  for (int64_t nn = 0; nn < batch; ++nn)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double sum = 0, mag = 0;
          taps(oc, i, j, [&](int64_t ci, int64_t r, int64_t s, int64_t wi) {
            const double t = x.at({nn, ci, r, s}) * w.v[size_t(wi)];
            sum += t, mag += std::fabs(t);
          });
          double rmag = std::fabs(sum);
          if (with_bias)
            sum += b.v[size_t(oc)], mag += std::fabs(b.v[size_t(oc)]), rmag += std::fabs(b.v[size_t(oc)]);
          const int64_t e = ((nn * o + oc) * oh + i) * ow + j;
          conv.set(e, form == 0 ? sum : std::max(sum, 0.0), mag);
          conv.rmag[size_t(e)] = rmag;
        }
  // A Winograd convolution's transforms round more than a direct one (Note [Winograd convolutions]).
  const bool normwise = winograd;
  if (form == 2)  // max_pool2d(., 2) of the ReLU's output: the window's largest, within its bound
    return expect(what, y, {batch, o, oh / 2, ow / 2}, out, pool2_of(conv, batch * o, oh, ow), len, uc, uo,
                  normwise);
  expect(what, y, {batch, o, oh, ow}, out, conv, len, uc, uo, normwise);
  if (!grad) return;
  const Input r = seed_for(p, y);
  const std::vector<double> yv = read(y);
  backward_with(y, r);
  auto Z = [&](int64_t e) { return form == 1 && !(yv[size_t(e)] > 0) ? 0.0 : r.v[size_t(e)]; };
  Want dx(batch * c * h * wd), dw(o * cg * kh * kw), db(o);
  for (int64_t nn = 0; nn < batch; ++nn)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t e = ((nn * o + oc) * oh + i) * ow + j;
          const double z = Z(e);
          taps(oc, i, j, [&](int64_t ci, int64_t rr, int64_t s, int64_t wi) {
            const size_t xi = size_t(((nn * c + ci) * h + rr) * wd + s);
            dx.v[xi] += z * w.v[size_t(wi)], dx.mag[xi] += std::fabs(z * w.v[size_t(wi)]);
            const double xv = x.at({nn, ci, rr, s});
            dw.v[size_t(wi)] += z * xv, dw.mag[size_t(wi)] += std::fabs(z * xv);
          });
          db.v[size_t(oc)] += z, db.mag[size_t(oc)] += std::fabs(z);
        }
  for (Want* g : {&dx, &dw, &db})
    for (size_t i = 0; i < g->v.size(); ++i) g->rmag[i] = std::fabs(g->v[i]);
  expect(what + " d x", x.t.grad(), {batch, c, h, wd}, dt, dx, double(o * kh * kw), uc, uo, normwise);
  expect(what + " d weight", w.t.grad(), {o, cg, kh, kw}, dt, dw, double(batch * oh * ow), uc, uo, normwise);
  if (with_bias) expect(what + " d bias", b.t.grad(), {o}, dt, db, double(batch * oh * ow), uc, uo);
}

// ---- Pooling ----

// max_pool2d (with dilation) / avg_pool2d (count_include_pad or not) of x [N, C, H, W]; with gradients.
void run_pool(Program& p) {
  const DType dt = kFloating[p.in(0, 3)];
  const bool is_max = p.in(0, 1) == 0, include_pad = p.in(0, 1) == 1, grad = p.in(0, 1) == 1;
  const int64_t kh = p.in(1, 3), kw = p.in(1, 3), sh = p.in(1, 3), sw = p.in(1, 3);
  const int64_t dh = is_max && p.in(0, 3) == 0 ? 2 : 1, dw_ = is_max && p.in(0, 3) == 0 ? 2 : 1;
  const int64_t ph = p.in(0, kh / 2), pw = p.in(0, kw / 2);
  const int64_t ekh = dh * (kh - 1) + 1, ekw = dw_ * (kw - 1) + 1;
  const int64_t batch = p.in(1, 2), c = size_of(p, 1, 4, 40);
  const int64_t h = std::max<int64_t>(1, ekh - 2 * ph) + p.in(0, 9);
  const int64_t wd = std::max<int64_t>(1, ekw - 2 * pw) + p.in(0, 9);
  const int64_t oh = (h + 2 * ph - ekh) / sh + 1, ow = (wd + 2 * pw - ekw) / sw + 1;
  Input x = make(p, {batch, c, h, wd}, dt);
  if (grad) x.t.requires_grad_();
  std::ostringstream args;
  args << " kernel " << kh << "," << kw << " stride " << sh << "," << sw << " padding " << ph << "," << pw
       << " dilation " << dh << "," << dw_
       << (is_max        ? ""
           : include_pad ? " count_include_pad"
                         : "");
  const std::string what = describe(is_max ? "max_pool2d" : "avg_pool2d", dt, false, {&x}) + args.str();
  const Tensor y = is_max ? max_pool2d(x.t, Size2(kh, kw), Size2(sh, sw), Size2(ph, pw), Size2(dh, dw_))
                          : avg_pool2d(x.t, Size2(kh, kw), Size2(sh, sw), Size2(ph, pw), include_pad);
  const double uc = unit_roundoff(dt == DType::F64 ? DType::F64 : DType::F32), uo = unit_roundoff(dt);
  Want want(batch * c * oh * ow);
  std::vector<int64_t> from(size_t(batch * c * oh * ow), -1);  // max: the first largest tap's element
  std::vector<double> divisor(size_t(batch * c * oh * ow), 0);
  for (int64_t q = 0; q < batch * c; ++q)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t e = (q * oh + i) * ow + j;
        double best = 0, sum = 0, mag = 0;
        int64_t count = 0;
        for (int64_t u = 0; u < kh; ++u)
          for (int64_t v = 0; v < kw; ++v) {
            const int64_t rr = i * sh - ph + u * dh, s = j * sw - pw + v * dw_;
            if (rr < 0 || rr >= h || s < 0 || s >= wd) continue;
            const int64_t xi = (q * h + rr) * wd + s;
            const double xv = x.v[size_t(xi)];
            if (from[size_t(e)] < 0 || xv > best) best = xv, from[size_t(e)] = xi;
            sum += xv, mag += std::fabs(xv), ++count;
          }
        divisor[size_t(e)] = include_pad ? double(kh * kw) : double(count);
        if (is_max)
          want.set(e, from[size_t(e)] < 0 ? -INFINITY : best, 0);  // no tap in range: -inf
        else
          want.set(e, sum / divisor[size_t(e)], mag / divisor[size_t(e)]);
      }
  expect(what, y, {batch, c, oh, ow}, dt, want, double(kh * kw), uc, uo);
  if (!grad) return;
  const Input r = seed_for(p, y);
  backward_with(y, r);
  Want dx(batch * c * h * wd);
  for (int64_t q = 0; q < batch * c; ++q)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t e = (q * oh + i) * ow + j;
        const double g = r.v[size_t(e)];
        if (is_max) {
          if (from[size_t(e)] >= 0)
            dx.v[size_t(from[size_t(e)])] += g, dx.mag[size_t(from[size_t(e)])] += std::fabs(g);
          continue;
        }
        for (int64_t u = 0; u < kh; ++u)
          for (int64_t v = 0; v < kw; ++v) {
            const int64_t rr = i * sh - ph + u * dh, s = j * sw - pw + v * dw_;
            if (rr < 0 || rr >= h || s < 0 || s >= wd) continue;
            const size_t xi = size_t((q * h + rr) * wd + s);
            dx.v[xi] += g / divisor[size_t(e)], dx.mag[xi] += std::fabs(g / divisor[size_t(e)]);
          }
      }
  for (size_t i = 0; i < dx.v.size(); ++i) dx.rmag[i] = std::fabs(dx.v[i]);
  expect(what + " d x", x.t.grad(), {batch, c, h, wd}, dt, dx, double(kh * kw * 4), uc, uo);
}

// ---- Reductions, softmax, layer norm ----

// x of 1 to 3 dims, one dim reduced: a view of x as [outer, len, inner] around it.
struct Around {
  int64_t outer = 1, len = 1, inner = 1;
  Around(const std::vector<int64_t>& sizes, int64_t dim) {
    for (int64_t d = 0; d < int64_t(sizes.size()); ++d)
      (d < dim ? outer : d == dim ? len : inner) *= sizes[size_t(d)];
  }
  int64_t at(int64_t o, int64_t l, int64_t i) const { return (o * len + l) * inner + i; }
};

std::vector<int64_t> sizes_1_to_3(Program& p) {
  std::vector<int64_t> s(size_t(p.in(1, 3)));
  for (int64_t& v : s) v = size_of(p, 0, 9, 100);
  return s;
}

// sum / mean / max / argmax over one dim (keepdim or not).
void run_reduce(Program& p) {
  const DType dt = kFloating[p.in(0, 3)];
  const int form = int(p.in(0, 3));
  const bool keepdim = p.in(0, 1) == 1;
  std::vector<int64_t> sizes = sizes_1_to_3(p);
  const int64_t dim = p.in(0, int64_t(sizes.size()) - 1);
  if (form >= 2 && sizes[size_t(dim)] == 0) sizes[size_t(dim)] = 1;  // max of nothing is an error
  const Input x = make(p, sizes, dt);
  const char* names[] = {"sum", "mean", "max", "argmax"};
  const std::string what = describe(names[form], dt, false, {&x}) + " dim " + std::to_string(dim);
  const Tensor y = form == 0   ? x.t.sum({dim}, keepdim)
                   : form == 1 ? x.t.mean({dim}, keepdim)
                   : form == 2 ? x.t.max({dim}, keepdim)
                               : x.t.argmax(dim, keepdim);
  const Around a(sizes, dim);
  Want want(a.outer * a.inner);
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t i = 0; i < a.inner; ++i) {
      double sum = 0, mag = 0, best = 0;
      int64_t arg = 0;
      for (int64_t l = 0; l < a.len; ++l) {
        const double v = x.v[size_t(a.at(o, l, i))];
        sum += v, mag += std::fabs(v);
        if (l == 0 || v > best) best = v, arg = l;
      }
      const double mean = a.len ? sum / double(a.len) : std::nan("");
      const double value = form == 0 ? sum : form == 1 ? mean : form == 2 ? best : double(arg);
      want.set(o * a.inner + i, value, form == 1 && a.len ? mag / double(a.len) : form <= 1 ? mag : 0);
    }
  std::vector<int64_t> ys = sizes;
  if (keepdim)
    ys[size_t(dim)] = 1;
  else
    ys.erase(ys.begin() + dim);
  const double uc = unit_roundoff(dt == DType::F64 ? DType::F64 : DType::F32);
  expect(what, y, ys, form == 3 ? DType::I64 : dt, want, double(a.len), uc,
         form == 3 ? 0 : unit_roundoff(dt));
}

// softmax / log_softmax over one dim; with the gradient.
void run_softmax(Program& p) {
  const DType dt = kFloating[p.in(0, 3)];
  const bool log = p.in(0, 1) == 1, grad = p.in(0, 1) == 1;
  const std::vector<int64_t> sizes = sizes_1_to_3(p);
  const int64_t dim = p.in(0, int64_t(sizes.size()) - 1);
  Input x = make(p, sizes, dt);
  if (grad) x.t.requires_grad_();
  const std::string what =
      describe(log ? "log_softmax" : "softmax", dt, false, {&x}) + " dim " + std::to_string(dim);
  const Tensor y = log ? x.t.log_softmax(dim) : x.t.softmax(dim);
  const Around a(sizes, dim);
  const int64_t n = numel_of(sizes);
  Want want(n);
  std::vector<double> prob(static_cast<size_t>(n));
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t i = 0; i < a.inner; ++i) {
      double mx = -INFINITY, z = 0;
      for (int64_t l = 0; l < a.len; ++l) mx = std::max(mx, x.v[size_t(a.at(o, l, i))]);
      for (int64_t l = 0; l < a.len; ++l) z += std::exp(x.v[size_t(a.at(o, l, i))] - mx);
      for (int64_t l = 0; l < a.len; ++l) {
        const size_t e = size_t(a.at(o, l, i));
        const double d = x.v[e] - mx;
        prob[e] = std::exp(d) / z;
        // softmax: relative error; log_softmax: absolute, of its two terms.
        want.set(int64_t(e), log ? d - std::log(z) : prob[e], log ? std::fabs(d) + std::log(z) + 1 : prob[e]);
      }
    }
  // exp's and log's own error: a few ulps of the compute type, counted as 8 more terms.
  const double uc = unit_roundoff(dt == DType::F64 ? DType::F64 : DType::F32), uo = unit_roundoff(dt);
  expect(what, y, sizes, dt, want, double(a.len + 8), uc, uo);
  if (!grad) return;
  const Input r = seed_for(p, y);
  backward_with(y, r);
  Want dx(n);
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t i = 0; i < a.inner; ++i) {
      double dot = 0, dmag = 0;  // softmax: sum r p; log_softmax: sum r
      for (int64_t l = 0; l < a.len; ++l) {
        const size_t e = size_t(a.at(o, l, i));
        dot += log ? r.v[e] : r.v[e] * prob[e], dmag += std::fabs(log ? r.v[e] : r.v[e] * prob[e]);
      }
      for (int64_t l = 0; l < a.len; ++l) {
        const size_t e = size_t(a.at(o, l, i));
        const double v = log ? r.v[e] - prob[e] * dot : prob[e] * (r.v[e] - dot);
        // The backward reads y, rounded to the output's dtype: log_softmax's exp(y) is off by |y| u_o;
        // softmax's p (r - sum r p) carries the rounding of p, of each r p, of the sum and of the result.
        const double mag = log ? std::fabs(r.v[e]) + prob[e] * dmag * (1 + std::fabs(want.v[e]))
                               : 2 * prob[e] * (std::fabs(r.v[e]) + 2 * dmag);
        dx.set(int64_t(e), v, mag);
        dx.rmag[e] = mag;
      }
    }
  expect(what + " d x", x.t.grad(), sizes, dt, dx, double(a.len + 8), uc, uo);
}

// Layer norm over the last dim of x [rows, d] in f64 (w, b: empty for none): y, x-hat, 1 / sqrt(var + eps)
// per row, and per row how x-hat's rounding grows where the row is nearly constant (1 + max |x| rstd).
struct LayerNormRef {
  std::vector<double> y, xhat, rstd, scale;
};
LayerNormRef layer_norm_ref(const std::vector<double>& x, int64_t rows, int64_t d,
                            const std::vector<double>& w, const std::vector<double>& b, double eps) {
  LayerNormRef r;
  r.y.resize(x.size()), r.xhat.resize(x.size()), r.rstd.resize(size_t(rows)), r.scale.resize(size_t(rows));
  for (int64_t i = 0; i < rows; ++i) {
    double mean = 0, var = 0, mx = 0;
    for (int64_t j = 0; j < d; ++j)
      mean += x[size_t(i * d + j)], mx = std::max(mx, std::fabs(x[size_t(i * d + j)]));
    mean /= double(d);
    for (int64_t j = 0; j < d; ++j) var += (x[size_t(i * d + j)] - mean) * (x[size_t(i * d + j)] - mean);
    r.rstd[size_t(i)] = 1 / std::sqrt(var / double(d) + eps);
    r.scale[size_t(i)] = 1 + mx * r.rstd[size_t(i)];
    for (int64_t j = 0; j < d; ++j) {
      const size_t e = size_t(i * d + j);
      r.xhat[e] = (x[e] - mean) * r.rstd[size_t(i)];
      r.y[e] = r.xhat[e] * (w.empty() ? 1.0 : w[size_t(j)]) + (b.empty() ? 0.0 : b[size_t(j)]);
    }
  }
  return r;
}
// The bound's magnitude of y's element e (column j).
double layer_norm_mag(const LayerNormRef& r, int64_t e, int64_t d, const std::vector<double>& w,
                      const std::vector<double>& b) {
  const size_t j = size_t(e % d);
  return r.scale[size_t(e / d)] * (w.empty() ? 1.0 : std::fabs(w[j])) + (b.empty() ? 0.0 : std::fabs(b[j]));
}
// d x from g = d y * w (rows x d), with each element's magnitude.
Want layer_norm_dx(const LayerNormRef& r, const std::vector<double>& g, int64_t rows, int64_t d) {
  Want dx(rows * d);
  for (int64_t i = 0; i < rows; ++i) {
    double mg = 0, mgx = 0, mabs = 0, mxh = 0;
    for (int64_t j = 0; j < d; ++j) {
      const size_t e = size_t(i * d + j);
      mg += g[e] / double(d), mgx += g[e] * r.xhat[e] / double(d), mabs += std::fabs(g[e]) / double(d);
      mxh = std::max(mxh, std::fabs(r.xhat[e]));
    }
    const double rstd = r.rstd[size_t(i)], scale = r.scale[size_t(i)];
    for (int64_t j = 0; j < d; ++j) {
      const size_t e = size_t(i * d + j);
      dx.set(int64_t(e), rstd * (g[e] - mg - r.xhat[e] * mgx),
             rstd * scale * (std::fabs(g[e]) + (2 + std::fabs(r.xhat[e])) * mabs * (1 + mxh)));
    }
  }
  return dx;
}

// F::layer_norm over the last dim (weight and bias or none); with the gradients of x, and of the weight and
// the bias where the program has them.
void run_layer_norm(Program& p) {
  const DType dt = kFloating[p.in(0, 3)];
  const bool affine = p.in(0, 1) == 1, grad = p.in(0, 1) == 1;
  const int64_t rows = size_of(p, 1, 6, 40), d = size_of(p, 1, 12, 130);
  Input x = make(p, {rows, d}, dt);
  Input w = affine ? make(p, {d}, dt) : Input(), b = affine ? make(p, {d}, dt) : Input();
  if (grad) x.t.requires_grad_();
  if (grad && affine) w.t.requires_grad_(), b.t.requires_grad_();
  const std::string what = describe("layer_norm", dt, false, {&x}) + (affine ? " affine" : "");
  const Tensor y = F::layer_norm(x.t, Shape({d}), w.t, b.t, 1e-5);
  const LayerNormRef ref = layer_norm_ref(x.v, rows, d, w.v, b.v, 1e-5);
  Want want(rows * d);
  for (int64_t e = 0; e < rows * d; ++e) want.set(e, ref.y[size_t(e)], layer_norm_mag(ref, e, d, w.v, b.v));
  const double uc = unit_roundoff(dt == DType::F64 ? DType::F64 : DType::F32), uo = unit_roundoff(dt);
  expect(what, y, {rows, d}, dt, want, double(d), uc, uo);
  if (!grad) return;
  const Input r = seed_for(p, y);
  backward_with(y, r);
  std::vector<double> g = r.v;
  if (affine)
    for (size_t e = 0; e < g.size(); ++e) g[e] *= w.v[e % size_t(d)];
  expect(what + " d x", x.t.grad(), {rows, d}, dt, layer_norm_dx(ref, g, rows, d), double(d), uc, uo);
  if (!affine) return;
  // d weight[j] = sum over the rows of d y x-hat, d bias[j] = the sum of d y; x-hat's rounding grows with the
  // row's scale (layer_norm_ref).
  Want dw(d), db(d);
  for (int64_t j = 0; j < d; ++j) {
    double sw = 0, mw = 0, sb = 0, mb = 0;
    for (int64_t i = 0; i < rows; ++i) {
      const size_t e = size_t(i * d + j);
      sw += r.v[e] * ref.xhat[e], mw += std::fabs(r.v[e]) * ref.scale[size_t(i)];
      sb += r.v[e], mb += std::fabs(r.v[e]);
    }
    dw.set(j, sw, mw);
    db.set(j, sb, mb);
  }
  expect(what + " d weight", w.t.grad(), {d}, dt, dw, double(rows), uc, uo);
  expect(what + " d bias", b.t.grad(), {d}, dt, db, double(rows), uc, uo);
}

// GELU, exact (erf) or its tanh form, and its derivative, in f64.
double gelu(double x, bool tanh_form) {
  if (!tanh_form) return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}
double gelu_grad(double x, bool tanh_form) {
  if (!tanh_form)
    return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) +
           x * std::exp(-x * x / 2) / std::sqrt(2 * std::numbers::pi);
  const double k = std::sqrt(2 / std::numbers::pi), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

// The transformer's fused layers: F::layer_norm_linear (the norm's weight and bias, eps 1e-5) and
// F::gelu_linear (exact or tanh) of x [M, D] by weight [N, D], bias [N] or none; under bf16 autocast or not;
// with the gradients of x and the weight.
void run_fused_linear(Program& p) {
  const DType dt = kFloating[p.in(0, 3)];
  const bool autocast = dt == DType::F32 && p.in(0, 2) == 0;
  const int form = int(p.in(0, 2));  // 0 layer_norm_linear, 1 gelu_linear, 2 gelu_linear (tanh)
  const bool with_bias = p.in(0, 2) != 0, grad = p.in(0, 1) == 1;
  const int64_t m = size_of(p, 1, 9, 64), d = size_of(p, 1, 12, 100), n = size_of(p, 1, 9, 80);
  Input x = make(p, {m, d}, dt), w = make(p, {n, d}, dt);
  Input b = with_bias ? make(p, {n}, dt) : Input();
  Input lw = form == 0 ? make(p, {d}, dt) : Input(), lb = form == 0 ? make(p, {d}, dt) : Input();
  if (grad) x.t.requires_grad_(), w.t.requires_grad_();
  const char* names[] = {"layer_norm_linear", "gelu_linear", "gelu_linear tanh"};
  const std::string what = describe(names[form], dt, autocast, {&x, &w}) + (with_bias ? " bias" : "");
  Tensor y;
  {
    std::optional<amp::Autocast> guard;
    if (autocast) guard.emplace(DType::BF16);
    y = form == 0 ? F::layer_norm_linear(x.t, Shape({d}), lw.t, lb.t, 1e-5, w.t, b.t)
                  : F::gelu_linear(x.t, w.t, b.t, form == 2 ? "tanh" : "none");
  }
  // h: the layer's input after the norm or the GELU, the error scale of each of its elements, and the
  // magnitude of what is rounded where h is rounded (under autocast, the norm rounds x-hat, then h: Note
  // [layer norm before a Linear under autocast]).
  std::vector<double> h(x.v.size()), herr(x.v.size()), hround(x.v.size());
  LayerNormRef ln;
  if (form == 0) {
    ln = layer_norm_ref(x.v, m, d, lw.v, lb.v, 1e-5);
    h = ln.y;
    for (int64_t e = 0; e < m * d; ++e) {
      const size_t j = size_t(e % d);
      herr[size_t(e)] = layer_norm_mag(ln, e, d, lw.v, lb.v);
      hround[size_t(e)] =
          std::fabs(ln.xhat[size_t(e)] * lw.v[j]) + std::fabs(lb.v[j]) + std::fabs(h[size_t(e)]);
    }
  } else {
    for (size_t e = 0; e < h.size(); ++e)
      h[e] = gelu(x.v[e], form == 2), herr[e] = std::fabs(x.v[e]) + 1, hround[e] = std::fabs(h[e]);
  }
  const double uc = unit_roundoff(dt == DType::F64 ? DType::F64 : DType::F32);
  const double uo = unit_roundoff(autocast ? DType::BF16 : dt);
  // Under autocast (or in a 16-bit dtype) h is rounded before the GEMM: every term carries u_o.
  const bool h_rounded = autocast || dt == DType::BF16 || dt == DType::F16;
  Want want(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0, mag = 0, hmag = 0;
      for (int64_t l = 0; l < d; ++l) {
        const double wv = w.v[size_t(j * d + l)];
        sum += h[size_t(i * d + l)] * wv, mag += herr[size_t(i * d + l)] * std::fabs(wv);
        hmag += hround[size_t(i * d + l)] * std::fabs(wv);
      }
      const double bias = with_bias ? b.v[size_t(j)] : 0.0;
      want.set(i * n + j, sum + bias, mag + std::fabs(bias));
      want.rmag[size_t(i * n + j)] = (h_rounded ? hmag : std::fabs(sum)) + std::fabs(bias);
    }
  expect(what, y, {m, n}, autocast ? DType::BF16 : dt, want, double(d + 8), uc, uo);
  if (!grad) return;
  const Input r = seed_for(p, y);
  backward_with(y, r);
  // d h = d y W, then through the norm or the GELU; d W = d y^T h.
  std::vector<double> dh(x.v.size()), dhmag(x.v.size());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < d; ++l)
      for (int64_t j = 0; j < n; ++j) {
        const double t = r.v[size_t(i * n + j)] * w.v[size_t(j * d + l)];
        dh[size_t(i * d + l)] += t, dhmag[size_t(i * d + l)] += std::fabs(t);
      }
  Want dx(m * d);
  if (form == 0) {
    std::vector<double> g = dh, gmag = dhmag;
    for (size_t e = 0; e < g.size(); ++e)
      g[e] *= lw.v[e % size_t(d)], gmag[e] *= std::fabs(lw.v[e % size_t(d)]);
    dx = layer_norm_dx(ln, gmag, m, d);  // the magnitudes, from |g|
    const Want v = layer_norm_dx(ln, g, m, d);
    dx.v = v.v;
  } else {
    for (size_t e = 0; e < dh.size(); ++e) {
      const double k = gelu_grad(x.v[e], form == 2);
      dx.set(int64_t(e), dh[e] * k, dhmag[e] * (std::fabs(k) + 1));
    }
  }
  for (size_t e = 0; e < dx.v.size(); ++e) dx.rmag[e] = h_rounded ? dx.mag[e] : std::fabs(dx.v[e]);
  Want dw(n * d);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t l = 0; l < d; ++l) {
      double sum = 0, mag = 0, hmag = 0;
      for (int64_t i = 0; i < m; ++i) {
        const double rv = r.v[size_t(i * n + j)];
        sum += rv * h[size_t(i * d + l)], mag += std::fabs(rv) * herr[size_t(i * d + l)];
        hmag += std::fabs(rv) * hround[size_t(i * d + l)];
      }
      dw.set(j * d + l, sum, mag);
      dw.rmag[size_t(j * d + l)] = h_rounded ? hmag : std::fabs(sum);
    }
  expect(what + " d x", x.t.grad(), {m, d}, dt, dx, double(n + d + 8), uc, uo);
  expect(what + " d weight", w.t.grad(), {n, d}, dt, dw, double(m + 8), uc, uo);
}

// F::self_attention of packed qkv [B, T, 3 d] (n_heads heads of d / n_heads, causal or not) and
// F::attention_scores_softmax of scores [B, T, T]; with the gradients.
void run_attention(Program& p) {
  const DType dt = kFloating[p.in(0, 3)];
  const bool fused = p.in(0, 2) != 0, causal = p.in(0, 1) == 1;
  const int64_t batch = p.in(1, 2), t = size_of(p, 1, 9, 40), heads = p.in(1, 4), hd = size_of(p, 1, 8, 40);
  const int64_t d = heads * hd;
  const double scale = double(p.in(1, 8)) / 8;
  Input x = fused ? make(p, {batch, t, 3 * d}, dt) : make(p, {batch, t, t}, dt);
  x.t.requires_grad_();
  std::ostringstream args;
  args << " heads " << heads << " scale " << scale << (causal ? " causal" : "");
  const std::string what =
      describe(fused ? "self_attention" : "attention_scores_softmax", dt, false, {&x}) + args.str();
  const Tensor y =
      fused ? F::self_attention(x.t, heads, scale, causal) : F::attention_scores_softmax(x.t, scale, causal);
  const int64_t nh = fused ? heads : 1, w = fused ? 3 * d : t;
  // Element (b, i, c) of x; for the fused op q, k, v of head h at column l.
  auto X = [&](int64_t b, int64_t i, int64_t c) { return x.v[size_t((b * t + i) * w + c)]; };
  auto Q = [&](int64_t b, int64_t h, int64_t i, int64_t l) { return X(b, i, h * hd + l); };
  auto K = [&](int64_t b, int64_t h, int64_t j, int64_t l) { return X(b, j, d + h * hd + l); };
  auto V = [&](int64_t b, int64_t h, int64_t j, int64_t l) { return X(b, j, 2 * d + h * hd + l); };
  // P [b, h, i, j] and how far each probability's error grows with its score's (1 + |terms| of scores).
  std::vector<double> prob(size_t(batch * nh * t * t)), grow(prob.size());
  auto at = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    return size_t(((b * nh + h) * t + i) * t + j);
  };
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> score(static_cast<size_t>(t)), sabs(static_cast<size_t>(t));
        double mx = -INFINITY, smax = 0, z = 0;
        for (int64_t j = 0; j < t; ++j) {
          double sv = 0, sa = 0;
          if (fused)
            for (int64_t l = 0; l < hd; ++l)
              sv += Q(b, h, i, l) * K(b, h, j, l), sa += std::fabs(Q(b, h, i, l) * K(b, h, j, l));
          else
            sv = X(b, i, j), sa = std::fabs(sv);
          score[size_t(j)] = scale * sv, sabs[size_t(j)] = scale * sa;
          if (!(causal && j > i)) mx = std::max(mx, score[size_t(j)]), smax = std::max(smax, sabs[size_t(j)]);
        }
        for (int64_t j = 0; j < t; ++j) z += causal && j > i ? 0.0 : std::exp(score[size_t(j)] - mx);
        for (int64_t j = 0; j < t; ++j) {
          prob[at(b, h, i, j)] = causal && j > i ? 0.0 : std::exp(score[size_t(j)] - mx) / z;
          grow[at(b, h, i, j)] = 1 + sabs[size_t(j)] + smax + double(t);
        }
      }
  const double uc = unit_roundoff(dt == DType::F64 ? DType::F64 : DType::F32), uo = unit_roundoff(dt);
  const double len = double(hd + t + 8);
  const Input r = [&] {
    if (fused) {
      Want want(batch * t * d);
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t h = 0; h < nh; ++h)
          for (int64_t i = 0; i < t; ++i)
            for (int64_t l = 0; l < hd; ++l) {
              double sum = 0, mag = 0;
              for (int64_t j = 0; j < t; ++j)
                sum += prob[at(b, h, i, j)] * V(b, h, j, l),
                    mag += prob[at(b, h, i, j)] * std::fabs(V(b, h, j, l)) * grow[at(b, h, i, j)];
              want.set((b * t + i) * d + h * hd + l, sum, mag);
              want.rmag[size_t((b * t + i) * d + h * hd + l)] = mag;  // P may be rounded to the dtype
            }
      expect(what, y, {batch, t, d}, dt, want, len, uc, uo);
    } else {
      Want want(batch * t * t);
      for (int64_t e = 0; e < batch * t * t; ++e)
        want.set(e, prob[size_t(e)], prob[size_t(e)] * grow[size_t(e)]);
      expect(what, y, {batch, t, t}, dt, want, len, uc, uo);
    }
    return seed_for(p, y);
  }();
  backward_with(y, r);
  // d P, then d S = P (d P - sum_j P d P) (scaled back), then d q, d k, d v (or d scores).
  Want dx(batch * t * w);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> dp(static_cast<size_t>(t)), dpmag(static_cast<size_t>(t));
        double rowdot = 0, rowmag = 0;
        for (int64_t j = 0; j < t; ++j) {
          if (fused)
            for (int64_t l = 0; l < hd; ++l) {
              const double g = r.v[size_t((b * t + i) * d + h * hd + l)];
              dp[size_t(j)] += g * V(b, h, j, l), dpmag[size_t(j)] += std::fabs(g * V(b, h, j, l));
            }
          else
            dp[size_t(j)] = r.v[size_t((b * t + i) * t + j)], dpmag[size_t(j)] = std::fabs(dp[size_t(j)]);
          rowdot += prob[at(b, h, i, j)] * dp[size_t(j)], rowmag += prob[at(b, h, i, j)] * dpmag[size_t(j)];
        }
        for (int64_t j = 0; j < t; ++j) {
          const double pij = prob[at(b, h, i, j)], g = grow[at(b, h, i, j)];
          const double ds = pij * (dp[size_t(j)] - rowdot), dsmag = pij * (dpmag[size_t(j)] + rowmag) * g;
          if (!fused) {
            const size_t e = size_t((b * t + i) * t + j);
            dx.v[e] = scale * ds, dx.mag[e] = scale * dsmag;
            continue;
          }
          for (int64_t l = 0; l < hd; ++l) {
            const size_t qe = size_t((b * t + i) * w + h * hd + l),
                         ke = size_t((b * t + j) * w + d + h * hd + l),
                         ve = size_t((b * t + j) * w + 2 * d + h * hd + l);
            const double g_il = r.v[size_t((b * t + i) * d + h * hd + l)];
            dx.v[qe] += scale * ds * K(b, h, j, l), dx.mag[qe] += scale * dsmag * std::fabs(K(b, h, j, l));
            dx.v[ke] += scale * ds * Q(b, h, i, l), dx.mag[ke] += scale * dsmag * std::fabs(Q(b, h, i, l));
            dx.v[ve] += pij * g_il, dx.mag[ve] += pij * std::fabs(g_il) * g;
          }
        }
      }
  dx.rmag = dx.mag;
  expect(what + " d x", x.t.grad(), x.sizes, dt, dx, len, uc, uo);
}

// F::cross_entropy of logits [N, C] against targets (one class ignored or none, label smoothing or none),
// each reduction; with the gradient.
void run_cross_entropy(Program& p) {
  const DType dt = kFloating[p.in(0, 3)];
  const int reduction = int(p.in(0, 2));  // none, mean, sum
  const double smoothing = p.in(0, 2) == 0 ? double(p.in(1, 4)) / 8 : 0.0;
  const bool ignore = p.in(0, 2) == 0;
  const int64_t rows = size_of(p, 1, 9, 80), c = size_of(p, 1, 12, 130);
  const int64_t ignore_index = ignore ? p.in(0, c - 1) : -100;
  std::vector<int64_t> target(static_cast<size_t>(rows));
  for (int64_t& t : target) t = p.in(0, c - 1);
  Input x = make(p, {rows, c}, dt);
  x.t.requires_grad_();
  const F::Reduction reductions[] = {F::Reduction::None, F::Reduction::Mean, F::Reduction::Sum};
  std::ostringstream args;
  args << " reduction " << reduction << " ignore_index " << ignore_index << " label_smoothing " << smoothing;
  const std::string what = describe("cross_entropy", dt, false, {&x}) + args.str();
  const Tensor y = F::cross_entropy(x.t, tensor<int64_t>(target, Shape({rows})), reductions[reduction],
                                    ignore_index, smoothing);
  std::vector<double> loss(static_cast<size_t>(rows)), mag(static_cast<size_t>(rows)), prob(x.v.size());
  int64_t valid = 0;
  for (int64_t i = 0; i < rows; ++i) {
    double mx = -INFINITY, z = 0, mean = 0, big = 0;
    for (int64_t j = 0; j < c; ++j) {
      const double v = x.v[size_t(i * c + j)];
      mx = std::max(mx, v), mean += v / double(c), big = std::max(big, std::fabs(v));
    }
    for (int64_t j = 0; j < c; ++j) z += std::exp(x.v[size_t(i * c + j)] - mx);
    for (int64_t j = 0; j < c; ++j) prob[size_t(i * c + j)] = std::exp(x.v[size_t(i * c + j)] - mx) / z;
    const double lse = mx + std::log(z);
    if (target[size_t(i)] == ignore_index) continue;
    ++valid;
    loss[size_t(i)] =
        (1 - smoothing) * (lse - x.v[size_t(i * c + target[size_t(i)])]) + smoothing * (lse - mean);
    mag[size_t(i)] = 2 * big + std::log(z) + 1;
  }
  const double uc = unit_roundoff(dt == DType::F64 ? DType::F64 : DType::F32), uo = unit_roundoff(dt);
  double total = 0, total_mag = 0;
  for (int64_t i = 0; i < rows; ++i) total += loss[size_t(i)], total_mag += mag[size_t(i)];
  const double divisor = reduction == 1 ? double(valid) : 1.0;
  if (reduction == 0) {
    Want want(rows);
    for (int64_t i = 0; i < rows; ++i) want.set(i, loss[size_t(i)], mag[size_t(i)]);
    expect(what, y, {rows}, dt, want, double(c + 8), uc, uo);
  } else {
    Want want(1);
    want.set(0, total / divisor, total_mag / divisor);  // 0 / 0 (every row ignored): NaN
    expect(what, y, {}, dt, want, double(c + rows + 8), uc, uo);
  }
  const Input r = seed_for(p, y);
  backward_with(y, r);
  Want dx(rows * c);
  for (int64_t i = 0; i < rows; ++i) {
    const double g = target[size_t(i)] == ignore_index ? 0.0 : r.v[size_t(reduction == 0 ? i : 0)] / divisor;
    for (int64_t j = 0; j < c; ++j) {
      const size_t e = size_t(i * c + j);
      const double onehot = j == target[size_t(i)] ? 1 - smoothing : 0.0;
      dx.set(int64_t(e), g * (prob[e] - onehot - smoothing / double(c)),
             std::fabs(g) * (prob[e] + onehot + smoothing / double(c)));
      dx.rmag[e] = dx.mag[e];
    }
  }
  expect(what + " d x", x.t.grad(), {rows, c}, dt, dx, double(c + 8), uc, uo);
}

// F::embedding of integer indices (1 or 2 dims, padding_idx or none) into a weight [V, D]; with the
// weight's gradient, which sums the rows of d y at each index (Note [16-bit index gradients]).
void run_embedding(Program& p) {
  const DType dt = kFloating[p.in(0, 3)];
  const int64_t v = size_of(p, 1, 12, 100), d = size_of(p, 0, 12, 130);
  const bool with_pad = p.in(0, 2) == 0;
  const int64_t pad = with_pad ? p.in(0, v - 1) : -1;
  std::vector<int64_t> isizes{size_of(p, 0, 9, 300)};
  if (p.in(0, 1) == 1) isizes.push_back(p.in(1, 4));
  std::vector<int64_t> index(static_cast<size_t>(numel_of(isizes)));
  for (int64_t& i : index) i = p.in(0, v - 1);
  Input w = make(p, {v, d}, dt);
  w.t.requires_grad_();
  const std::string what = describe("embedding", dt, false, {&w}) + " index " + shape_str(Shape(isizes)) +
                           (with_pad ? " padding_idx " + std::to_string(pad) : "");
  const Tensor y = F::embedding(tensor<int64_t>(index, Shape(isizes)), w.t,
                                with_pad ? std::optional<int64_t>(pad) : std::nullopt);
  const int64_t n = int64_t(index.size());
  Want want(n * d);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) want.set(i * d + j, w.v[size_t(index[size_t(i)] * d + j)], 0);
  std::vector<int64_t> ys = isizes;
  ys.push_back(d);
  const double uc = unit_roundoff(dt == DType::F64 ? DType::F64 : DType::F32), uo = unit_roundoff(dt);
  expect(what, y, ys, dt, want, 0, uc, uo);
  const Input r = seed_for(p, y);
  backward_with(y, r);
  Want dw(v * d);
  std::vector<int64_t> count(static_cast<size_t>(v));
  for (int64_t i = 0; i < n; ++i) {
    if (index[size_t(i)] == pad) continue;
    ++count[size_t(index[size_t(i)])];
    for (int64_t j = 0; j < d; ++j) {
      const size_t e = size_t(index[size_t(i)] * d + j);
      dw.v[e] += r.v[size_t(i * d + j)], dw.mag[e] += std::fabs(r.v[size_t(i * d + j)]);
    }
  }
  for (size_t e = 0; e < dw.v.size(); ++e) dw.rmag[e] = std::fabs(dw.v[e]);
  int64_t most = 0;
  for (const int64_t k : count) most = std::max(most, k);
  expect(what + " d weight", w.t.grad(), {v, d}, dt, dw, double(most), uc, uo);
}

// F::batch_norm in training over x [N, C, H, W] (weight and bias or none), the running statistics updated;
// with the gradient of x. Per channel it is layer_norm_ref's computation over the channel's N H W values.
void run_batch_norm(Program& p) {
  const DType dt = kFloating[p.in(0, 3)];
  const bool affine = p.in(0, 1) == 1, grad = p.in(0, 1) == 1;
  const int64_t n = p.in(1, 4), c = size_of(p, 1, 6, 40), h = p.in(1, 6), w = p.in(1, 6);
  Input x = make(p, {n, c, h, w}, dt);
  Input wt = affine ? make(p, {c}, dt) : Input(), b = affine ? make(p, {c}, dt) : Input();
  if (grad) x.t.requires_grad_();
  const DType stats = dt == DType::F64 ? DType::F64 : DType::F32;
  const Tensor running_mean = zeros({c}, stats), running_var = ones({c}, stats);
  const std::string what = describe("batch_norm", dt, false, {&x}) + (affine ? " affine" : "");
  const Tensor y = F::batch_norm(x.t, running_mean, running_var, wt.t, b.t, true, 0.1, 1e-5);
  const int64_t plane = h * w, len = n * plane;
  // The channels' values as rows [C, N H W], and back.
  std::vector<double> rows(x.v.size());
  auto flat = [&](int64_t ch, int64_t k) { return size_t(((k / plane) * c + ch) * plane + k % plane); };
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t k = 0; k < len; ++k) rows[size_t(ch * len + k)] = x.v[flat(ch, k)];
  const LayerNormRef ref = layer_norm_ref(rows, c, len, {}, {}, 1e-5);
  Want want(n * c * plane);
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t k = 0; k < len; ++k) {
      const double wv = affine ? wt.v[size_t(ch)] : 1.0, bv = affine ? b.v[size_t(ch)] : 0.0;
      const size_t e = size_t(ch * len + k);
      want.set(int64_t(flat(ch, k)), ref.xhat[e] * wv + bv,
               ref.scale[size_t(ch)] * std::fabs(wv) + std::fabs(bv));
    }
  const double uc = unit_roundoff(stats), uo = unit_roundoff(dt);
  expect(what, y, {n, c, h, w}, dt, want, double(len), uc, uo);
  // The running statistics: 0.9 r + 0.1 s, with the unbiased variance.
  Want mean(c), var(c);
  for (int64_t ch = 0; ch < c; ++ch) {
    double m = 0, v = 0, mag = 0;
    for (int64_t k = 0; k < len; ++k)
      m += rows[size_t(ch * len + k)] / double(len), mag += std::fabs(rows[size_t(ch * len + k)]);
    for (int64_t k = 0; k < len; ++k)
      v += (rows[size_t(ch * len + k)] - m) * (rows[size_t(ch * len + k)] - m);
    v /= double(len > 1 ? len - 1 : 1);
    mean.set(ch, 0.1 * m, mag / double(len));
    var.set(ch, 0.9 + 0.1 * v, 1 + v + mag * mag / double(len));
  }
  expect(what + " running_mean", running_mean, {c}, stats, mean, double(len), uc, uc);
  expect(what + " running_var", running_var, {c}, stats, var, double(len), uc, uc);
  if (!grad) return;
  const Input r = seed_for(p, y);
  backward_with(y, r);
  std::vector<double> g(rows.size());
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t k = 0; k < len; ++k)
      g[size_t(ch * len + k)] = r.v[flat(ch, k)] * (affine ? wt.v[size_t(ch)] : 1.0);
  const Want d_rows = layer_norm_dx(ref, g, c, len);
  Want dx(n * c * plane);
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t k = 0; k < len; ++k) {
      const size_t e = size_t(ch * len + k), o = flat(ch, k);
      dx.v[o] = d_rows.v[e], dx.mag[o] = d_rows.mag[e], dx.rmag[o] = d_rows.rmag[e];
    }
  expect(what + " d x", x.t.grad(), {n, c, h, w}, dt, dx, double(len), uc, uo);
}

// The unary math ops against std's functions in f64 (their vector forms approximate: within the bound's
// 8 (len + 2) ulps, len 8); the smooth ones with their gradients too.
void run_unary(Program& p) {
  const DType dt = kFloating[p.in(0, 3)];
  const int op = int(p.in(0, 11));
  const std::vector<int64_t> sizes = sizes_1_to_3(p);
  Input x = make(p, sizes, dt);
  const bool smooth = op < 9, grad = smooth && p.in(0, 1) == 1;
  if (grad) x.t.requires_grad_();
  const char* names[] = {"exp", "tanh", "sigmoid", "silu", "gelu", "gelu_tanh",
                         "sin", "cos",  "erf",     "log",  "sqrt", "rsqrt"};
  const std::string what = describe(names[op], dt, false, {&x});
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  auto f = [&](double v) {
    switch (op) {
      case 0:
        return std::exp(v);
      case 1:
        return std::tanh(v);
      case 2:
        return sig(v);
      case 3:
        return v * sig(v);
      case 4:
        return gelu(v, false);
      case 5:
        return gelu(v, true);
      case 6:
        return std::sin(v);
      case 7:
        return std::cos(v);
      case 8:
        return std::erf(v);
      case 9:
        return std::log(v);
      case 10:
        return std::sqrt(v);
      default:
        return 1 / std::sqrt(v);
    }
  };
  auto df = [&](double v) {
    switch (op) {
      case 0:
        return std::exp(v);
      case 1:
        return 1 - std::tanh(v) * std::tanh(v);
      case 2:
        return sig(v) * (1 - sig(v));
      case 3:
        return sig(v) * (1 + v * (1 - sig(v)));
      case 4:
        return gelu_grad(v, false);
      case 5:
        return gelu_grad(v, true);
      case 6:
        return std::cos(v);
      case 7:
        return -std::sin(v);
      default:
        return 2 / std::sqrt(std::numbers::pi) * std::exp(-v * v);
    }
  };
  const Tensor y = op == 0    ? x.t.exp()
                   : op == 1  ? x.t.tanh()
                   : op == 2  ? x.t.sigmoid()
                   : op == 3  ? x.t.silu()
                   : op == 4  ? x.t.gelu()
                   : op == 5  ? x.t.gelu_tanh()
                   : op == 6  ? x.t.sin()
                   : op == 7  ? x.t.cos()
                   : op == 8  ? x.t.erf()
                   : op == 9  ? x.t.log()
                   : op == 10 ? x.t.sqrt()
                              : x.t.rsqrt();
  const int64_t n = numel_of(sizes);
  Want want(n);
  for (int64_t e = 0; e < n; ++e) {
    const double v = x.v[size_t(e)];
    // The magnitude: the value and how an input's rounding moves it (|x f'(x)|, for the smooth ones).
    want.set(e, f(v), std::fabs(f(v)) + (smooth ? std::fabs(v * df(v)) : 0.0));
  }
  const double uc = unit_roundoff(dt == DType::F64 ? DType::F64 : DType::F32), uo = unit_roundoff(dt);
  expect(what, y, sizes, dt, want, 8, uc, uo);
  if (!grad) return;
  const Input r = seed_for(p, y);
  backward_with(y, r);
  Want dx(n);
  for (int64_t e = 0; e < n; ++e) {
    const double v = x.v[size_t(e)], k = df(v);
    // The backward may use y (rounded to the dtype) in its formula: sigmoid's s (1 - s), tanh's 1 - y^2.
    dx.set(e, r.v[size_t(e)] * k, std::fabs(r.v[size_t(e)]) * (std::fabs(k) + std::fabs(f(v)) + 1));
    dx.rmag[size_t(e)] = dx.mag[size_t(e)];
  }
  expect(what + " d x", x.t.grad(), sizes, dt, dx, 8, uc, uo);
}

// nn::QuantizedLinear (int8 weight rows, the input quantised per batch or with a fixed scale and zero point),
// forward or forward_relu, of x [M, K] (or [2, M, K]) f32. The input's codes and the weight's come from the
// library (their choice and rounding have tests of their own); the GEMM over them is checked: acc = sum (code
// - zero point) w_code is exact in int32, and y = acc input_scale weight_scale + bias within f32's rounding.
void run_quant_linear(Program& p) {
  const bool fixed = p.in(0, 2) == 0, relu = p.in(0, 1) == 1, with_bias = p.in(0, 1) == 1;
  const bool three_d = p.in(0, 4) == 0;
  const int64_t m = size_of(p, 0, 9, 80), k = size_of(p, 1, 12, 300), n = size_of(p, 1, 9, 80);
  const float in_scale = float(p.in(1, 16)) / 64;
  const int32_t in_zero_point = int32_t(p.in(0, nn::quant::kInputQMax));
  std::vector<int64_t> xs{m, k};
  if (three_d) xs.insert(xs.begin(), 2);
  const Input x = make(p, xs, DType::F32), w = make(p, {n, k}, DType::F32, false);
  const Input b = with_bias ? make(p, {n}, DType::F32, false) : Input();
  nn::QuantizedLinear q =
      fixed ? nn::QuantizedLinear(w.t, b.t, in_scale, in_zero_point) : nn::QuantizedLinear(w.t, b.t);
  const std::string what =
      describe(relu ? "QuantizedLinear relu" : "QuantizedLinear", DType::F32, false, {&x}) +
      (fixed ? " fixed input scale" : "") + (with_bias ? " bias" : "");
  const Tensor y = relu ? q->forward_relu(x.t) : q->forward(x.t);
  const int64_t rows = three_d ? 2 * m : m;
  std::vector<float> xf(x.v.begin(), x.v.end());
  const nn::quant::InputQuant qp = fixed ? nn::quant::InputQuant{in_scale, in_zero_point}
                                         : nn::quant::choose_input_qparams(xf.data(), int64_t(xf.size()));
  std::vector<uint8_t> codes(xf.size());
  nn::quant::quantize_input(xf.data(), int64_t(xf.size()), qp, codes.data());
  const std::vector<double> wq = [&] {  // the int8 codes, held in a U8 tensor
    std::vector<double> v;
    for (const uint8_t c : q->weight.contiguous().to_vector<uint8_t>()) v.push_back(double(int8_t(c)));
    return v;
  }();
  const std::vector<double> ws = read(q->weight_scale);
  std::vector<int64_t> ys = xs;
  ys.back() = n;
  Want want(rows * n);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) {
      int64_t acc = 0;
      for (int64_t l = 0; l < k; ++l)
        acc += (int64_t(codes[size_t(i * k + l)]) - qp.zero_point) * int64_t(wq[size_t(j * k + l)]);
      const double scale = double(float(qp.scale * float(ws[size_t(j)])));  // the layer's f32 product
      const double bias = with_bias ? b.v[size_t(j)] : 0.0, v = double(acc) * scale + bias;
      want.set(i * n + j, relu ? std::max(v, 0.0) : v, 0);
      want.rmag[size_t(i * n + j)] = std::fabs(double(acc) * scale) + std::fabs(bias);
    }
  expect(what, y, ys, DType::F32, want, 0, 0, 2 * unit_roundoff(DType::F32));
}

// nn::QuantizedConv2d (groups 1; stride, padding, dilation; dynamic or fixed input quantisation), forward,
// forward_relu or forward_relu_pool2, of x [N, C, H, W] f32: as run_quant_linear, over the library's codes
// (the padding is the zero point: it adds nothing).
void run_quant_conv(Program& p) {
  const bool fixed = p.in(0, 2) == 0, with_bias = p.in(0, 1) == 1;
  const int form = int(p.in(0, 2));  // 0 forward, 1 forward_relu, 2 forward_relu_pool2
  const int64_t batch = p.in(1, 3), c = size_of(p, 1, 4, 20), o = size_of(p, 1, 4, 20);
  const int64_t kh = p.in(1, 3), kw = p.in(1, 3), sh = p.in(1, 2), sw = p.in(1, 2);
  const int64_t dh = p.in(0, 4) == 0 ? 2 : 1, dw_ = p.in(0, 4) == 0 ? 2 : 1;
  const int64_t ph = p.in(0, kh / 2 * dh), pw = p.in(0, kw / 2 * dw_);
  const int64_t ekh = dh * (kh - 1) + 1, ekw = dw_ * (kw - 1) + 1;
  const int64_t h = std::max<int64_t>(1, ekh - 2 * ph) + (form == 2 ? sh : 0) + p.in(0, 8);
  const int64_t wd = std::max<int64_t>(1, ekw - 2 * pw) + (form == 2 ? sw : 0) + p.in(0, 8);
  const int64_t oh = (h + 2 * ph - ekh) / sh + 1, ow = (wd + 2 * pw - ekw) / sw + 1;
  const float in_scale = float(p.in(1, 16)) / 64;
  const int32_t in_zero_point = int32_t(p.in(0, nn::quant::kInputQMax));
  const Input x = make(p, {batch, c, h, wd}, DType::F32), w = make(p, {o, c, kh, kw}, DType::F32, false);
  const Input b = with_bias ? make(p, {o}, DType::F32, false) : Input();
  const nn::Conv2dOptions options = nn::Conv2dOptions(c, o, Size2(kh, kw))
                                        .stride(Size2(sh, sw))
                                        .padding(Size2(ph, pw))
                                        .dilation(Size2(dh, dw_))
                                        .bias(with_bias);
  const nn::quant::InputQuant fixed_qp{in_scale, in_zero_point};
  nn::QuantizedConv2d q(options, w.t, b.t, fixed ? &fixed_qp : nullptr);
  std::ostringstream args;
  args << " stride " << sh << "," << sw << " padding " << ph << "," << pw << " dilation " << dh << "," << dw_
       << (fixed ? " fixed input scale" : "") << (with_bias ? " bias" : "");
  const char* names[] = {"QuantizedConv2d", "QuantizedConv2d relu", "QuantizedConv2d relu pool2"};
  const std::string what = describe(names[form], DType::F32, false, {&x, &w}) + args.str();
  const Tensor y = form == 0   ? q->forward(x.t)
                   : form == 1 ? q->forward_relu(x.t)
                               : q->forward_relu_pool2(x.t);
  std::vector<float> xf(x.v.begin(), x.v.end());
  const nn::quant::InputQuant qp =
      fixed ? fixed_qp : nn::quant::choose_input_qparams(xf.data(), int64_t(xf.size()));
  std::vector<uint8_t> codes(xf.size());
  nn::quant::quantize_input(xf.data(), int64_t(xf.size()), qp, codes.data());
  std::vector<double> wq;
  for (const uint8_t code : q->weight.contiguous().to_vector<uint8_t>()) wq.push_back(double(int8_t(code)));
  const std::vector<double> ws = read(q->weight_scale);
  Want conv(batch * o * oh * ow);
  for (int64_t nn_ = 0; nn_ < batch; ++nn_)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          int64_t acc = 0;
          for (int64_t ci = 0; ci < c; ++ci)
            for (int64_t u = 0; u < kh; ++u)
              for (int64_t v = 0; v < kw; ++v) {
                const int64_t r = i * sh - ph + u * dh, s2 = j * sw - pw + v * dw_;
                if (r < 0 || r >= h || s2 < 0 || s2 >= wd) continue;
                const int64_t code = codes[size_t(((nn_ * c + ci) * h + r) * wd + s2)];
                acc += (code - qp.zero_point) * int64_t(wq[size_t(((oc * c + ci) * kh + u) * kw + v)]);
              }
          const double scale = double(float(qp.scale * float(ws[size_t(oc)])));
          const double bias = with_bias ? b.v[size_t(oc)] : 0.0, value = double(acc) * scale + bias;
          const int64_t e = ((nn_ * o + oc) * oh + i) * ow + j;
          conv.set(e, form == 0 ? value : std::max(value, 0.0), 0);
          conv.rmag[size_t(e)] = std::fabs(double(acc) * scale) + std::fabs(bias);
        }
  const double uo = 2 * unit_roundoff(DType::F32);
  if (form != 2) return expect(what, y, {batch, o, oh, ow}, DType::F32, conv, 0, 0, uo);
  expect(what, y, {batch, o, oh / 2, ow / 2}, DType::F32, pool2_of(conv, batch * o, oh, ow), 0, 0, uo);
}

// ---- Elementwise and copies ----

// a op b with b broadcast (some of its dims 1 or missing), out of place or in place into a's view.
void run_binary(Program& p) {
  const DType dt = kFloating[p.in(0, 3)];
  const int op = int(p.in(0, 5));                   // add sub mul div maximum minimum
  const bool in_place = op < 3 && p.in(0, 2) == 0;  // (a quotient may be NaN, which the padding check counts)
  const std::vector<int64_t> as = sizes_1_to_3(p);
  std::vector<int64_t> bs = as;
  for (int64_t& s : bs)
    if (p.in(0, 2) == 0) s = 1;
  const int64_t drop = p.in(0, int64_t(bs.size()));  // leading dims b leaves out
  bs.erase(bs.begin(), bs.begin() + drop);
  Input a = make(p, as, dt), b = make(p, bs, dt);
  const char* names[] = {"add", "sub", "mul", "div", "maximum", "minimum"};
  const std::string what = describe(names[op], dt, false, {&a, &b}) + (in_place ? " in place" : "");
  auto f = [&](double x, double y) {
    switch (op) {
      case 0:
        return x + y;
      case 1:
        return x - y;
      case 2:
        return x * y;
      case 3:
        return x / y;
      case 4:
        return std::max(x, y);
      default:
        return std::min(x, y);
    }
  };
  Tensor y;
  if (in_place) {
    if (op == 0) a.t.add_(b.t);
    if (op == 1) a.t.sub_(b.t);
    if (op == 2) a.t.mul_(b.t);
    y = a.t;
  } else {
    y = op == 0   ? add(a.t, b.t)
        : op == 1 ? sub(a.t, b.t)
        : op == 2 ? mul(a.t, b.t)
        : op == 3 ? div(a.t, b.t)
        : op == 4 ? maximum(a.t, b.t)
                  : minimum(a.t, b.t);
  }
  const int64_t n = numel_of(as), nd = int64_t(as.size());
  Want want(n);
  std::vector<int64_t> idx(size_t(nd), 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t be = 0;  // b's element under broadcasting
    for (int64_t d = drop; d < nd; ++d)
      be = be * bs[size_t(d - drop)] + (bs[size_t(d - drop)] == 1 ? 0 : idx[size_t(d)]);
    const double v = f(a.v[size_t(e)], b.v[size_t(be)]);
    want.set(e, v, 0);  // one correctly rounded operation: within u_o
    for (int64_t d = nd; d-- > 0;)
      if (++idx[size_t(d)] < as[size_t(d)])
        break;
      else
        idx[size_t(d)] = 0;
  }
  expect(what, y, as, dt, want, 0, 0, unit_roundoff(dt) / 2);
  if (in_place) expect_padding_kept(what, a);
}

// x.contiguous(), x.to(dtype) and copy_ of x into another view.
void run_copy(Program& p) {
  const DType dt = kFloating[p.in(0, 3)], to = kFloating[p.in(0, 3)];
  const int form = int(p.in(0, 2));
  const std::vector<int64_t> sizes = sizes_1_to_3(p);
  const Input x = make(p, sizes, dt);
  Input dst = form == 2 ? make(p, sizes, to) : Input();
  const char* names[] = {"contiguous", "to", "copy_"};
  const std::string what = describe(names[form], dt, false, {&x}) + " to " + dtype_name(to);
  Tensor y;
  if (form == 0) y = x.t.contiguous();
  if (form == 1) y = x.t.to(to);
  if (form == 2) y = dst.t.copy_(x.t);
  Want want(numel_of(sizes));
  for (size_t e = 0; e < x.v.size(); ++e) want.set(int64_t(e), x.v[e], 0);
  expect(what, y, sizes, form == 0 ? dt : to, want, 0, 0, 0);
  if (form == 0 && !y.is_contiguous())
    throw std::logic_error("kernels target: " + what + " is not contiguous");
  if (form == 2) expect_padding_kept(what, dst);
}

}  // namespace

void run_kernels(const uint8_t* data, size_t size) {
  struct Limit {  // as the ops target's: a bound on what one program may take
    int64_t before = memory::memory_limit(kCPU);
    Limit() { memory::set_memory_limit(kCPU, int64_t(256) << 20); }
    ~Limit() { memory::set_memory_limit(kCPU, before); }
  } limit;
  Program p(data, size);
  for (int s = 0; s < kMaxSteps && !p.done(); ++s) {
    try {
      switch (p.in(0, 16)) {
        case 0:
          run_matmul(p);
          break;
        case 1:
          run_linear(p);
          break;
        case 2:
          run_conv(p);
          break;
        case 3:
          run_pool(p);
          break;
        case 4:
          run_reduce(p);
          break;
        case 5:
          run_softmax(p);
          break;
        case 6:
          run_layer_norm(p);
          break;
        case 7:
          run_binary(p);
          break;
        case 8:
          run_copy(p);
          break;
        case 9:
          run_fused_linear(p);
          break;
        case 10:
          run_cross_entropy(p);
          break;
        case 11:
          run_embedding(p);
          break;
        case 12:
          run_attention(p);
          break;
        case 13:
          run_batch_norm(p);
          break;
        case 14:
          run_unary(p);
          break;
        case 15:
          run_quant_linear(p);
          break;
        default:
          run_quant_conv(p);
          break;
      }
    } catch (const Error&) {
      // A combination frugal refuses (a dtype an op does not take on the CPU): not what this target checks.
    }
  }
}

// A few programs: each op with each dtype, from a fixed stream of bytes.
void seeds_kernels(const std::string& dir) {
  for (int op = 0; op < 17; ++op)
    for (int dt = 0; dt < 4; ++dt) {
      std::string b{char(op), char(dt)};
      for (int i = 0; i < 600; ++i) b += char((op * 31 + dt * 17 + i * 29 + (i * i) % 7) % 256);
      std::ofstream(std::filesystem::path(dir) / ("op" + std::to_string(op) + "-" + std::to_string(dt)),
                    std::ios::binary)
          << b;
    }
}

}  // namespace frugal::fuzz

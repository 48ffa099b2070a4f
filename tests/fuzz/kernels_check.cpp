// The kernels fuzz target's machinery (tests/fuzz/kernels_check.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <numbers>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/fuzz/kernels_check.h"

namespace frugal::fuzz::kernels {

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

int64_t numel_of(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (const int64_t s : sizes) n *= s;
  return n;
}

std::vector<int64_t> strides_of(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> st(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) st[d - 1] = st[d] * sizes[d];
  return st;
}

Input make(Program& p, std::vector<int64_t> sizes, DType dtype, bool layouts) {
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

void expect(const std::string& what, const Tensor& got, const std::vector<int64_t>& sizes, DType dtype,
            const Want& want, double len, double u_c, double u_o, bool normwise) {
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

Input seed_for(Program& p, const Tensor& y) {
  std::vector<int64_t> sizes(y.shape().begin(), y.shape().end());
  return make(p, sizes, y.dtype(), false);
}

void backward_with(const Tensor& y, const Input& r) { mul(y, r.t).sum().backward(); }

std::vector<int64_t> sizes_1_to_3(Program& p) {
  std::vector<int64_t> s(size_t(p.in(1, 3)));
  for (int64_t& v : s) v = size_of(p, 0, 9, 100);
  return s;
}

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

double layer_norm_mag(const LayerNormRef& r, int64_t e, int64_t d, const std::vector<double>& w,
                      const std::vector<double>& b) {
  const size_t j = size_t(e % d);
  return r.scale[size_t(e / d)] * (w.empty() ? 1.0 : std::fabs(w[j])) + (b.empty() ? 0.0 : std::fabs(b[j]));
}

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

}  // namespace frugal::fuzz::kernels

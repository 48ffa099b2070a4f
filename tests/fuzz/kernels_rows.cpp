// The kernels fuzz target's row-wise and elementwise ops (tests/fuzz/kernels_target.cpp: what it checks, and
// how): reductions, softmax, layer norm, cross-entropy, embedding, unary and binary elementwise ops, copies.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "frugal.h"
#include "tests/fuzz/kernels_check.h"

namespace frugal::fuzz::kernels {

namespace {

// x of 1 to 3 dims, one dim reduced: a view of x as [outer, len, inner] around it.
struct Around {
  int64_t outer = 1, len = 1, inner = 1;
  Around(const std::vector<int64_t>& sizes, int64_t dim) {
    for (int64_t d = 0; d < int64_t(sizes.size()); ++d)
      (d < dim ? outer : d == dim ? len : inner) *= sizes[size_t(d)];
  }
  int64_t at(int64_t o, int64_t l, int64_t i) const { return (o * len + l) * inner + i; }
};

}  // namespace

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

}  // namespace frugal::fuzz::kernels

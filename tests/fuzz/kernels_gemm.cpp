// The kernels fuzz target's GEMM-like ops (tests/fuzz/kernels_target.cpp: what it checks, and how): matmul,
// the Linear layers and the transformer's fused ones, self-attention, and int8 quantised Linears.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "frugal.h"
#include "tests/fuzz/kernels_check.h"

namespace frugal::fuzz::kernels {

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

}  // namespace frugal::fuzz::kernels

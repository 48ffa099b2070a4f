// The kernels fuzz target's image ops (tests/fuzz/kernels_target.cpp: what it checks, and how): convolutions
// (Winograd's too), pooling, batch norm and int8 quantised convolutions.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "frugal.h"
#include "kernels/cpu/reference.h"
#include "tests/fuzz/kernels_check.h"

namespace frugal::fuzz::kernels {

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

}  // namespace frugal::fuzz::kernels

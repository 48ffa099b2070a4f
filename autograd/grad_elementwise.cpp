// Differentiable elementwise ops: forward through core (frugal::ops) and, beside each, its backward rule,
// written with the same differentiable ops. g is the gradient of the output.
#include <cmath>

#include "autograd/autocast_casts.h"
#include "autograd/functions.h"
#include "core/op_table.h"

namespace frugal {

using autograd::autocast_f32;
using autograd::forward_only;
using autograd::Grads;
using autograd::Node;
using autograd::recorded;

namespace {

Tensor zeros_as(const Tensor& g) { return zeros_like(g); }
Tensor one_minus(const Tensor& t) { return 1.0 - t; }

// Records a one-input op y = f(x) whose rule reads the saved tensors (x and/or y, by `save`).
enum class Save { None, Input, Output, Both };
template <typename Rule>
Tensor unary(const char* name, const Tensor& x, Tensor y, Save save, Rule rule) {
  if (Node* n = recorded(name, {&x}, y)) {
    if (save == Save::Input || save == Save::Both) n->save(x);
    if (save == Save::Output || save == Save::Both) n->save_output(y);
    n->backward = [rule](const Grads& s, const Tensor& g) -> Grads { return {rule(s, g)}; };
  }
  return y;
}

constexpr double kInvSqrt2Pi = 0.39894228040143267794;

}  // namespace

Tensor neg(const Tensor& x) {
  return unary("neg", x, forward_only([&] { return ops::neg(x); }), Save::None,
               [](const Grads&, const Tensor& g) { return neg(g); });
}
Tensor abs(const Tensor& x) {
  return unary("abs", x, forward_only([&] { return ops::abs(x); }), Save::Input,
               [](const Grads& s, const Tensor& g) {
                 return where(gt(s[0], 0.0), g, where(lt(s[0], 0.0), neg(g), zeros_as(g)));
               });
}
// exp, log, rsqrt and pow run in f32 under autocast (Note [autocast policy], amp/autocast.h).
Tensor exp(const Tensor& x_in) {
  const Tensor x = autocast_f32(x_in);
  return unary("exp", x, forward_only([&] { return ops::exp(x); }), Save::Output,
               [](const Grads& s, const Tensor& g) { return mul(g, s[0]); });
}
Tensor log(const Tensor& x_in) {
  const Tensor x = autocast_f32(x_in);
  return unary("log", x, forward_only([&] { return ops::log(x); }), Save::Input,
               [](const Grads& s, const Tensor& g) { return div(g, s[0]); });
}
Tensor sqrt(const Tensor& x) {
  return unary("sqrt", x, forward_only([&] { return ops::sqrt(x); }), Save::Output,
               [](const Grads& s, const Tensor& g) { return div(mul(g, 0.5), s[0]); });
}
Tensor rsqrt(const Tensor& x_in) {  // d x^(-1/2) = -1/2 y^3
  const Tensor x = autocast_f32(x_in);
  return unary("rsqrt", x, forward_only([&] { return ops::rsqrt(x); }), Save::Output,
               [](const Grads& s, const Tensor& g) { return mul(g, mul(pow(s[0], 3.0), -0.5)); });
}
Tensor relu(const Tensor& x) {
  return unary("relu", x, forward_only([&] { return ops::relu(x); }), Save::Output,
               [](const Grads& s, const Tensor& g) {
                 // One pass where the device has the kernel (the same values); the composite otherwise, and
                 // when the rule is itself recorded (double backward needs a differentiable form).
                 if (!autograd::grad_mode_enabled() && g.dtype() == s[0].dtype() &&
                     op_relu_backward.has(s[0].device(), s[0].dtype()))
                   return ops::relu_backward(g, s[0]);
                 return where(gt(s[0], 0.0), g, zeros_as(g));
               });
}
// gelu and gelu_tanh: one-pass backward ops (core/ops.h; first order only), tested against the gradients of
// their composite forms (tests/kernels/test_gelu.cpp).
Tensor gelu(const Tensor& x) {  // d = Phi(x) + x phi(x)
  return unary("gelu", x, forward_only([&] { return ops::gelu(x); }), Save::Input,
               [](const Grads& s, const Tensor& g) { return ops::gelu_backward(g, s[0]); });
}
Tensor gelu_tanh(const Tensor& x) {
  return unary("gelu_tanh", x, forward_only([&] { return ops::gelu_tanh(x); }), Save::Input,
               [](const Grads& s, const Tensor& g) { return ops::gelu_tanh_backward(g, s[0]); });
}
Tensor sigmoid(const Tensor& x) {
  return unary("sigmoid", x, forward_only([&] { return ops::sigmoid(x); }), Save::Output,
               [](const Grads& s, const Tensor& g) { return mul(g, mul(s[0], one_minus(s[0]))); });
}
Tensor tanh(const Tensor& x) {
  return unary("tanh", x, forward_only([&] { return ops::tanh(x); }), Save::Output,
               [](const Grads& s, const Tensor& g) { return mul(g, one_minus(mul(s[0], s[0]))); });
}
Tensor silu(const Tensor& x) {  // d = s (1 + x (1 - s)), s = sigmoid(x)
  return unary("silu", x, forward_only([&] { return ops::silu(x); }), Save::Input,
               [](const Grads& v, const Tensor& g) {
                 const Tensor s = sigmoid(v[0]);
                 return mul(g, mul(s, add(mul(v[0], one_minus(s)), 1.0)));
               });
}
Tensor erf(const Tensor& x) {  // d = 2/sqrt(pi) exp(-x^2)
  return unary("erf", x, forward_only([&] { return ops::erf(x); }), Save::Input,
               [](const Grads& s, const Tensor& g) {
                 return mul(g, mul(exp(neg(mul(s[0], s[0]))), 2 * kInvSqrt2Pi * std::sqrt(2.0)));
               });
}
Tensor clamp(const Tensor& x, Scalar min, Scalar max) {  // the gradient passes where min <= x <= max
  return unary("clamp", x, forward_only([&] { return ops::clamp(x, min, max); }), Save::Input,
               [min, max](const Grads& s, const Tensor& g) {
                 return where(lt(s[0], min), zeros_as(g), where(gt(s[0], max), zeros_as(g), g));
               });
}
Tensor clamp_min(const Tensor& x, Scalar min) { return clamp(x, min, INFINITY); }
Tensor clamp_max(const Tensor& x, Scalar max) { return clamp(x, -INFINITY, max); }

namespace {
// What a two-input rule reads: nothing (add, sub), the inputs, or the inputs and the output (pow).
enum class Keep { None, Inputs, InputsAndOutput };

// Records a two-input op; the rule gets (a, b, y) (undefined where not kept) and returns both gradients at
// the output's shape; they are then reduced to each input's shape and dtype.
template <typename Rule>
Tensor binary(const char* name, const Tensor& a, const Tensor& b, Tensor y, Keep keep, Rule rule) {
  if (Node* n = recorded(name, {&a, &b}, y)) {
    if (keep != Keep::None) {
      n->save(a);
      n->save(b);
    }
    if (keep == Keep::InputsAndOutput) n->save_output(y);
    n->backward = [rule, sa = a.shape(), sb = b.shape(), ta = a.dtype(), tb = b.dtype()](
                      const Grads& s, const Tensor& g) -> Grads {
      auto at = [&](size_t i) { return i < s.size() ? s[i] : Tensor(); };
      auto [da, db] = rule(at(0), at(1), at(2), g);
      return {da.defined() ? autograd::sum_to(da, sa).to(ta) : da,
              db.defined() ? autograd::sum_to(db, sb).to(tb) : db};
    };
  }
  return y;
}
using Pair = std::pair<Tensor, Tensor>;
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return binary("add", a, b, forward_only([&] { return ops::add(a, b); }), Keep::None,
                [](const Tensor&, const Tensor&, const Tensor&, const Tensor& g) {
                  return Pair{g, g};
                });
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary("sub", a, b, forward_only([&] { return ops::sub(a, b); }), Keep::None,
                [](const Tensor&, const Tensor&, const Tensor&, const Tensor& g) {
                  return Pair{g, neg(g)};
                });
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary("mul", a, b, forward_only([&] { return ops::mul(a, b); }), Keep::Inputs,
                [](const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g) {
                  return Pair{mul(g, b), mul(g, a)};
                });
}
Tensor div(const Tensor& a, const Tensor& b) {
  return binary("div", a, b, forward_only([&] { return ops::div(a, b); }), Keep::Inputs,
                [](const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g) {
                  const Tensor ga = div(g, b);
                  return Pair{ga, neg(div(mul(ga, a), b))};
                });
}
// da = b a^(b-1), taken as 0 where b = 0 (a^0 is constant; 0 * 0^-1 would give nan at a = 0; PyTorch's rule);
// db = y log(a), taken as 0 where a = 0.
Tensor pow(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = autocast_f32(a_in), b = autocast_f32(b_in);
  return binary("pow", a, b, forward_only([&] { return ops::pow(a, b); }), Keep::InputsAndOutput,
                [](const Tensor& a, const Tensor& b, const Tensor& y, const Tensor& g) {
                  const Tensor da = where(eq(b, 0.0), zeros_as(g), mul(g, mul(b, pow(a, sub(b, 1.0)))));
                  const Tensor db = where(eq(a, 0.0), zeros_as(g), mul(g, mul(y, log(a))));
                  return Pair{da, db};
                });
}
// Ties split the gradient evenly, as PyTorch does.
Tensor maximum(const Tensor& a, const Tensor& b) {
  return binary("maximum", a, b, forward_only([&] { return ops::maximum(a, b); }), Keep::Inputs,
                [](const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g) {
                  const Tensor half = mul(g, 0.5), z = zeros_as(g);
                  return Pair{where(gt(a, b), g, where(eq(a, b), half, z)),
                              where(lt(a, b), g, where(eq(a, b), half, z))};
                });
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return binary("minimum", a, b, forward_only([&] { return ops::minimum(a, b); }), Keep::Inputs,
                [](const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g) {
                  const Tensor half = mul(g, 0.5), z = zeros_as(g);
                  return Pair{where(lt(a, b), g, where(eq(a, b), half, z)),
                              where(gt(a, b), g, where(eq(a, b), half, z))};
                });
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor y = forward_only([&] { return ops::where(cond, a, b); });
  if (Node* n = recorded("where", {&a, &b}, y)) {
    n->save(cond);
    n->backward = [sa = a.shape(), sb = b.shape(), ta = a.dtype(), tb = b.dtype()](const Grads& s,
                                                                                   const Tensor& g) -> Grads {
      const Tensor z = zeros_as(g);
      return {autograd::sum_to(where(s[0], g, z), sa).to(ta), autograd::sum_to(where(s[0], z, g), sb).to(tb)};
    };
  }
  return y;
}

// A Scalar operand is a 0-d tensor that needs no gradient.
Tensor add(const Tensor& a, Scalar b) { return add(a, ops::wrap_scalar(a, b)); }
Tensor sub(const Tensor& a, Scalar b) { return sub(a, ops::wrap_scalar(a, b)); }
Tensor mul(const Tensor& a, Scalar b) { return mul(a, ops::wrap_scalar(a, b)); }
Tensor div(const Tensor& a, Scalar b) { return div(a, ops::wrap_scalar(a, b)); }
Tensor pow(const Tensor& a, Scalar b) { return pow(a, ops::wrap_scalar(a, b)); }
Tensor maximum(const Tensor& a, Scalar b) { return maximum(a, ops::wrap_scalar(a, b)); }
Tensor minimum(const Tensor& a, Scalar b) { return minimum(a, ops::wrap_scalar(a, b)); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
Tensor operator+(Scalar a, const Tensor& b) { return add(b, a); }
Tensor operator-(Scalar a, const Tensor& b) { return sub(ops::wrap_scalar(b, a), b); }
Tensor operator*(Scalar a, const Tensor& b) { return mul(b, a); }
Tensor operator/(Scalar a, const Tensor& b) { return div(ops::wrap_scalar(b, a), b); }

Tensor cast(const Tensor& x, DType dtype) {
  Tensor y = forward_only([&] { return ops::cast(x, dtype); });
  if (!is_floating(dtype)) return y;  // integer and bool results carry no gradient
  if (Node* n = recorded("cast", {&x}, y)) {
    const DType from = x.dtype();
    n->backward = [from](const Grads&, const Tensor& g) -> Grads { return {g.to(from)}; };
  }
  return y;
}

using autograd::check_inplace;

Tensor& add_(Tensor& self, const Tensor& other) {
  return check_inplace(self, "add_"), ops::add_(self, other);
}
Tensor& sub_(Tensor& self, const Tensor& other) {
  return check_inplace(self, "sub_"), ops::sub_(self, other);
}
Tensor& mul_(Tensor& self, const Tensor& other) {
  return check_inplace(self, "mul_"), ops::mul_(self, other);
}
Tensor& div_(Tensor& self, const Tensor& other) {
  return check_inplace(self, "div_"), ops::div_(self, other);
}
Tensor& add_(Tensor& self, Scalar other) { return check_inplace(self, "add_"), ops::add_(self, other); }
Tensor& mul_(Tensor& self, Scalar other) { return check_inplace(self, "mul_"), ops::mul_(self, other); }
Tensor& relu_(Tensor& self) { return check_inplace(self, "relu_"), ops::relu_(self); }
Tensor& clamp_(Tensor& self, Scalar min, Scalar max) {
  return check_inplace(self, "clamp_"), ops::clamp_(self, min, max);
}

}  // namespace frugal

// Differentiable elementwise ops: the backward rule of each op of core/op_list.h (rule_<name>), then the ops
// themselves and their Tensor methods, generated from the list: core's forward (frugal::ops) and the rule.
#include <cmath>

#include "amp/autocast.h"
#include "autograd/functions.h"
#include "core/op_table.h"

namespace frugal {

using autograd::Grads;
using autograd::Node;
using autograd::recorded;

namespace {

Tensor zeros_as(const Tensor& g) { return zeros_like(g); }
Tensor one_minus(const Tensor& t) { return 1.0 - t; }

// A one-input op's backward rule: what it saves (x and/or y) and d x from the saved tensors and g.
enum class Save { None, Input, Output, Both };
struct UnaryRule {
  Save save;
  Tensor (*dx)(const Grads& saved, const Tensor& g);
};
// The same for an op with two Scalar parameters, which the rule also gets.
struct UnaryParamRule {
  Save save;
  Tensor (*dx)(const Grads& saved, const Tensor& g, Scalar p1, Scalar p2);
};
// A two-input op's: what it keeps, and both gradients at the output's shape from (a, b, y) (undefined where
// not kept) and g; they are then reduced to each input's shape and dtype.
enum class Keep { None, Inputs, InputsAndOutput };
using Pair = std::pair<Tensor, Tensor>;
struct BinaryRule {
  Keep keep;
  Pair (*grads)(const Tensor& a, const Tensor& b, const Tensor& y, const Tensor& g);
};

void save_for(Node* n, Save save, const Tensor& x, const Tensor& y) {
  if (save == Save::Input || save == Save::Both) n->save(x);
  if (save == Save::Output || save == Save::Both) n->save_output(y);
}

// Records y = f(x) with its rule.
Tensor unary(const char* name, const Tensor& x, Tensor y, const UnaryRule& rule) {
  if (Node* n = recorded(name, {&x}, y)) {
    save_for(n, rule.save, x, y);
    n->backward = [dx = rule.dx](const Grads& s, const Tensor& g) -> Grads { return {dx(s, g)}; };
  }
  return y;
}
Tensor unary(const char* name, const Tensor& x, Tensor y, const UnaryParamRule& rule, Scalar p1, Scalar p2) {
  if (Node* n = recorded(name, {&x}, y)) {
    save_for(n, rule.save, x, y);
    n->backward = [dx = rule.dx, p1, p2](const Grads& s, const Tensor& g) -> Grads {
      return {dx(s, g, p1, p2)};
    };
  }
  return y;
}
Tensor binary(const char* name, const Tensor& a, const Tensor& b, Tensor y, const BinaryRule& rule) {
  if (Node* n = recorded(name, {&a, &b}, y)) {
    if (rule.keep != Keep::None) {
      n->save(a);
      n->save(b);
    }
    if (rule.keep == Keep::InputsAndOutput) n->save_output(y);
    n->backward = [grads = rule.grads, sa = a.shape(), sb = b.shape(), ta = a.dtype(), tb = b.dtype()](
                      const Grads& s, const Tensor& g) -> Grads {
      auto at = [&](size_t i) { return i < s.size() ? s[i] : Tensor(); };
      auto [da, db] = grads(at(0), at(1), at(2), g);
      return {da.defined() ? autograd::sum_to(da, sa).to(ta) : da,
              db.defined() ? autograd::sum_to(db, sb).to(tb) : db};
    };
  }
  return y;
}

constexpr double kInvSqrt2Pi = 0.39894228040143267794;

// The backward rules, rule_<name> for each op of core/op_list.h, written with the differentiable ops (so
// that they are themselves differentiable) except where a one-pass backward op says otherwise. g is the
// gradient of the output; s the saved tensors.
const UnaryRule rule_neg{Save::None, [](const Grads&, const Tensor& g) { return neg(g); }};
const UnaryRule rule_abs{Save::Input, [](const Grads& s, const Tensor& g) {
                           return where(gt(s[0], 0.0), g, where(lt(s[0], 0.0), neg(g), zeros_as(g)));
                         }};
const UnaryRule rule_exp{Save::Output, [](const Grads& s, const Tensor& g) { return mul(g, s[0]); }};
const UnaryRule rule_log{Save::Input, [](const Grads& s, const Tensor& g) { return div(g, s[0]); }};
const UnaryRule rule_sqrt{Save::Output,
                          [](const Grads& s, const Tensor& g) { return div(mul(g, 0.5), s[0]); }};
const UnaryRule rule_rsqrt{Save::Output, [](const Grads& s, const Tensor& g) {  // d x^(-1/2) = -1/2 y^3
                             return mul(g, mul(pow(s[0], 3.0), -0.5));
                           }};
const UnaryRule rule_relu{Save::Output, [](const Grads& s, const Tensor& g) {
                            // One pass where the device has the kernel (the same values); the composite
                            // otherwise, and when the rule is itself recorded (double backward needs a
                            // differentiable form).
                            if (!autograd::grad_mode_enabled() && g.dtype() == s[0].dtype() &&
                                op_relu_backward.has(s[0].device(), s[0].dtype()))
                              return ops::relu_backward(g, s[0]);
                            return where(gt(s[0], 0.0), g, zeros_as(g));
                          }};
// gelu and gelu_tanh: one-pass backward ops (core/ops.h; first order only), tested against the gradients of
// their composite forms (tests/kernels/test_gelu.cpp). d = Phi(x) + x phi(x).
const UnaryRule rule_gelu{Save::Input,
                          [](const Grads& s, const Tensor& g) { return ops::gelu_backward(g, s[0]); }};
const UnaryRule rule_gelu_tanh{
    Save::Input, [](const Grads& s, const Tensor& g) { return ops::gelu_tanh_backward(g, s[0]); }};
const UnaryRule rule_sigmoid{
    Save::Output, [](const Grads& s, const Tensor& g) { return mul(g, mul(s[0], one_minus(s[0]))); }};
const UnaryRule rule_tanh{Save::Output,
                          [](const Grads& s, const Tensor& g) { return mul(g, one_minus(mul(s[0], s[0]))); }};
const UnaryRule rule_silu{Save::Input, [](const Grads& v, const Tensor& g) {  // d = s (1 + x (1 - s))
                            const Tensor s = sigmoid(v[0]);
                            return mul(g, mul(s, add(mul(v[0], one_minus(s)), 1.0)));
                          }};
const UnaryRule rule_erf{Save::Input, [](const Grads& s, const Tensor& g) {  // d = 2/sqrt(pi) exp(-x^2)
                           return mul(g, mul(exp(neg(mul(s[0], s[0]))), 2 * kInvSqrt2Pi * std::sqrt(2.0)));
                         }};
const UnaryRule rule_sin{Save::Input, [](const Grads& s, const Tensor& g) { return mul(g, cos(s[0])); }};
const UnaryRule rule_cos{Save::Input, [](const Grads& s, const Tensor& g) { return neg(mul(g, sin(s[0]))); }};
// The gradient passes where min <= x <= max.
const UnaryParamRule rule_clamp{Save::Input, [](const Grads& s, const Tensor& g, Scalar min, Scalar max) {
                                  return where(lt(s[0], min), zeros_as(g),
                                               where(gt(s[0], max), zeros_as(g), g));
                                }};
// d = sigmoid(beta x), and 1 where beta x > threshold (where the op is x itself), as PyTorch's.
const UnaryParamRule rule_softplus{Save::Input,
                                   [](const Grads& s, const Tensor& g, Scalar beta, Scalar threshold) {
                                     const Tensor bx = mul(s[0], beta);
                                     return where(gt(bx, threshold), g, mul(g, sigmoid(bx)));
                                   }};

const BinaryRule rule_add{Keep::None, [](const Tensor&, const Tensor&, const Tensor&, const Tensor& g) {
                            return Pair{g, g};
                          }};
const BinaryRule rule_sub{Keep::None, [](const Tensor&, const Tensor&, const Tensor&, const Tensor& g) {
                            return Pair{g, neg(g)};
                          }};
const BinaryRule rule_mul{Keep::Inputs, [](const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g) {
                            return Pair{mul(g, b), mul(g, a)};
                          }};
const BinaryRule rule_div{Keep::Inputs, [](const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g) {
                            const Tensor ga = div(g, b);
                            return Pair{ga, neg(div(mul(ga, a), b))};
                          }};
// da = b a^(b-1), taken as 0 where b = 0 (a^0 is constant; 0 * 0^-1 would give nan at a = 0; PyTorch's rule);
// db = y log(a), taken as 0 where a = 0.
const BinaryRule rule_pow{
    Keep::InputsAndOutput, [](const Tensor& a, const Tensor& b, const Tensor& y, const Tensor& g) {
      const Tensor da = where(eq(b, 0.0), zeros_as(g), mul(g, mul(b, pow(a, sub(b, 1.0)))));
      const Tensor db = where(eq(a, 0.0), zeros_as(g), mul(g, mul(y, log(a))));
      return Pair{da, db};
    }};
// Ties split the gradient evenly, as PyTorch does.
const BinaryRule rule_maximum{
    Keep::Inputs, [](const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g) {
      const Tensor half = mul(g, 0.5), z = zeros_as(g);
      return Pair{where(gt(a, b), g, where(eq(a, b), half, z)), where(lt(a, b), g, where(eq(a, b), half, z))};
    }};
const BinaryRule rule_minimum{
    Keep::Inputs, [](const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g) {
      const Tensor half = mul(g, 0.5), z = zeros_as(g);
      return Pair{where(lt(a, b), g, where(eq(a, b), half, z)), where(gt(a, b), g, where(eq(a, b), half, z))};
    }};

}  // namespace

using autograd::check_inplace;

// The ops of core/op_list.h: core's forward (which records nothing) and the rule above. A Scalar operand is
// a 0-d tensor that needs no gradient. The in-place forms check that self is not tracked, then run core's.
#define FRUGAL_DIFF_UNARY(name, F, dtypes, autocast_class, method, inplace) \
  Tensor name(const Tensor& x_in) {                                         \
    const Tensor x = amp::autocast(#name, x_in)[0];                         \
    return unary(#name, x, ops::name(x), rule_##name);                      \
  }                                                                         \
  FRUGAL_IF_##inplace(                                                      \
      Tensor& name##_(Tensor& self) { return check_inplace(self, #name "_"), ops::name##_(self); })
#define FRUGAL_DIFF_UNARY_PARAM(name, F, dtypes, autocast_class, method, inplace, p1, d1, p2, d2, ...) \
  Tensor name(const Tensor& x_in, Scalar p1, Scalar p2) {                                              \
    const Tensor x = amp::autocast(#name, x_in)[0];                                                    \
    return unary(#name, x, ops::name(x, p1, p2), rule_##name, p1, p2);                                 \
  }                                                                                                    \
  FRUGAL_IF_##inplace(Tensor& name##_(Tensor& self, Scalar p1, Scalar p2) {                            \
    return check_inplace(self, #name "_"), ops::name##_(self, p1, p2);                                 \
  })
#define FRUGAL_DIFF_BINARY(name, F, dtypes, autocast_class, method, inplace)         \
  Tensor name(const Tensor& a_in, const Tensor& b_in) {                              \
    const auto ab = amp::autocast(#name, a_in, b_in);                                \
    const Tensor &a = ab[0], &b = ab[1];                                             \
    return binary(#name, a, b, ops::name(a, b), rule_##name);                        \
  }                                                                                  \
  Tensor name(const Tensor& a, Scalar b) { return name(a, ops::wrap_scalar(a, b)); } \
  Tensor name(Scalar a, const Tensor& b) { return name(ops::wrap_scalar(b, a), b); } \
  FRUGAL_IF_##inplace(                                                               \
      Tensor& name##_(Tensor& self, const Tensor& other) {                           \
        return check_inplace(self, #name "_"), ops::name##_(self, other);            \
      } Tensor& name##_(Tensor& self, Scalar other) {                                \
        return check_inplace(self, #name "_"), ops::name##_(self, other);            \
      })
FRUGAL_UNARY_OP_LIST(FRUGAL_DIFF_UNARY)
FRUGAL_UNARY_PARAM_OP_LIST(FRUGAL_DIFF_UNARY_PARAM)
FRUGAL_BINARY_OP_LIST(FRUGAL_DIFF_BINARY)
#undef FRUGAL_DIFF_UNARY
#undef FRUGAL_DIFF_UNARY_PARAM
#undef FRUGAL_DIFF_BINARY

Tensor clamp_min(const Tensor& x, Scalar min) { return clamp(x, min, INFINITY); }
Tensor clamp_max(const Tensor& x, Scalar max) { return clamp(x, -INFINITY, max); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor y = ops::where(cond, a, b);
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

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
Tensor operator+(Scalar a, const Tensor& b) { return add(b, a); }
Tensor operator-(Scalar a, const Tensor& b) { return sub(a, b); }
Tensor operator*(Scalar a, const Tensor& b) { return mul(b, a); }
Tensor operator/(Scalar a, const Tensor& b) { return div(a, b); }

Tensor cast(const Tensor& x, DType dtype) {
  Tensor y = ops::cast(x, dtype);
  if (!is_floating(dtype)) return y;  // integer and bool results carry no gradient
  if (Node* n = recorded("cast", {&x}, y)) {
    const DType from = x.dtype();
    n->backward = [from](const Grads&, const Tensor& g) -> Grads { return {g.to(from)}; };
  }
  return y;
}

}  // namespace frugal

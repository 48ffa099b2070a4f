// The elementwise ops, each declared once. This list is the source of truth that generates their ops::
// functions (core/ops.h, core/ops_elementwise.cpp), the differentiable frugal:: functions
// (autograd/functions.h, autograd/grad_elementwise.cpp), the Tensor methods and in-place methods
// (core/tensor.h), the op tables op_<name> (core/op_table.h) and the CPU and CUDA registrations
// (kernels/cpu/elementwise.cpp, kernels/cuda/elementwise_*.cu). Macros only: no types, no includes.
//
// Adding an elementwise op (Note [adding an elementwise op]) is its line here, its functor in kernels/math.h,
// its backward rule in autograd/grad_elementwise.cpp and its tests (tests/kernels/test_elementwise.cpp,
// tests/autograd/test_gradcheck_elementwise.cpp):
//
//   X(sin, Sin, floating, none, method, no_inplace)   // gives ops::sin, frugal::sin, x.sin(), op_sin, ...
//
// Columns:
//   name      ops::name, frugal::name, Tensor::name, the op table op_name (and its name in errors)
//   Functor   its math: math::Functor (kernels/math.h), or math::Functor<C> for the ops with parameters
//   dtypes    the dtypes it has kernels for: floating (f32, f64, f16, bf16; the op refuses others with a
//             message, and a binary op computes integers in f32), signed_numeric (floating, i64, i32),
//             numeric (signed_numeric, u8), all (numeric, bool). The GPU has no f64 arithmetic and no u8
//             arithmetic (kernels/cuda/elementwise.cuh)
//   autocast  none, or f32: f16/bf16 inputs are computed in f32 under autocast (Note [autocast policy])
//   method    method (x.name(...)) or no_method
//   inplace   inplace (ops::name_, frugal::name_, x.name_(...)) or no_inplace
//
// Hand-written, because the list would be contorted: where (three operands, the condition bool), cast and
// fill (keyed by the output dtype), clamp_min / clamp_max (clamp with one infinite bound), the fused backward
// ops (relu_backward, gelu_backward, ...), the comparisons' frugal:: forms (not differentiable: ops::'s), and
// the CPU's integer pow (its own loop) and Eigen forms (kernels/cpu/elementwise.cpp).
//
// Note [adding an elementwise op]
// 1. its line below; 2. its functor in kernels/math.h (a template on C with a (double, double) constructor
// when it has parameters); 3. its backward rule, rule_<name>, in autograd/grad_elementwise.cpp; 4. its
// kernel test (its input range in tests/kernels/test_elementwise.cpp, where the list drives the reference
// comparisons) and its finite-difference check (tests/autograd/test_gradcheck_elementwise.cpp). The CPU
// runs the functor; an Eigen form for contiguous f32/f64 runs is optional (kernels/cpu/elementwise.cpp).
#pragma once

// One input: X(name, Functor, dtypes, autocast, method, inplace).
//   gelu is x Phi(x), the erf form; gelu_tanh its tanh approximation; silu x sigmoid(x).
// clang-format off
#define FRUGAL_UNARY_OP_LIST(X)                                         \
  X(neg,       Neg,      signed_numeric, none, method, no_inplace)      \
  X(abs,       Abs,      numeric,        none, method, no_inplace)      \
  X(exp,       Exp,      floating,       f32,  method, no_inplace)      \
  X(log,       Log,      floating,       f32,  method, no_inplace)      \
  X(sqrt,      Sqrt,     floating,       none, method, no_inplace)      \
  X(rsqrt,     Rsqrt,    floating,       f32,  method, no_inplace)      \
  X(relu,      Relu,     numeric,        none, method, inplace)         \
  X(gelu,      Gelu,     floating,       none, method, no_inplace)      \
  X(gelu_tanh, GeluTanh, floating,       none, method, no_inplace)      \
  X(sigmoid,   Sigmoid,  floating,       none, method, no_inplace)      \
  X(tanh,      Tanh,     floating,       none, method, no_inplace)      \
  X(silu,      Silu,     floating,       none, method, no_inplace)      \
  X(erf,       Erf,      floating,       none, method, no_inplace)      \
  X(sin,       Sin,      floating,       none, method, no_inplace)      \
  X(cos,       Cos,      floating,       none, method, no_inplace)

// One input and two Scalar parameters (the kernel's OpArgs a and b), each with its default (`= v`, or
// nothing), and a condition on them with the message for when it fails:
// X(name, Functor, dtypes, autocast, method, inplace, p1, default1, p2, default2, check, message).
//   softplus: PyTorch's, x where beta x > threshold, log1p(exp(beta x)) / beta elsewhere.
#define FRUGAL_UNARY_PARAM_OP_LIST(X)                                                                    \
  X(clamp,    Clamp,    numeric,  none, method, inplace,    min,  ,     max,       ,      !(min > max), \
    "min is greater than max")                                                                           \
  X(softplus, Softplus, floating, f32,  method, no_inplace, beta, = 1,  threshold, = 20, true, "")

// Two inputs, NumPy broadcasting and type promotion: X(name, Functor, dtypes, autocast, method, inplace).
// Each also has the Scalar forms op(x, 2.0) and op(2.0, x). On bool tensors add is a logical or and mul a
// logical and (as PyTorch); the others refuse bool with a message.
#define FRUGAL_BINARY_OP_LIST(X)                                \
  X(add,     Add,     all,      none, method, inplace)          \
  X(sub,     Sub,     numeric,  none, method, inplace)          \
  X(mul,     Mul,     all,      none, method, inplace)          \
  X(div,     Div,     floating, none, method, inplace)          \
  X(pow,     Pow,     numeric,  f32,  method, no_inplace)       \
  X(maximum, Maximum, numeric,  none, method, no_inplace)       \
  X(minimum, Minimum, numeric,  none, method, no_inplace)

// Comparisons: two inputs promoted to one dtype (the table's key, any dtype), a bool output; methods
// x.eq(y), x.lt(2.0), ...: X(name, Functor).
#define FRUGAL_COMPARE_OP_LIST(X) X(eq, Eq) X(ne, Ne) X(lt, Lt) X(le, Le) X(gt, Gt) X(ge, Ge)
// clang-format on

// The declarations of the ops of one-input, parameter and two-input lists, for the namespace that expands
// them (frugal::ops in core/ops.h, frugal in autograd/functions.h: the same signatures in both).
#define FRUGAL_DECLARE_UNARY_OP(name, F, dtypes, autocast_class, method, inplace) \
  Tensor name(const Tensor& x);                                                   \
  FRUGAL_IF_##inplace(Tensor& name##_(Tensor& self);)
#define FRUGAL_DECLARE_UNARY_PARAM_OP(name, F, dtypes, autocast_class, method, inplace, p1, d1, p2, d2, ...) \
  Tensor name(const Tensor& x, Scalar p1 d1, Scalar p2 d2);                                                  \
  FRUGAL_IF_##inplace(Tensor& name##_(Tensor& self, Scalar p1 d1, Scalar p2 d2);)
#define FRUGAL_DECLARE_BINARY_OP(name, F, dtypes, autocast_class, method, inplace) \
  Tensor name(const Tensor& a, const Tensor& b);                                   \
  Tensor name(const Tensor& a, Scalar b);                                          \
  Tensor name(Scalar a, const Tensor& b);                                          \
  FRUGAL_IF_##inplace(Tensor& name##_(Tensor& self, const Tensor& other);          \
                      Tensor & name##_(Tensor & self, Scalar other);)
#define FRUGAL_DECLARE_ELEMENTWISE_OPS()                    \
  FRUGAL_UNARY_OP_LIST(FRUGAL_DECLARE_UNARY_OP)             \
  FRUGAL_UNARY_PARAM_OP_LIST(FRUGAL_DECLARE_UNARY_PARAM_OP) \
  FRUGAL_BINARY_OP_LIST(FRUGAL_DECLARE_BINARY_OP)

// Conditional expansion on the method and inplace columns: FRUGAL_IF_##inplace(declaration).
#define FRUGAL_IF_method(...) __VA_ARGS__
#define FRUGAL_IF_no_method(...)
#define FRUGAL_IF_inplace(...) __VA_ARGS__
#define FRUGAL_IF_no_inplace(...)

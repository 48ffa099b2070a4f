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
// logical and (as PyTorch); the others refuse bool with a message. Integer results past the dtype's range
// wrap modulo 2^bits, as PyTorch's and NumPy's (Note [integer overflow wraps] in kernels/math.h).
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

// The ops that take one tensor first and are not elementwise: views, copies, reductions, softmax, matmul,
// indexing. Each is declared once, here, with what it does; the list generates its ops:: declaration
// (core/ops.h), its frugal:: declaration (autograd/functions.h; the op's rule is in
// autograd/grad_<family>.cpp) and its Tensor method (declared in core/tensor.h, defined in
// autograd/tensor_methods.cpp): X(name, params, args, grad, method).
//   params  the parameters after the tensor x, in parentheses; a default is written FRUGAL_DEFAULT(value)
//           (so that the method definitions can leave it out)
//   args    their names, in parentheses
//   grad    recorded (frugal::name records a node) or not_recorded (integer results: frugal::name is
//           ops::name)
//   method  method (x.name(args)) or no_method
// Hand-written beside it: as_strided (its method refuses tensors that require grad), to (by dtype, keyed by
// the output; by device), cat and stack (a list of tensors), max_dim / min_dim (two results, below),
// index_add (core only), and the layers' fused ops without methods (conv2d and the pools, linear,
// linear_relu, layer_norm: core/ops.h declares each beside its backward ops and result structs, and
// layer_norm's ops:: form returns its saved statistics too).
// clang-format off
#define FRUGAL_TENSOR_OP_LIST(X)                                                                            \
  /* Views: share storage with x, no copy. reshape copies when no view fits; slice is Python's            \
     x[start:end:step]; select removes the dim; expand's -1 keeps a size, and new leading dims are        \
     allowed. */                                                                                          \
  X(view,         (const Shape& shape),                          (shape),                recorded, method) \
  X(reshape,      (const Shape& shape),                          (shape),                recorded, method) \
  X(flatten,      (int64_t start_dim FRUGAL_DEFAULT(0), int64_t end_dim FRUGAL_DEFAULT(-1)),                \
                                                                 (start_dim, end_dim),   recorded, method) \
  X(transpose,    (int64_t dim0, int64_t dim1),                  (dim0, dim1),           recorded, method) \
  X(permute,      (const Shape& dims),                           (dims),                 recorded, method) \
  X(narrow,       (int64_t dim, int64_t start, int64_t length),  (dim, start, length),   recorded, method) \
  X(slice,        (int64_t dim, int64_t start, int64_t end, int64_t step FRUGAL_DEFAULT(1)),                \
                                                                 (dim, start, end, step), recorded, method) \
  X(select,       (int64_t dim, int64_t index),                  (dim, index),           recorded, method) \
  X(expand,       (const Shape& shape),                          (shape),                recorded, method) \
  X(squeeze,      (),                                            (),                     recorded, method) \
  X(squeeze,      (int64_t dim),                                 (dim),                  recorded, method) \
  X(unsqueeze,    (int64_t dim),                                 (dim),                  recorded, method) \
  /* Copies: contiguous is x itself when already contiguous. */                                           \
  X(contiguous,   (),                                            (),                     recorded, method) \
  X(clone,        (),                                            (),                     recorded, method) \
  /* Reductions over dims (empty: all dims); keepdim keeps them as size 1. sum of integers or bools      \
     gives i64; mean and var need a floating dtype; var divides by n - correction. */                     \
  X(sum,          (const Shape& dims FRUGAL_DEFAULT({}), bool keepdim FRUGAL_DEFAULT(false)),               \
                                                                 (dims, keepdim),        recorded, method) \
  X(mean,         (const Shape& dims FRUGAL_DEFAULT({}), bool keepdim FRUGAL_DEFAULT(false)),               \
                                                                 (dims, keepdim),        recorded, method) \
  X(max,          (const Shape& dims FRUGAL_DEFAULT({}), bool keepdim FRUGAL_DEFAULT(false)),               \
                                                                 (dims, keepdim),        recorded, method) \
  X(min,          (const Shape& dims FRUGAL_DEFAULT({}), bool keepdim FRUGAL_DEFAULT(false)),               \
                                                                 (dims, keepdim),        recorded, method) \
  X(var,          (const Shape& dims FRUGAL_DEFAULT({}), int64_t correction FRUGAL_DEFAULT(1),              \
                   bool keepdim FRUGAL_DEFAULT(false)),                                                     \
                                                   (dims, correction, keepdim),            recorded, method) \
  /* The index of the largest (smallest) element along dim, as i64; without a dim, of the flattened      \
     tensor. Ties give the first index. */                                                                \
  X(argmax,       (),                                            (),                 not_recorded, method) \
  X(argmax,       (int64_t dim, bool keepdim FRUGAL_DEFAULT(false)), (dim, keepdim), not_recorded, method) \
  X(argmin,       (),                                            (),                 not_recorded, method) \
  X(argmin,       (int64_t dim, bool keepdim FRUGAL_DEFAULT(false)), (dim, keepdim), not_recorded, method) \
  /* Numerically stable softmax and log-softmax along dim (floating dtypes; f16/bf16 computed in f32). */ \
  X(softmax,      (int64_t dim),                                 (dim),                  recorded, method) \
  X(log_softmax,  (int64_t dim),                                 (dim),                  recorded, method) \
  /* The matrix product with NumPy/PyTorch semantics: 1-D and 2-D operands, and batch dims that          \
     broadcast. f16/bf16 accumulate in f32. */                                                            \
  X(matmul,       (const Tensor& other),                         (other),                recorded, method) \
  /* A copy converted to dtype (floats to integers truncate toward zero; to bool is x != 0). */           \
  X(cast,         (DType dtype),                                 (dtype),             recorded, no_method) \
  /* Indexing. index is i64 (or i32); every value must be in [-size, size) along dim (negative counts    \
     from the end). scatter_add: a copy of x with src's elements added at the positions index names      \
     along dim (duplicates accumulate). one_hot: an i64 tensor of shape x.shape + [num_classes] with a 1  \
     at each index x holds; num_classes < 0 infers max + 1. */                                            \
  X(index_select, (int64_t dim, const Tensor& index),            (dim, index),        recorded, no_method) \
  X(gather,       (int64_t dim, const Tensor& index),            (dim, index),        recorded, no_method) \
  X(scatter_add,  (int64_t dim, const Tensor& index, const Tensor& src), (dim, index, src),                 \
                                                                                      recorded, no_method) \
  X(one_hot,      (int64_t num_classes FRUGAL_DEFAULT(-1)),      (num_classes),   not_recorded, no_method)
// clang-format on
#define FRUGAL_DEFAULT(...) = __VA_ARGS__

// The parameter and argument lists with the tensor first: Tensor name FRUGAL_WITH_X params.
#define FRUGAL_WITH_X(...) (const Tensor& x __VA_OPT__(, ) __VA_ARGS__)
#define FRUGAL_WITH_THIS(...) (*this __VA_OPT__(, ) __VA_ARGS__)
#define FRUGAL_DECLARE_TENSOR_OP(name, params, args, grad, method) Tensor name FRUGAL_WITH_X params;

// The largest (smallest) elements along one dim and where they are (i64; ties give the first index, as
// argmax), libtorch's max(x, dim, keepdim): auto [values, indices] = max(x, 1);. The dim is a template
// parameter so that a braced dim, max(x, {1}), cannot deduce it and stays the Shape reduction of the list
// above (values only), as it always was. For the namespace that expands it (ops::, frugal::).
#define FRUGAL_DECLARE_DIM_EXTREMES()                                                                \
  ValuesIndices max_dim(const Tensor& x, int64_t dim, bool keepdim = false);                         \
  ValuesIndices min_dim(const Tensor& x, int64_t dim, bool keepdim = false);                         \
  template <std::integral I>                                                                         \
  requires(!std::same_as<I, bool>) ValuesIndices max(const Tensor& x, I dim, bool keepdim = false) { \
    return max_dim(x, int64_t(dim), keepdim);                                                        \
  }                                                                                                  \
  template <std::integral I>                                                                         \
  requires(!std::same_as<I, bool>) ValuesIndices min(const Tensor& x, I dim, bool keepdim = false) { \
    return min_dim(x, int64_t(dim), keepdim);                                                        \
  }

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

// Conditional expansion on the method, inplace and grad columns: FRUGAL_IF_##inplace(declaration).
#define FRUGAL_IF_method(...) __VA_ARGS__
#define FRUGAL_IF_no_method(...)
#define FRUGAL_IF_inplace(...) __VA_ARGS__
#define FRUGAL_IF_no_inplace(...)
#define FRUGAL_IF_recorded(...) __VA_ARGS__
#define FRUGAL_IF_not_recorded(...)
#define FRUGAL_UNLESS_recorded(...)
#define FRUGAL_UNLESS_not_recorded(...) __VA_ARGS__

// Tensor: a cheap shared handle to storage, a byte offset, shape, strides (in elements) and dtype. Views
// share storage; ops allocate their results from the device's arena (core/memory.h).
//
//   Tensor x = randn({4, 3});                 // f32 on the cpu
//   Tensor y = x.transpose(0, 1).contiguous(); // a view, then a copy
//   float s = x.sum().item<float>();
//   std::cout << x << "\n";
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "device.h"
#include "dtype.h"
#include "error.h"
#include "op_list.h"
#include "shape.h"
#include "storage.h"

namespace frugal {

struct AutogradMeta;  // defined by autograd/; a tensor without one does not take part in autograd

namespace detail {
// DefaultDeviceGuard's; in the static TLS block like the allocation path's (Note [thread-locals on the
// allocation path], core/history_log.h): every TensorOptions made without a device reads it.
// nvcc's front end refuses the attribute on this declaration (warning 1835); the CUDA backend, a library
// loaded at run time, reads it through the general model, which any thread-local allows.
#if defined(__CUDACC__)
extern thread_local Device t_default_device;
#else
extern thread_local Device t_default_device __attribute__((tls_model("initial-exec")));
#endif
}  // namespace detail
// The device a new tensor goes to when its options name none: the cpu, unless a DefaultDeviceGuard on this
// thread says otherwise (as PyTorch's `with torch.device("meta"):`). memory::estimate sets the meta device
// so, and a model built inside its step gets meta parameters without any change to the model's code.
//   { DefaultDeviceGuard g(kMeta); nn::Linear big(65536, 65536); }  // 16 GiB of parameters, no bytes
inline Device default_device() { return detail::t_default_device; }
class DefaultDeviceGuard {
 public:
  explicit DefaultDeviceGuard(Device d) : previous_(detail::t_default_device) {
    detail::t_default_device = d;
  }
  ~DefaultDeviceGuard() { detail::t_default_device = previous_; }
  DefaultDeviceGuard(const DefaultDeviceGuard&) = delete;
  DefaultDeviceGuard& operator=(const DefaultDeviceGuard&) = delete;

 private:
  Device previous_;
};

// Where and how a new tensor is made: TensorOptions().dtype(DType::F64).device(kCPU). A DType or Device
// converts implicitly, so zeros({2, 3}, DType::BF16) works; without a device, default_device().
struct TensorOptions {
  DType dtype_ = DType::F32;
  Device device_ = default_device();

  TensorOptions() = default;
  TensorOptions(DType t) : dtype_(t) {}    // NOLINT: implicit by design
  TensorOptions(Device d) : device_(d) {}  // NOLINT: implicit by design
  TensorOptions dtype(DType t) const {
    TensorOptions o = *this;
    o.dtype_ = t;
    return o;
  }
  TensorOptions device(Device d) const {
    TensorOptions o = *this;
    o.device_ = d;
    return o;
  }
};

// A number passed to an op (add(x, 2.0)); it takes the tensor's dtype, as in PyTorch.
using Scalar = double;

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false, every other call throws
  Tensor(std::shared_ptr<Storage> storage, int64_t byte_offset, const Shape& shape, const Shape& strides,
         DType dtype);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int dim() const { return impl().shape.size(); }
  int64_t numel() const { return impl().shape.numel(); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  int64_t element_size() const { return dtype_size(dtype()); }
  int64_t nbytes() const { return numel() * element_size(); }  // fits: Note [checked sizes] (core/shape.h)
  int64_t byte_offset() const { return impl().offset; }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  TensorOptions options() const { return TensorOptions(dtype()).device(device()); }
  // True when both handles are the same tensor object (not merely equal values).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  // True when this handle is the only one to the tensor and to its storage: nothing else can see its bytes.
  bool is_unique() const { return impl_.use_count() == 1 && impl().storage.use_count() == 1; }

  void* raw_data() const { return static_cast<char*>(impl().storage->data()) + impl().offset; }
  template <typename T>
  T* data() const {
    FRUGAL_CHECK_DTYPE(dtype_v<T> == dtype(), "data<", dtype_name(dtype_v<T>), ">(): the tensor holds ",
                       dtype_name(dtype()));
    return static_cast<T*>(raw_data());
  }

  // Copies the elements (any layout; from a device through the host) into a vector, converted to T.
  template <typename T>
  std::vector<T> to_vector() const;
  // The single element of a one-element tensor, converted to T.
  template <typename T>
  T item() const;
  std::string str() const;  // as operator<< prints it

  // Views (share storage, no copy), copies, reductions, softmax, matmul: the methods of core/op_list.h's
  // FRUGAL_TENSOR_OP_LIST, each its free function of autograd/functions.h (what each does is written in the
  // list): x.view({2, -1}), x.transpose(0, 1), x.sum({0}, true), x.argmax(1), x.softmax(-1), x.matmul(w), ...
#define FRUGAL_METHOD_TENSOR_OP(name, params, args, grad, method) \
  FRUGAL_IF_##method(Tensor name params const;)
  FRUGAL_TENSOR_OP_LIST(FRUGAL_METHOD_TENSOR_OP)
#undef FRUGAL_METHOD_TENSOR_OP
  Tensor t() const;  // transpose of a 2-D tensor
  Tensor expand_as(const Tensor& other) const { return expand(other.shape()); }
  Tensor as_strided(const Shape& shape, const Shape& strides, int64_t element_offset) const;

  // Points this tensor (and every handle to it) at src's data, shape and dtype, keeping its autograd
  // identity: how a module converts its parameters in place. Not recorded by autograd.
  void set_data(const Tensor& src) const;
  // Whether ops may write into its bytes: not into a read-only mapped file's (io::map_safetensors).
  bool is_writable() const { return !defined() || !storage()->read_only(); }

  // Conversions and writes.
  Tensor to(DType dtype) const;      // this tensor itself when the dtype already matches
  Tensor to(Device device) const;    // this tensor itself when already there
  Tensor& copy_(const Tensor& src);  // broadcasts and converts src into this tensor, from any device
  Tensor& fill_(Scalar value);
  Tensor& zero_() { return fill_(0); }

  // Math as methods, recorded by autograd as the free functions of autograd/functions.h (defined in
  // autograd/): x.exp(), x.pow(2), x.add(y), x.clamp(-1, 1), x.relu_(), x.softmax(-1), x.argmax(1), ...
  // They come from core/op_list.h's elementwise lists (Scalar forms included).
#define FRUGAL_METHOD_UNARY(name, F, dtypes, autocast, method, inplace) \
  FRUGAL_IF_##method(Tensor name() const;) FRUGAL_IF_##inplace(Tensor& name##_();)
#define FRUGAL_METHOD_UNARY_PARAM(name, F, dtypes, autocast, method, inplace, p1, d1, p2, d2, ...) \
  FRUGAL_IF_##method(Tensor name(Scalar p1 d1, Scalar p2 d2) const;)                               \
      FRUGAL_IF_##inplace(Tensor& name##_(Scalar p1 d1, Scalar p2 d2);)
#define FRUGAL_METHOD_BINARY(name, F, dtypes, autocast, method, inplace)                       \
  FRUGAL_IF_##method(Tensor name(const Tensor& other) const; Tensor name(Scalar other) const;) \
      FRUGAL_IF_##inplace(Tensor& name##_(const Tensor& other); Tensor & name##_(Scalar other);)
#define FRUGAL_METHOD_COMPARE(name, F)    \
  Tensor name(const Tensor& other) const; \
  Tensor name(Scalar other) const;
  FRUGAL_UNARY_OP_LIST(FRUGAL_METHOD_UNARY)
  FRUGAL_UNARY_PARAM_OP_LIST(FRUGAL_METHOD_UNARY_PARAM)
  FRUGAL_BINARY_OP_LIST(FRUGAL_METHOD_BINARY)
  FRUGAL_COMPARE_OP_LIST(FRUGAL_METHOD_COMPARE)
#undef FRUGAL_METHOD_UNARY
#undef FRUGAL_METHOD_UNARY_PARAM
#undef FRUGAL_METHOD_BINARY
#undef FRUGAL_METHOD_COMPARE
  Tensor operator-() const;
  Tensor clamp_min(Scalar min) const;
  Tensor clamp_max(Scalar max) const;
  Tensor where(const Tensor& cond, const Tensor& other) const;  // cond ? this : other

  // Autograd (defined in autograd/; see autograd/graph.h).
  bool requires_grad() const;               // a leaf marked so, or the result of a recorded op
  Tensor& requires_grad_(bool on = true);   // leaves with a floating dtype only
  bool is_leaf() const;                     // not produced by a recorded op
  Tensor grad() const;                      // accumulated by backward(); undefined until then
  void set_grad(const Tensor& grad) const;  // replaces .grad (e.g. after clipping); undefined clears it
  void zero_grad(bool set_to_none = true) const;
  void retain_grad() const;          // keep .grad on a non-leaf too
  Tensor detach() const;             // the same data, outside the graph
  const char* grad_fn_name() const;  // the op that produced this tensor, "" for a leaf
  void backward(const Tensor& grad = {}, bool retain_graph = false) const;

  // Autograd metadata (filled in by autograd/).
  const std::shared_ptr<AutogradMeta>& autograd_meta() const { return impl().autograd; }
  void set_autograd_meta(std::shared_ptr<AutogradMeta> meta) const { impl().autograd = std::move(meta); }

 private:
  struct Impl {
    std::shared_ptr<Storage> storage;
    int64_t offset = 0;  // bytes from the start of storage
    Shape shape;
    Shape strides;  // in elements
    DType dtype = DType::F32;
    std::shared_ptr<AutogradMeta> autograd;
  };
  Impl& impl() const {
    FRUGAL_CHECK(impl_ != nullptr,
                 "this tensor is undefined (default-constructed); create it with a factory "
                 "such as zeros() or empty() first");
    return *impl_;
  }
  std::shared_ptr<Impl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Throws Error naming `op` when t's bytes may not be written (Tensor::is_writable: a mapped file's); the ops
// that write in place (copy_, fill_, the in-place math, an optimizer's step) check first, so a write into a
// mapped weight is an error, never a fault.
void check_writable(const Tensor& t, const char* op);

// Named tensors: a module's parameters and buffers, an optimizer's state, the contents of a safetensors file.
using StateDict = std::map<std::string, Tensor>;

// Factories. Random ones draw from the default generator (core/rng.h) unless one is given.
Tensor empty(const Shape& shape, TensorOptions opts = {});
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, Scalar value, TensorOptions opts = {});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, Scalar value);
Tensor arange(Scalar end, TensorOptions opts = DType::I64);
Tensor arange(Scalar start, Scalar end, Scalar step = 1, TensorOptions opts = DType::I64);
Tensor linspace(Scalar start, Scalar end, int64_t steps, TensorOptions opts = {});
class Generator;
Tensor rand(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);   // U[0, 1)
Tensor randn(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);  // N(0, 1)
// rand / randn drawn into t, allocating nothing: t's values become those rand(t.shape(), t's dtype) or randn
// would return. Only where can_draw_into(t): a contiguous f32 or f64 tensor on the cpu, or on the meta
// device (which draws nothing). nn::init fills parameters this way.
bool can_draw_into(const Tensor& t);
Tensor& rand_into(Tensor& t, Generator* gen = nullptr);
Tensor& randn_into(Tensor& t, Generator* gen = nullptr);
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts = DType::I64,
               Generator* gen = nullptr);  // uniform integers in [low, high)
// A tensor holding a copy of values (dtype from T unless opts names another); shape defaults to
// {values.size()}.
template <typename T>
Tensor tensor(const std::vector<T>& values, const Shape& shape);
template <typename T>
Tensor tensor(const std::vector<T>& values) {
  return tensor(values, Shape{int64_t(values.size())});
}
// The same from a braced list, without naming the element type: tensor({1.0, 2.0}) is f64 (as
// tensor<double>), tensor({1, 2}) i64 (int literals widen), tensor({true, false}) bool. A named type still
// decides (tensor<int32_t>({1, 2}) is i32). With options, tensor({1.f, 2.f}, kF16) converts to their dtype
// and device.
namespace detail {
template <typename T, typename E>
using tensor_element_t = std::conditional_t<
    !std::is_void_v<T>, T,
    std::conditional_t<std::is_same_v<E, int> || std::is_same_v<E, long long>, int64_t, E>>;
}  // namespace detail
template <typename T = void, typename E>
Tensor tensor(std::initializer_list<E> values, const Shape& shape) {
  return tensor(std::vector<detail::tensor_element_t<T, E>>(values.begin(), values.end()), shape);
}
template <typename T = void, typename E>
Tensor tensor(std::initializer_list<E> values) {
  return tensor(std::vector<detail::tensor_element_t<T, E>>(values.begin(), values.end()));
}
template <typename T = void, typename E>
Tensor tensor(std::initializer_list<E> values, TensorOptions opts) {
  return tensor(std::vector<detail::tensor_element_t<T, E>>(values.begin(), values.end()))
      .to(opts.dtype_)
      .to(opts.device_);
}
// A tensor holding a copy of a raw buffer of the given dtype (contiguous, cpu).
Tensor from_buffer(const void* data, const Shape& shape, DType dtype);
// A 0-d tensor.
Tensor scalar_tensor(Scalar value, TensorOptions opts = {});

}  // namespace frugal

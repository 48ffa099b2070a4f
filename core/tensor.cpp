// Tensor handles: metadata, views (which share storage) and element access.
#include "core/tensor.h"

#include <algorithm>
#include <cstring>

#include "core/estimate.h"
#include "core/memory_history.h"
#include "core/ops.h"

namespace frugal {

thread_local Device detail::t_default_device __attribute__((tls_model("initial-exec"))) = kCPU;

Tensor::Tensor(std::shared_ptr<Storage> storage, int64_t byte_offset, const Shape& shape,
               const Shape& strides, DType dtype)
    : impl_(std::make_shared<Impl>()) {
  FRUGAL_ASSERT(storage != nullptr, "a tensor needs storage");
  FRUGAL_ASSERT(shape.size() == strides.size(), "shape ", shape, " and strides ", strides, " differ in rank");
  impl_->storage = std::move(storage);
  impl_->offset = byte_offset;
  impl_->shape = shape;
  impl_->strides = strides;
  impl_->dtype = dtype;
}

void Tensor::set_data(const Tensor& src) const {
  FRUGAL_CHECK(src.defined(), "set_data: the source tensor is undefined");
  Impl& me = impl();
  me.storage = src.storage();
  me.offset = src.byte_offset();
  me.shape = src.shape();
  me.strides = src.strides();
  me.dtype = src.dtype();
}

void check_writable(const Tensor& t, const char* op) {
  FRUGAL_CHECK(t.is_writable(), op, ": the tensor (shape ", t.shape(), ", ", t.dtype(),
               ") views a read-only mapped file (io::map_safetensors) and cannot be written; write into a "
               "copy (clone()), or load the file with io::load_safetensors");
}

int64_t Tensor::size(int64_t dim) const { return shape()[wrap_dim(dim, this->dim(), "size")]; }
int64_t Tensor::stride(int64_t dim) const { return strides()[wrap_dim(dim, this->dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element is out of place (PyTorch agrees)
  const Shape& sh = shape();
  const Shape& st = strides();
  int64_t expected = 1;
  for (int i = sh.size() - 1; i >= 0; --i) {
    if (sh[i] == 1) continue;
    if (st[i] != expected) return false;
    expected *= sh[i];
  }
  return true;
}

namespace {

// Strides that let `shape` view memory laid out as (old_shape, old_strides), or an empty result when the view
// would need a copy. Dims of the old shape are grouped into runs that are contiguous among themselves; each
// run must map onto a run of new dims with the same element count (PyTorch's computeStride).
bool view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& shape, Shape& out) {
  out = Shape::filled(shape.size(), 1);
  if (old_shape.size() == 0) return true;  // a 0-d tensor views as any shape of one element
  if (old_shape.numel() == 0) {
    out = contiguous_strides(shape);
    return true;
  }
  int view_d = shape.size() - 1;
  int64_t chunk_base_stride = old_strides.size() ? old_strides.back() : 1;
  int64_t tensor_numel = 1, view_numel = 1;
  // The products below stay within the extent of x's elements (Note [checked sizes]); checked all the same,
  // an overflow meaning that no view fits.
  int64_t p;
  for (int d = old_shape.size() - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 || (old_shape[d - 1] != 1 && (__builtin_mul_overflow(tensor_numel, chunk_base_stride, &p) ||
                                             old_strides[d - 1] != p))) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        if (__builtin_mul_overflow(view_numel, chunk_base_stride, &out[view_d]) ||
            __builtin_mul_overflow(view_numel, shape[view_d], &view_numel))
          return false;
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

// Replaces one -1 in shape with the size that keeps numel; checks the count matches.
Shape infer_shape(const Shape& requested, int64_t numel, const Shape& from, const char* op) {
  Shape shape = requested;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      FRUGAL_CHECK_SHAPE(infer < 0, op, ": only one dimension can be -1, got ", requested);
      infer = i;
    } else {
      FRUGAL_CHECK_SHAPE(shape[i] >= 0, op, ": invalid size ", shape[i], " in shape ", requested);
      FRUGAL_CHECK_SHAPE(!__builtin_mul_overflow(known, shape[i], &known), op, ": shape ", requested,
                         " has more elements than int64 can count");
    }
  }
  if (infer >= 0) {
    FRUGAL_CHECK_SHAPE(known > 0 && numel % known == 0, op, ": shape ", requested,
                       " is invalid for a tensor of shape ", from, " (", numel, " elements)");
    shape[infer] = numel / known;
  }
  FRUGAL_CHECK_SHAPE(shape.numel() == numel, op, ": shape ", requested, " is invalid for a tensor of shape ",
                     from, " (", numel, " elements)");
  return shape;
}

}  // namespace

namespace {

// Every view is made here: its shape must be valid for the dtype and its elements must lie inside the storage
// (Note [checked sizes]), so that no kernel can reach outside it.
Tensor make_view(const Tensor& x, const Shape& shape, const Shape& strides, int64_t element_offset,
                 const char* op) {
  FRUGAL_CHECK_SHAPE(shape.size() == strides.size(), op, ": shape ", shape, " and strides ", strides,
                     " differ in rank");
  const int64_t esize = x.element_size();
  checked_nbytes(shape, esize, op);
  int64_t offset = 0;
  bool ok = !__builtin_mul_overflow(element_offset, esize, &offset) &&
            !__builtin_add_overflow(offset, x.byte_offset(), &offset);
  // The lowest and one past the highest byte the view reaches, from its offset.
  int64_t lo = offset, hi = offset;
  bool nonempty = true;
  for (int64_t s : shape) nonempty = nonempty && s > 0;
  if (ok && nonempty) {
    ok = !__builtin_add_overflow(hi, esize, &hi);
    for (int d = 0; ok && d < shape.size(); ++d) {
      int64_t reach = 0;
      ok = !__builtin_mul_overflow(shape[d] - 1, strides[d], &reach) &&
           !__builtin_mul_overflow(reach, esize, &reach) &&
           !__builtin_add_overflow(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi);
    }
  }
  FRUGAL_CHECK_SHAPE(
      ok && (!nonempty || (lo >= 0 && hi <= x.storage()->nbytes())), op, ": a view of shape ", shape,
      " with strides ", strides, " at element offset ", element_offset, " of a tensor of shape ", x.shape(),
      " would reach outside its storage of ", x.storage()->nbytes(), " bytes",
      ok ? detail::str_cat(" (bytes ", lo, " to ", hi, ")") : std::string(" (int64 overflows)"));
  return Tensor(x.storage(), offset, shape, strides, x.dtype());
}

}  // namespace

namespace ops {

Tensor as_strided(const Tensor& x, const Shape& shape, const Shape& strides, int64_t element_offset) {
  return make_view(x, shape, strides, element_offset, "as_strided");
}

Tensor view(const Tensor& x, const Shape& requested) {
  const Shape shape = infer_shape(requested, x.numel(), x.shape(), "view");
  Shape st;
  FRUGAL_CHECK_SHAPE(view_strides(x.shape(), x.strides(), shape, st), "view: a tensor of shape ", x.shape(),
                     " with strides ", x.strides(), " cannot be viewed as ", shape,
                     " without a copy; use reshape() (which copies when needed) or contiguous() first");
  return make_view(x, shape, st, 0, "view");
}

Tensor reshape(const Tensor& x, const Shape& requested) {
  const Shape shape = infer_shape(requested, x.numel(), x.shape(), "reshape");
  Shape st;
  if (view_strides(x.shape(), x.strides(), shape, st)) return make_view(x, shape, st, 0, "reshape");
  return view(contiguous(x), shape);
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.dim() == 0) return reshape(x, {1});
  const int s = wrap_dim(start_dim, x.dim(), "flatten"), e = wrap_dim(end_dim, x.dim(), "flatten");
  FRUGAL_CHECK_INDEX(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim,
                     " for shape ", x.shape());
  Shape out;
  int64_t merged = 1;
  for (int i = 0; i < x.dim(); ++i) {
    if (i < s || i > e) out.push_back(x.shape()[i]);
    if (i >= s && i <= e) merged *= x.shape()[i];
    if (i == e) out.push_back(merged);
  }
  return reshape(x, out);
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  const int a = wrap_dim(dim0, x.dim(), "transpose"), b = wrap_dim(dim1, x.dim(), "transpose");
  if (x.dim() == 0) return x;
  Shape sh = x.shape(), st = x.strides();
  std::swap(sh[a], sh[b]);
  std::swap(st[a], st[b]);
  return make_view(x, sh, st, 0, "transpose");
}

Tensor permute(const Tensor& x, const Shape& dims) {
  FRUGAL_CHECK_SHAPE(dims.size() == x.dim(), "permute: expected ", x.dim(), " dims for a tensor of shape ",
                     x.shape(), ", got ", dims);
  Shape sh = x.shape(), st = x.strides();
  bool seen[kMaxDims] = {};
  for (int i = 0; i < dims.size(); ++i) {
    const int d = wrap_dim(dims[i], x.dim(), "permute");
    FRUGAL_CHECK_INDEX(!seen[d], "permute: dim ", dims[i], " appears twice in ", dims);
    seen[d] = true;
    sh[i] = x.shape()[d];
    st[i] = x.strides()[d];
  }
  return make_view(x, sh, st, 0, "permute");
}

Tensor narrow(const Tensor& x, int64_t dim_, int64_t start, int64_t length) {
  FRUGAL_CHECK_INDEX(x.dim() > 0, "narrow: cannot narrow a 0-d tensor");
  const int d = wrap_dim(dim_, x.dim(), "narrow");
  const int64_t n = x.shape()[d];
  if (start < 0) start += n;
  FRUGAL_CHECK_INDEX(start >= 0 && length >= 0 && start <= n && length <= n - start, "narrow: start ", start,
                     " and length ", length, " are out of range for dim ", dim_, " of size ", n, " (shape ",
                     x.shape(), ")");
  Shape sh = x.shape();
  sh[d] = length;
  return make_view(x, sh, x.strides(), start * x.strides()[d], "narrow");
}

Tensor slice(const Tensor& x, int64_t dim_, int64_t start, int64_t end, int64_t step) {
  FRUGAL_CHECK_INDEX(x.dim() > 0, "slice: cannot slice a 0-d tensor");
  FRUGAL_CHECK_INDEX(step > 0, "slice: step must be positive, got ", step);
  const int d = wrap_dim(dim_, x.dim(), "slice");
  const int64_t n = x.shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sh = x.shape(), st = x.strides();
  // Not (end - start + step - 1) / step, which overflows for a huge step. With one element or none the step
  // never applies (and step * stride may not fit).
  sh[d] = end > start ? (end - start - 1) / step + 1 : 0;
  st[d] = sh[d] > 1 ? x.strides()[d] * step : x.strides()[d];
  return make_view(x, sh, st, start * x.strides()[d], "slice");
}

Tensor select(const Tensor& x, int64_t dim_, int64_t index) {
  FRUGAL_CHECK_INDEX(x.dim() > 0, "select: cannot select from a 0-d tensor");
  const int d = wrap_dim(dim_, x.dim(), "select");
  const int64_t n = x.shape()[d];
  FRUGAL_CHECK_INDEX(index >= -n && index < n, "select: index ", index, " is out of range for dim ", dim_,
                     " of size ", n, " (shape ", x.shape(), ")");
  if (index < 0) index += n;
  Shape sh = x.shape(), st = x.strides();
  sh.erase(d);
  st.erase(d);
  return make_view(x, sh, st, index * x.strides()[d], "select");
}

Tensor expand(const Tensor& x, const Shape& requested) {
  FRUGAL_CHECK_SHAPE(requested.size() >= x.dim(), "expand: the target shape ", requested,
                     " has fewer dims than ", x.shape());
  const int lead = requested.size() - x.dim();
  Shape sh = requested, st = Shape::filled(requested.size(), 0);
  for (int i = 0; i < requested.size(); ++i) {
    if (i < lead) {
      FRUGAL_CHECK_SHAPE(requested[i] >= 0, "expand: a new leading dim cannot be -1, got ", requested);
      continue;
    }
    const int64_t have = x.shape()[i - lead];
    if (requested[i] == -1 || requested[i] == have) {
      sh[i] = have;
      st[i] = x.strides()[i - lead];
    } else {
      FRUGAL_CHECK_SHAPE(have == 1, "expand: cannot expand shape ", x.shape(), " to ", requested, " (dim ", i,
                         " has size ", have, "; only size-1 dims expand)");
    }
  }
  return make_view(x, sh, st, 0, "expand");
}

Tensor squeeze(const Tensor& x) {
  Shape sh, st;
  for (int i = 0; i < x.dim(); ++i)
    if (x.shape()[i] != 1) {
      sh.push_back(x.shape()[i]);
      st.push_back(x.strides()[i]);
    }
  return make_view(x, sh, st, 0, "squeeze");
}

Tensor squeeze(const Tensor& x, int64_t dim_) {
  if (x.dim() == 0) return x;
  const int d = wrap_dim(dim_, x.dim(), "squeeze");
  if (x.shape()[d] != 1) return x;
  Shape sh = x.shape(), st = x.strides();
  sh.erase(d);
  st.erase(d);
  return make_view(x, sh, st, 0, "squeeze");
}

Tensor unsqueeze(const Tensor& x, int64_t dim_) {
  FRUGAL_CHECK_SHAPE(x.dim() < kMaxDims, "unsqueeze: a tensor of shape ", x.shape(),
                     " already has the most dims, ", kMaxDims);
  const int d = wrap_dim(dim_, x.dim() + 1, "unsqueeze");
  Shape sh = x.shape(), st = x.strides();
  const int64_t s = d < x.dim() ? checked_mul(x.strides()[d], x.shape()[d], "unsqueeze", "the stride") : 1;
  sh.insert(d, 1);
  st.insert(d, s);
  return make_view(x, sh, st, 0, "unsqueeze");
}

Tensor contiguous(const Tensor& x) { return x.is_contiguous() ? x : clone(x); }

Tensor clone(const Tensor& x) {
  memory::OpScope op_scope("clone", x);  // Note [op names in the history]
  Tensor out = empty(x.shape(), x.options());
  copy_(out, x);
  return out;
}

Tensor to(const Tensor& x, DType t) { return t == x.dtype() ? x : cast(x, t); }

Tensor to(const Tensor& x, Device d) {
  memory::OpScope op_scope("to", x);  // Note [op names in the history]
  if (d == x.device()) return x;
  Tensor out = empty(x.shape(), x.options().device(d));  // throws DeviceError when that device has no backend
  copy_(out, x);
  return out;
}

}  // namespace ops

namespace {
// The cpu copy every read of values goes through: contiguous, of the dtype read.
Tensor readable(const Tensor& host, DType dtype) { return ops::contiguous(ops::cast(host, dtype)); }
}  // namespace

// What a read allocates, without reading: the dry run's stand-in (core/estimate.h).
void memory::detail::read_allocations(const Tensor& t, DType dtype) { (void)readable(t, dtype); }

template <typename T>
std::vector<T> Tensor::to_vector() const {
  FRUGAL_CHECK_T(DeviceError, !device().is_meta(), "to_vector/item: a meta tensor (shape ", shape(),
                 ") has no values; the meta device is for dry runs (Note [the meta device], core/device.h)");
  const Tensor host = device().is_cpu() ? *this : ops::to(*this, kCPU);
  const Tensor c = readable(host, dtype_v<T>);
  const T* p = static_cast<const T*>(c.raw_data());
  return std::vector<T>(p, p + c.numel());
}

template <typename T>
T Tensor::item() const {
  FRUGAL_CHECK(numel() == 1, "item: expected a tensor with one element, got shape ", shape());
  return to_vector<T>()[0];
}

#define FRUGAL_INSTANTIATE(T)                           \
  template std::vector<T> Tensor::to_vector<T>() const; \
  template T Tensor::item<T>() const;
FRUGAL_INSTANTIATE(float)
FRUGAL_INSTANTIATE(double)
FRUGAL_INSTANTIATE(Half)
FRUGAL_INSTANTIATE(BFloat16)
FRUGAL_INSTANTIATE(int64_t)
FRUGAL_INSTANTIATE(int32_t)
FRUGAL_INSTANTIATE(uint8_t)
FRUGAL_INSTANTIATE(bool)
#undef FRUGAL_INSTANTIATE

}  // namespace frugal

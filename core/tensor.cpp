// Tensor handles: metadata, views (which share storage) and element access.
#include "core/tensor.h"

#include <algorithm>
#include <cstring>

#include "core/ops.h"

namespace frugal {

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
  for (int d = old_shape.size() - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
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
      known *= shape[i];
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

Tensor Tensor::as_strided(const Shape& shape, const Shape& strides, int64_t element_offset) const {
  return Tensor(storage(), byte_offset() + element_offset * element_size(), shape, strides, dtype());
}

Tensor Tensor::view(const Shape& requested) const {
  const Shape shape = infer_shape(requested, numel(), this->shape(), "view");
  Shape st;
  FRUGAL_CHECK_SHAPE(view_strides(this->shape(), strides(), shape, st), "view: a tensor of shape ",
                     this->shape(), " with strides ", strides(), " cannot be viewed as ", shape,
                     " without a copy; use reshape() (which copies when needed) or contiguous() first");
  return as_strided(shape, st, 0);
}

Tensor Tensor::reshape(const Shape& requested) const {
  const Shape shape = infer_shape(requested, numel(), this->shape(), "reshape");
  Shape st;
  if (view_strides(this->shape(), strides(), shape, st)) return as_strided(shape, st, 0);
  return contiguous().view(shape);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  const int s = wrap_dim(start_dim, dim(), "flatten"), e = wrap_dim(end_dim, dim(), "flatten");
  FRUGAL_CHECK_INDEX(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim,
                     " for shape ", shape());
  Shape out;
  int64_t merged = 1;
  for (int i = 0; i < dim(); ++i) {
    if (i < s || i > e) out.push_back(shape()[i]);
    if (i >= s && i <= e) merged *= shape()[i];
    if (i == e) out.push_back(merged);
  }
  return reshape(out);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  const int a = wrap_dim(dim0, dim(), "transpose"), b = wrap_dim(dim1, dim(), "transpose");
  if (dim() == 0) return *this;
  Shape sh = shape(), st = strides();
  std::swap(sh[a], sh[b]);
  std::swap(st[a], st[b]);
  return as_strided(sh, st, 0);
}

Tensor Tensor::t() const {
  FRUGAL_CHECK_SHAPE(dim() <= 2, "t: expected a tensor of at most 2 dims, got shape ", shape(),
                     "; use transpose(dim0, dim1)");
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::permute(const Shape& dims) const {
  FRUGAL_CHECK_SHAPE(dims.size() == dim(), "permute: expected ", dim(), " dims for a tensor of shape ",
                     shape(), ", got ", dims);
  Shape sh = shape(), st = strides();
  bool seen[kMaxDims] = {};
  for (int i = 0; i < dims.size(); ++i) {
    const int d = wrap_dim(dims[i], dim(), "permute");
    FRUGAL_CHECK_INDEX(!seen[d], "permute: dim ", dims[i], " appears twice in ", dims);
    seen[d] = true;
    sh[i] = shape()[d];
    st[i] = strides()[d];
  }
  return as_strided(sh, st, 0);
}

Tensor Tensor::narrow(int64_t dim_, int64_t start, int64_t length) const {
  FRUGAL_CHECK_INDEX(dim() > 0, "narrow: cannot narrow a 0-d tensor");
  const int d = wrap_dim(dim_, dim(), "narrow");
  const int64_t n = shape()[d];
  if (start < 0) start += n;
  FRUGAL_CHECK_INDEX(start >= 0 && length >= 0 && start + length <= n, "narrow: start ", start,
                     " and length ", length, " are out of range for dim ", dim_, " of size ", n, " (shape ",
                     shape(), ")");
  Shape sh = shape();
  sh[d] = length;
  return as_strided(sh, strides(), start * strides()[d]);
}

Tensor Tensor::slice(int64_t dim_, int64_t start, int64_t end, int64_t step) const {
  FRUGAL_CHECK_INDEX(dim() > 0, "slice: cannot slice a 0-d tensor");
  FRUGAL_CHECK_INDEX(step > 0, "slice: step must be positive, got ", step);
  const int d = wrap_dim(dim_, dim(), "slice");
  const int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sh = shape(), st = strides();
  sh[d] = (end - start + step - 1) / step;
  st[d] = strides()[d] * step;
  return as_strided(sh, st, start * strides()[d]);
}

Tensor Tensor::select(int64_t dim_, int64_t index) const {
  FRUGAL_CHECK_INDEX(dim() > 0, "select: cannot select from a 0-d tensor");
  const int d = wrap_dim(dim_, dim(), "select");
  const int64_t n = shape()[d];
  FRUGAL_CHECK_INDEX(index >= -n && index < n, "select: index ", index, " is out of range for dim ", dim_,
                     " of size ", n, " (shape ", shape(), ")");
  if (index < 0) index += n;
  Shape sh = shape(), st = strides();
  sh.erase(d);
  st.erase(d);
  return as_strided(sh, st, index * strides()[d]);
}

Tensor Tensor::expand(const Shape& requested) const {
  FRUGAL_CHECK_SHAPE(requested.size() >= dim(), "expand: the target shape ", requested,
                     " has fewer dims than ", shape());
  const int lead = requested.size() - dim();
  Shape sh = requested, st = Shape::filled(requested.size(), 0);
  for (int i = 0; i < requested.size(); ++i) {
    if (i < lead) {
      FRUGAL_CHECK_SHAPE(requested[i] >= 0, "expand: a new leading dim cannot be -1, got ", requested);
      continue;
    }
    const int64_t have = shape()[i - lead];
    if (requested[i] == -1 || requested[i] == have) {
      sh[i] = have;
      st[i] = strides()[i - lead];
    } else {
      FRUGAL_CHECK_SHAPE(have == 1, "expand: cannot expand shape ", shape(), " to ", requested, " (dim ", i,
                         " has size ", have, "; only size-1 dims expand)");
    }
  }
  return as_strided(sh, st, 0);
}

Tensor Tensor::squeeze() const {
  Shape sh, st;
  for (int i = 0; i < dim(); ++i)
    if (shape()[i] != 1) {
      sh.push_back(shape()[i]);
      st.push_back(strides()[i]);
    }
  return as_strided(sh, st, 0);
}

Tensor Tensor::squeeze(int64_t dim_) const {
  if (dim() == 0) return *this;
  const int d = wrap_dim(dim_, dim(), "squeeze");
  if (shape()[d] != 1) return *this;
  Shape sh = shape(), st = strides();
  sh.erase(d);
  st.erase(d);
  return as_strided(sh, st, 0);
}

Tensor Tensor::unsqueeze(int64_t dim_) const {
  FRUGAL_CHECK_SHAPE(dim() < kMaxDims, "unsqueeze: a tensor of shape ", shape(),
                     " already has the most dims, ", kMaxDims);
  const int d = wrap_dim(dim_, dim() + 1, "unsqueeze");
  Shape sh = shape(), st = strides();
  const int64_t s = d < dim() ? strides()[d] * shape()[d] : 1;
  sh.insert(d, 1);
  st.insert(d, s);
  return as_strided(sh, st, 0);
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), options());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(DType t) const { return t == dtype() ? *this : cast(*this, t); }

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  Tensor out = empty(shape(), options().device(d));  // throws DeviceError when that device has no backend
  out.copy_(*this);
  return out;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  FRUGAL_CHECK(device().is_cpu(), "to_vector: the tensor is on ", device(), "; move it with .to(kCPU) first");
  const Tensor c = to(dtype_v<T>).contiguous();
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

// Methods that forward to the free functions of core/ops.h.
Tensor Tensor::operator-() const { return neg(*this); }
Tensor Tensor::sum() const { return frugal::sum(*this); }
Tensor Tensor::mean() const { return frugal::mean(*this); }
Tensor Tensor::sum(const Shape& dims, bool keepdim) const { return frugal::sum(*this, dims, keepdim); }
Tensor Tensor::mean(const Shape& dims, bool keepdim) const { return frugal::mean(*this, dims, keepdim); }
Tensor Tensor::matmul(const Tensor& other) const { return frugal::matmul(*this, other); }
Tensor& Tensor::add_(const Tensor& other) { return frugal::add_(*this, other); }
Tensor& Tensor::add_(Scalar other) { return frugal::add_(*this, other); }
Tensor& Tensor::sub_(const Tensor& other) { return frugal::sub_(*this, other); }
Tensor& Tensor::mul_(const Tensor& other) { return frugal::mul_(*this, other); }
Tensor& Tensor::mul_(Scalar other) { return frugal::mul_(*this, other); }
Tensor& Tensor::div_(const Tensor& other) { return frugal::div_(*this, other); }

}  // namespace frugal

// Shape storage, strides, dim wrapping and broadcasting.
#include "core/shape.h"

#include <sstream>

#include "core/error.h"

namespace frugal {

namespace {
void check_rank(size_t n) {
  FRUGAL_CHECK_SHAPE(n <= size_t(kMaxDims), "a tensor has at most ", kMaxDims, " dimensions, got ", n);
}
}  // namespace

Shape::Shape(std::initializer_list<int64_t> dims) {
  check_rank(dims.size());
  for (int64_t v : dims) d_[n_++] = v;
}

Shape::Shape(const std::vector<int64_t>& dims) {
  check_rank(dims.size());
  for (int64_t v : dims) d_[n_++] = v;
}

Shape Shape::filled(int n, int64_t value) {
  Shape s;
  s.resize(n, value);
  return s;
}

void Shape::push_back(int64_t v) {
  check_rank(size_t(n_) + 1);
  d_[n_++] = v;
}

void Shape::insert(int pos, int64_t v) {
  check_rank(size_t(n_) + 1);
  for (int i = n_; i > pos; --i) d_[i] = d_[i - 1];
  d_[pos] = v;
  ++n_;
}

void Shape::erase(int pos) {
  for (int i = pos; i + 1 < n_; ++i) d_[i] = d_[i + 1];
  --n_;
}

void Shape::resize(int n, int64_t fill) {
  check_rank(size_t(n));
  for (int i = n_; i < n; ++i) d_[i] = fill;
  n_ = uint8_t(n);
}

int64_t Shape::numel() const {
  int64_t n = 1, nonzero = 1;
  for (int i = 0; i < n_; ++i) {
    if (d_[i] != 0 && __builtin_mul_overflow(nonzero, d_[i], &nonzero)) [[unlikely]]
      throw ShapeError(detail::str_cat("numel: shape ", *this,
                                       " has more elements than int64 can count (the product of its nonzero "
                                       "sizes overflows); Note [checked sizes] in core/shape.h"));
    n *= d_[i];  // n is 0 or the nonzero product, which the check above just found to fit
  }
  return n;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << *this;
  return os.str();
}

bool operator==(const Shape& a, const Shape& b) {
  if (a.n_ != b.n_) return false;
  for (int i = 0; i < a.n_; ++i)
    if (a.d_[i] != b.d_[i]) return false;
  return true;
}

std::ostream& operator<<(std::ostream& os, const Shape& s) {
  os << '[';
  for (int i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  return os << ']';
}

int64_t checked_mul(int64_t a, int64_t b, const char* op, const char* what) {
  int64_t r;
  FRUGAL_CHECK_SHAPE(!__builtin_mul_overflow(a, b, &r), op, ": ", what, " ", a, " * ", b,
                     " overflows int64; Note [checked sizes] in core/shape.h");
  return r;
}

int64_t checked_nbytes(const Shape& shape, int64_t element_size, const char* op) {
  bool empty = false;
  for (int64_t s : shape) {
    FRUGAL_CHECK_SHAPE(s >= 0, op, ": sizes must be non-negative, got shape ", shape);
    empty = empty || s == 0;
  }
  int64_t nonzero = element_size;
  for (int64_t s : shape)
    FRUGAL_CHECK_SHAPE(s == 0 || !__builtin_mul_overflow(nonzero, s, &nonzero), op, ": shape ", shape, " of ",
                       element_size, "-byte elements needs more than 2^63 - 1 bytes",
                       empty ? " for its nonzero sizes (which must fit even though it is empty)" : "",
                       "; Note [checked sizes] in core/shape.h");
  return empty ? 0 : nonzero;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st = Shape::filled(shape.size(), 1);
  int64_t acc = 1;
  for (int i = shape.size() - 1; i >= 0; --i) {
    st[i] = acc;
    if (i > 0 && shape[i] > 1)
      FRUGAL_CHECK_SHAPE(!__builtin_mul_overflow(acc, shape[i], &acc),
                         "contiguous_strides: a stride of shape ", shape,
                         " overflows int64; Note [checked sizes] in core/shape.h");
  }
  return st;
}

int wrap_dim(int64_t dim, int ndim, const char* op) {
  const int64_t n = ndim > 0 ? ndim : 1;  // a 0-d tensor accepts dim 0 and -1, like PyTorch
  FRUGAL_CHECK_INDEX(dim >= -n && dim < n, op, ": dim ", dim, " is out of range for a tensor with ", ndim,
                     " dimension(s); valid dims are [", -n, ", ", n - 1, "]");
  return int(dim < 0 ? dim + n : dim);
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const int n = std::max(a.size(), b.size());
  Shape out = Shape::filled(n, 1);
  for (int i = 0; i < n; ++i) {
    const int ia = a.size() - n + i, ib = b.size() - n + i;
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    FRUGAL_CHECK_SHAPE(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b,
                       " cannot be broadcast together (dimension ", i - n, ": ", da, " vs ", db,
                       "); sizes must match or be 1");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace frugal

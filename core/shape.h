// Shape: a small fixed-capacity list of dimension sizes (also used for strides), stored inline so that making
// a tensor never heap-allocates for its metadata. Up to kMaxDims dimensions.
//
//   Shape s{2, 3, 4};  s.numel() == 24;  contiguous_strides(s) == Shape{12, 4, 1}
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

namespace frugal {

inline constexpr int kMaxDims = 8;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims);
  static Shape filled(int n, int64_t value);

  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t& operator[](int i) { return d_[i]; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t* begin() { return d_.data(); }
  int64_t* end() { return d_.data() + n_; }
  const int64_t* begin() const { return d_.data(); }
  const int64_t* end() const { return d_.data() + n_; }
  const int64_t* data() const { return d_.data(); }
  int64_t back() const { return d_[n_ - 1]; }

  void push_back(int64_t v);
  void insert(int pos, int64_t v);
  void erase(int pos);
  void resize(int n, int64_t fill = 0);

  // The product of the sizes (1 for a 0-d shape); throws ShapeError naming the shape when the product of its
  // nonzero sizes does not fit in int64 (Note [checked sizes]).
  int64_t numel() const;
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  std::string str() const;  // "[2, 3, 4]"

  friend bool operator==(const Shape& a, const Shape& b);
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  std::array<int64_t, kMaxDims> d_{};
  uint8_t n_ = 0;
};

std::ostream& operator<<(std::ostream& os, const Shape& s);

// Note [checked sizes]
// Sizes, strides and byte counts are int64, and a product of them can overflow: a file may declare a shape
// of [2^62, 0] or [2^61] f32, and a wrapped product would let a tensor of 2^62 elements own 0 bytes. So every
// product of sizes goes through checked_mul, and a tensor is valid only when each size is >= 0 and the
// product of its nonzero sizes times its element size fits in int64 (checked_nbytes). Then its numel, its
// nbytes, each contiguous stride and each byte offset inside it fit too, even when a size of 0 makes it empty
// (PyTorch asks the same of the nonzero sizes, for its strides). empty() checks this before allocating, and
// every view (core/tensor.cpp) checks its shape and that its elements lie inside its storage, so the kernels
// may multiply sizes and strides of any tensor they are given without checking.

// a * b; throws ShapeError "<op>: <what> <a> * <b> overflows int64" when it does not fit.
int64_t checked_mul(int64_t a, int64_t b, const char* op, const char* what);
// The bytes of a contiguous tensor of this shape: numel * element_size. Throws ShapeError naming op, the
// shape and the element size for a negative size, or when the product of the nonzero sizes times element_size
// does not fit in int64.
int64_t checked_nbytes(const Shape& shape, int64_t element_size, const char* op);
// Row-major strides (in elements) for a contiguous tensor of this shape (a size of 0 counts as 1, as in
// PyTorch); throws ShapeError naming the shape when one does not fit in int64.
Shape contiguous_strides(const Shape& shape);
// Maps a possibly negative dim into [0, ndim); throws IndexError naming op and shape when out of range.
int wrap_dim(int64_t dim, int ndim, const char* op);
// NumPy broadcasting of two shapes; throws ShapeError naming op and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace frugal

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

  int64_t numel() const;  // product of the sizes; 1 for a 0-d shape
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  std::string str() const;  // "[2, 3, 4]"

  friend bool operator==(const Shape& a, const Shape& b);
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  std::array<int64_t, kMaxDims> d_{};
  uint8_t n_ = 0;
};

std::ostream& operator<<(std::ostream& os, const Shape& s);

// Row-major strides (in elements) for a contiguous tensor of this shape.
Shape contiguous_strides(const Shape& shape);
// Maps a possibly negative dim into [0, ndim); throws IndexError naming op and shape when out of range.
int wrap_dim(int64_t dim, int ndim, const char* op);
// NumPy broadcasting of two shapes; throws ShapeError naming op and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace frugal

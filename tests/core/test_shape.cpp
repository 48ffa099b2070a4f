// Tests of Shape (core/shape.h): the inline dim list, row-major strides, dim wrapping and broadcasting.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "core/error.h"
#include "core/shape.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_exact_error;

TEST(Shape, ConstructionAndAccess) {
  const Shape s{2, 3, 4};
  EXPECT_EQ(s.size(), 3);
  EXPECT_FALSE(s.empty());
  EXPECT_EQ(s[0], 2);
  EXPECT_EQ(s[1], 3);
  EXPECT_EQ(s[2], 4);
  EXPECT_EQ(s.back(), 4);
  EXPECT_EQ(s.vec(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(Shape(std::vector<int64_t>{2, 3, 4}), s);
  EXPECT_EQ(std::vector<int64_t>(s.begin(), s.end()), (std::vector<int64_t>{2, 3, 4}));

  const Shape scalar;
  EXPECT_EQ(scalar.size(), 0);
  EXPECT_TRUE(scalar.empty());
  EXPECT_EQ(scalar.begin(), scalar.end());
  EXPECT_EQ(Shape::filled(3, 7), (Shape{7, 7, 7}));
  EXPECT_EQ(Shape::filled(0, 7), Shape{});
}

TEST(Shape, Numel) {
  EXPECT_EQ((Shape{2, 3, 4}).numel(), 24);
  EXPECT_EQ(Shape{}.numel(), 1);  // a 0-d tensor holds one element
  EXPECT_EQ((Shape{5}).numel(), 5);
  EXPECT_EQ((Shape{2, 0, 3}).numel(), 0);
  EXPECT_EQ((Shape{1, 1, 1, 1, 1, 1, 1, 1}).numel(), 1);
  EXPECT_EQ((Shape{1 << 20, 1 << 20}).numel(), int64_t(1) << 40);  // no 32-bit overflow
}

TEST(Shape, Mutation) {
  Shape s{2, 3};
  s.push_back(4);
  EXPECT_EQ(s, (Shape{2, 3, 4}));
  s.insert(0, 9);
  EXPECT_EQ(s, (Shape{9, 2, 3, 4}));
  s.insert(2, 8);
  EXPECT_EQ(s, (Shape{9, 2, 8, 3, 4}));
  s.insert(5, 7);  // at the end
  EXPECT_EQ(s, (Shape{9, 2, 8, 3, 4, 7}));
  s.erase(0);
  EXPECT_EQ(s, (Shape{2, 8, 3, 4, 7}));
  s.erase(4);
  EXPECT_EQ(s, (Shape{2, 8, 3, 4}));
  s.erase(1);
  EXPECT_EQ(s, (Shape{2, 3, 4}));
  s.resize(5, 1);
  EXPECT_EQ(s, (Shape{2, 3, 4, 1, 1}));
  s.resize(2);
  EXPECT_EQ(s, (Shape{2, 3}));
  s[1] = 6;
  EXPECT_EQ(s, (Shape{2, 6}));
}

TEST(Shape, EqualityComparesRankAndSizes) {
  EXPECT_EQ((Shape{2, 3}), (Shape{2, 3}));
  EXPECT_NE((Shape{2, 3}), (Shape{3, 2}));
  EXPECT_NE((Shape{2, 3}), (Shape{2, 3, 1}));
  EXPECT_NE(Shape{}, (Shape{1}));
  // Entries beyond size() must not take part: a shrunk shape equals a freshly built one.
  Shape shrunk{2, 3, 4};
  shrunk.resize(2);
  EXPECT_EQ(shrunk, (Shape{2, 3}));
  shrunk.erase(1);
  EXPECT_EQ(shrunk, (Shape{2}));
}

TEST(Shape, Printing) {
  EXPECT_EQ((Shape{2, 3, 4}).str(), "[2, 3, 4]");
  EXPECT_EQ((Shape{7}).str(), "[7]");
  EXPECT_EQ(Shape{}.str(), "[]");
  EXPECT_EQ((Shape{-1, 0}).str(), "[-1, 0]");
  std::ostringstream os;
  os << Shape{5, 6};
  EXPECT_EQ(os.str(), "[5, 6]");
}

TEST(Shape, AtMostEightDims) {
  const Shape eight{1, 2, 1, 2, 1, 2, 1, 2};
  EXPECT_EQ(eight.size(), kMaxDims);
  expect_exact_error<ShapeError>([] { Shape s{1, 1, 1, 1, 1, 1, 1, 1, 1}; }, {"at most 8", "9"});
  expect_exact_error<ShapeError>([] { Shape s(std::vector<int64_t>(10, 1)); }, {"at most 8", "10"});
  expect_exact_error<ShapeError>(
      [&] {
        Shape s = eight;
        s.push_back(1);
      },
      {"at most 8", "9"});
  expect_exact_error<ShapeError>(
      [&] {
        Shape s = eight;
        s.insert(0, 1);
      },
      {"at most 8", "9"});
  expect_exact_error<ShapeError>(
      [] {
        Shape s;
        s.resize(9);
      },
      {"at most 8", "9"});
  expect_exact_error<ShapeError>([] { Shape::filled(12, 1); }, {"at most 8", "12"});
}

// Row-major strides written the obvious way: the stride of dim d is the product of the sizes after it (a size
// of 0 counts as 1, as in PyTorch, so that strides stay positive).
Shape reference_strides(const Shape& shape) {
  Shape st = Shape::filled(shape.size(), 0);
  for (int d = 0; d < shape.size(); ++d) {
    int64_t p = 1;
    for (int e = d + 1; e < shape.size(); ++e) p *= shape[e] == 0 ? 1 : shape[e];
    st[d] = p;
  }
  return st;
}

TEST(ContiguousStrides, HandPicked) {
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Shape{12, 4, 1}));
  EXPECT_EQ(contiguous_strides({5}), (Shape{1}));
  EXPECT_EQ(contiguous_strides({}), Shape{});
  EXPECT_EQ(contiguous_strides({3, 1, 2}), (Shape{2, 2, 1}));
  EXPECT_EQ(contiguous_strides({2, 0, 3}), (Shape{3, 3, 1}));  // matches torch.empty(2, 0, 3).stride()
}

// Note [checked sizes]: products of sizes never wrap, also through a size of 0.
TEST(Shape, NumelAndStridesRefuseWhatOverflowsInt64) {
  const int64_t big = int64_t(1) << 62;
  expect_exact_error<ShapeError>([&] { (Shape{big, 4}).numel(); }, {"numel", "[4611686018427387904, 4]"});
  expect_exact_error<ShapeError>(
      [&] {
        (Shape{big, big, 0}).numel();
      },
      {"numel", "[4611686018427387904, 4611686018427387904, 0]", "nonzero"});
  EXPECT_EQ((Shape{big, 0}).numel(), 0);
  EXPECT_EQ((Shape{big, 1}).numel(), big);
  EXPECT_EQ(contiguous_strides({4, big, 0}), (Shape{big, 1, 1}));
  expect_exact_error<ShapeError>(
      [&] {
        contiguous_strides({2, big, big, 0});
      },
      {"contiguous_strides", "[2, 4611686018427387904, 4611686018427387904, 0]"});
  EXPECT_EQ(checked_mul(big, 1, "op", "size"), big);
  expect_exact_error<ShapeError>([&] { checked_mul(big, 2, "op", "size"); },
                                 {"op: size 4611686018427387904 * 2 overflows"});
  EXPECT_EQ(checked_nbytes({big, 0}, 1, "op"), 0);
  EXPECT_EQ(checked_nbytes({3, 5}, 8, "op"), 120);
  expect_exact_error<ShapeError>(
      [&] {
        checked_nbytes({big, 0}, 2, "op");
      },
      {"op: shape [4611686018427387904, 0] of 2-byte elements", "even though it is empty"});
  expect_exact_error<ShapeError>(
      [&] {
        checked_nbytes({3, -1}, 2, "op");
      },
      {"op", "non-negative", "[3, -1]"});
}

TEST(ContiguousStrides, RandomShapesMatchReference) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Shape s;
    const int rank = int(rng() % 9);
    for (int d = 0; d < rank; ++d) s.push_back(int64_t(rng() % 6));
    EXPECT_EQ(contiguous_strides(s), reference_strides(s)) << "shape " << s;
  }
}

TEST(WrapDim, PositiveAndNegative) {
  for (int ndim = 1; ndim <= kMaxDims; ++ndim) {
    for (int d = 0; d < ndim; ++d) {
      EXPECT_EQ(wrap_dim(d, ndim, "op"), d);
      EXPECT_EQ(wrap_dim(d - ndim, ndim, "op"), d);  // -1 is the last dim, -ndim the first
    }
  }
  // A 0-d tensor accepts 0 and -1, like PyTorch.
  EXPECT_EQ(wrap_dim(0, 0, "op"), 0);
  EXPECT_EQ(wrap_dim(-1, 0, "op"), 0);
}

TEST(WrapDim, OutOfRangeNamesOpDimAndRange) {
  expect_exact_error<IndexError>([] { wrap_dim(3, 3, "softmax"); },
                                 {"softmax", "dim 3", "3 dimension", "[-3, 2]"});
  expect_exact_error<IndexError>([] { wrap_dim(-4, 3, "sum"); }, {"sum", "dim -4", "[-3, 2]"});
  expect_exact_error<IndexError>([] { wrap_dim(1, 0, "select"); }, {"select", "dim 1", "0 dimension"});
  expect_exact_error<IndexError>([] { wrap_dim(-2, 0, "select"); }, {"select", "dim -2"});
}

TEST(BroadcastShapes, HandPicked) {
  EXPECT_EQ(broadcast_shapes({2, 3}, {2, 3}, "add"), (Shape{2, 3}));
  EXPECT_EQ(broadcast_shapes({2, 3}, {3}, "add"), (Shape{2, 3}));
  EXPECT_EQ(broadcast_shapes({3}, {2, 3}, "add"), (Shape{2, 3}));
  EXPECT_EQ(broadcast_shapes({2, 1}, {1, 3}, "add"), (Shape{2, 3}));
  EXPECT_EQ(broadcast_shapes({4, 1, 5}, {3, 1}, "add"), (Shape{4, 3, 5}));
  EXPECT_EQ(broadcast_shapes({}, {2, 3}, "add"), (Shape{2, 3}));
  EXPECT_EQ(broadcast_shapes({}, {}, "add"), Shape{});
  EXPECT_EQ(broadcast_shapes({0}, {1}, "add"), (Shape{0}));  // size 0 broadcasts against 1, like NumPy
  EXPECT_EQ(broadcast_shapes({2, 0}, {0}, "add"), (Shape{2, 0}));
  EXPECT_EQ(broadcast_shapes({1, 1, 1, 1, 1, 1, 1, 7}, {6, 1}, "add"), (Shape{1, 1, 1, 1, 1, 1, 6, 7}));
}

TEST(BroadcastShapes, RandomPairsMatchDefinition) {
  // Build the result first, then derive operands from it by dropping leading dims and setting sizes to 1
  // (sizes >= 2 so that a 1 is always a broadcast): they must broadcast back to it, in either order.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    Shape out;
    const int rank = int(rng() % 6);
    for (int d = 0; d < rank; ++d) out.push_back(int64_t(2 + rng() % 4));
    Shape a, b;
    const int drop = int(rng() % (rank + 1));
    for (int d = drop; d < rank; ++d) a.push_back(rng() % 2 ? 1 : out[d]);
    // b keeps every dim of `out` that a has reduced to 1 or dropped, so that together they reach `out`.
    for (int d = 0; d < rank; ++d) b.push_back(d >= drop && a[d - drop] == out[d] && rng() % 2 ? 1 : out[d]);
    EXPECT_EQ(broadcast_shapes(a, b, "op"), out) << a << " with " << b;
    EXPECT_EQ(broadcast_shapes(b, a, "op"), out) << b << " with " << a;
  }
}

TEST(BroadcastShapes, MismatchNamesOpBothShapesAndTheDim) {
  expect_exact_error<ShapeError>(
      [] {
        broadcast_shapes({2, 3}, {4}, "add");
      },
      {"add", "[2, 3]", "[4]", "3 vs 4", "must match or be 1"});
  expect_exact_error<ShapeError>(
      [] {
        broadcast_shapes({5, 2, 3}, {4, 3}, "mul");
      },
      {"mul", "[5, 2, 3]", "[4, 3]", "dimension -2", "2 vs 4"});
  expect_exact_error<ShapeError>([] { broadcast_shapes({2}, {0}, "where"); }, {"where", "[2]", "[0]"});
}

}  // namespace
}  // namespace frugal

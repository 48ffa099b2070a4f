// Indexing and joining against loops written from the definitions: index_select, gather, scatter_add, cat,
// stack, one_hot; every dtype, negative indices, non-contiguous inputs, and bad inputs.
#include <limits>
#include <string>
#include <vector>

#include "core/ops.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::uniform;

const DType kAll[] = {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8};

TEST(IndexSelect, EveryDimAndDtype) {
  for (DType t : kAll)
    for (int d = 0; d < 3; ++d) {
      const Tensor x = uniform({4, 5, 6}, 0, 50, DType::F32, 41).to(t);
      const Tensor idx = tensor<int64_t>({2, 0, -1, 2});
      const Tensor y = index_select(x, d, idx);
      Shape expect = x.shape();
      expect[d] = 4;
      ASSERT_EQ(y.shape(), expect);
      const auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
      for (int64_t i = 0; i < y.numel(); ++i) {
        auto p = testing::unravel(i, y.shape());
        int64_t k = std::vector<int64_t>{2, 0, -1, 2}[size_t(p[size_t(d)])];
        p[size_t(d)] = k < 0 ? k + x.shape()[d] : k;
        EXPECT_EQ(yv[size_t(i)], xv[size_t((p[0] * 5 + p[1]) * 6 + p[2])]) << dtype_name(t) << " dim " << d;
      }
    }
}

TEST(IndexSelect, NonContiguousAndI32Index) {
  const Tensor x = uniform({6, 8}, -1, 1).t();  // [8, 6]
  const Tensor y = index_select(x, 0, tensor<int32_t>({7, 1}));
  EXPECT_EQ(y.to_vector<float>(),
            cat({x.select(0, 7).unsqueeze(0), x.select(0, 1).unsqueeze(0)}, 0).to_vector<float>());
}

TEST(Gather, MatchesDefinition) {
  for (DType t : {DType::F32, DType::I64, DType::BF16}) {
    const Tensor x = uniform({3, 4, 5}, 0, 100, DType::F32, 42).to(t);
    for (int d = 0; d < 3; ++d) {
      Shape is = x.shape();
      is[d] = 7;
      is[(d + 1) % 3] -= 1;  // index may be smaller than x outside dim
      const Tensor idx = randint(-x.shape()[d], x.shape()[d], is);
      const Tensor y = gather(x, d, idx);
      ASSERT_EQ(y.shape(), is);
      const auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
      const auto iv = idx.to_vector<int64_t>();
      for (int64_t i = 0; i < y.numel(); ++i) {
        auto p = testing::unravel(i, is);
        const int64_t k = iv[size_t(i)];
        p[size_t(d)] = k < 0 ? k + x.shape()[d] : k;
        EXPECT_EQ(yv[size_t(i)], xv[size_t((p[0] * 4 + p[1]) * 5 + p[2])]);
      }
    }
  }
}

TEST(ScatterAdd, AccumulatesDuplicates) {
  for (DType t : {DType::F32, DType::F64, DType::I64, DType::I32}) {
    const Tensor x = uniform({3, 5}, 0, 10, DType::F32, 43).to(t);
    const Tensor src = uniform({3, 4}, 0, 10, DType::F32, 44).to(t);
    const Tensor idx = tensor<int64_t>({0, 0, 4, -1, 1, 2, 2, 2, 3, 3, 0, 1}, {3, 4});
    const Tensor y = scatter_add(x, 1, idx, src);
    std::vector<double> expect = x.to_vector<double>();
    const auto sv = src.to_vector<double>();
    const auto iv = idx.to_vector<int64_t>();
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t c = 0; c < 4; ++c) {
        const int64_t k = iv[size_t(r * 4 + c)];
        expect[size_t(r * 5 + (k < 0 ? k + 5 : k))] += sv[size_t(r * 4 + c)];
      }
    testing::expect_close(y, expect, testing::tol_for(t), std::string("scatter_add ") + dtype_name(t));
    EXPECT_NE(x.to_vector<double>(), expect);  // the input is not modified
  }
  // Along dim 0, with src larger than the index (only the index's part is used).
  const Tensor z = scatter_add(zeros({2, 3}), 0, tensor<int64_t>({1, 0, 1}, {1, 3}), ones({2, 3}));
  EXPECT_EQ(z.to_vector<float>(), (std::vector<float>{0, 1, 0, 1, 0, 1}));
}

// scatter_add and index_add on integers past the range wrap (Note [integer overflow wraps] in
// kernels/math.h). Under the sanitizers' build this failed before they wrapped.
TEST(ScatterAdd, IntegerSumsWrap) {
  const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  const Tensor x = tensor<int64_t>({hi, lo});
  const Tensor index = tensor<int64_t>({0, 1, 1});
  const Tensor src = tensor<int64_t>({1, -1, lo});
  EXPECT_EQ(scatter_add(x, 0, index, src).to_vector<int64_t>(), (std::vector<int64_t>{lo, -1}));
  EXPECT_EQ(ops::index_add(x, 0, index, src).to_vector<int64_t>(), (std::vector<int64_t>{lo, -1}));
  const int32_t lo32 = std::numeric_limits<int32_t>::min(), hi32 = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(
      ops::index_add(tensor<int32_t>({hi32, lo32}), 0, tensor<int64_t>({0, 1}), tensor<int32_t>({hi32, lo32}))
          .to_vector<int32_t>(),
      (std::vector<int32_t>{-2, 0}));
}

// index_add (index_select's gradient) against a loop from the definition, along each dim of a 3-d tensor,
// with duplicate and negative indices; its bad inputs.
TEST(IndexAdd, MatchesDefinitionAndAccumulatesDuplicates) {
  const Tensor index = tensor<int64_t>({2, 0, 2, -1, 1, 2});
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::I64})
    for (int d = 0; d < 3; ++d) {
      Shape xs{3, 4, 5}, ss = xs;
      ss[d] = 6;
      const Tensor x = uniform(xs, 0, 10, DType::F32, 47).to(t),
                   src = uniform(ss, 0, 10, DType::F32, 48).to(t);
      const Tensor y = ops::index_add(x, d, index, src);
      std::vector<double> expect = x.to_vector<double>();
      const auto sv = src.to_vector<double>();
      const auto iv = index.to_vector<int64_t>();
      for (int64_t p = 0; p < src.numel(); ++p) {
        auto at = testing::unravel(p, ss);
        const int64_t k = iv[size_t(at[size_t(d)])];
        at[size_t(d)] = k < 0 ? k + xs[d] : k;
        expect[size_t((at[0] * 4 + at[1]) * 5 + at[2])] += sv[size_t(p)];
      }
      const testing::Tol tol = t == DType::BF16 ? testing::Tol{0.15, 1e-2} : testing::tol_for(t);
      testing::expect_close(y, expect, tol,
                            std::string("index_add ") + dtype_name(t) + " dim " + std::to_string(d));
    }
  // The gradient of index_select is index_add's: duplicates sum.
  const Tensor w = uniform({4, 3}, -1, 1, DType::F64, 49).requires_grad_();
  sum(index_select(w, 0, tensor<int64_t>({1, 1, 3}))).backward();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{0, 0, 0, 2, 2, 2, 0, 0, 0, 1, 1, 1}));
  expect_error<ShapeError>(
      [] {
        ops::index_add(zeros({3, 4}), 0, tensor<int64_t>({0, 1}), ones({3, 4}));
      },
      {"index_add", "[3, 4]", "[2, 4]"});
  expect_error<IndexError>(
      [] {
        ops::index_add(zeros({3, 4}), 0, tensor<int64_t>({0, 3}), ones({2, 4}));
      },
      {"index_add", "3"});
  expect_error<DTypeError>(
      [] {
        ops::index_add(zeros({3, 4}), 0, tensor<int64_t>({0}), ones({1, 4}, DType::F64));
      },
      {"index_add", "f64"});
}

TEST(CatStack, MatchesDefinition) {
  const Tensor a = uniform({2, 3}, -1, 1, DType::F32, 45), b = uniform({4, 3}, -1, 1, DType::F32, 46);
  const Tensor c = cat({a, b}, 0);
  ASSERT_EQ(c.shape(), (Shape{6, 3}));
  auto av = a.to_vector<float>(), bv = b.to_vector<float>();
  av.insert(av.end(), bv.begin(), bv.end());
  EXPECT_EQ(c.to_vector<float>(), av);
  const Tensor c1 = cat({a.t(), b.t()}, -1);  // non-contiguous inputs, joined along the last dim
  EXPECT_EQ(c1.shape(), (Shape{3, 6}));
  EXPECT_EQ(c1.t().contiguous().to_vector<float>(), av);
  EXPECT_EQ(cat({a, b.to(DType::F64)}, 0).dtype(), DType::F64);  // promotes
  const Tensor s = stack({a, a * 2.0, a * 3.0}, 1);
  ASSERT_EQ(s.shape(), (Shape{2, 3, 3}));
  for (int k = 0; k < 3; ++k)
    EXPECT_EQ(s.select(1, k).contiguous().to_vector<float>(), (a * double(k + 1)).to_vector<float>());
  EXPECT_EQ(stack({scalar_tensor(1), scalar_tensor(2)}).to_vector<float>(), (std::vector<float>{1, 2}));
}

TEST(OneHot, MatchesDefinition) {
  const Tensor i = tensor<int64_t>({2, 0, 1, 2}, {2, 2});
  const Tensor o = one_hot(i);
  ASSERT_EQ(o.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(o.dtype(), DType::I64);
  EXPECT_EQ(o.to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1}));
  EXPECT_EQ(one_hot(tensor<int32_t>({1}), 4).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 0, 0}));
}

// A 0-d tensor is one value: index_select and index_add take an index of exactly one value there. An index of
// two values once wrote two elements into the one-element output (past it), and an empty one left the
// output unwritten (both found by the ops fuzz target, tests/fuzz/ops_target.cpp).
TEST(Index, AZeroDimTensorTakesAnIndexOfOneValue) {
  const Tensor x = tensor<float>({2.5f}, Shape{});
  EXPECT_EQ(index_select(x, 0, tensor<int64_t>({0})).item<float>(), 2.5f);
  EXPECT_EQ(index_select(x, -1, tensor<int64_t>({-1}, Shape{})).item<float>(), 2.5f);
  for (const Tensor& index : {tensor<int64_t>({0, 0}), zeros({0}, DType::I64)}) {
    expect_error<ShapeError>([&] { index_select(x, 0, index); },
                             {"index_select", "0-d", "one value", std::to_string(index.numel())});
    expect_error<ShapeError>([&] { ops::index_add(x, 0, index, tensor<float>({1.f}, Shape{})); },
                             {"index_add", "0-d", "one value"});
  }
  EXPECT_EQ(ops::index_add(x, 0, tensor<int64_t>({0}), tensor<float>({1.f}, Shape{})).item<float>(), 3.5f);
  // one_hot infers max + 1 classes: not past the largest i64.
  expect_error<IndexError>([] { one_hot(tensor<int64_t>({std::numeric_limits<int64_t>::max()})); },
                           {"one_hot", "9223372036854775807", "num_classes"});
}

TEST(Index, BadInputs) {
  expect_error<IndexError>(
      [] {
        index_select(ones({3, 4}), 1, tensor<int64_t>({0, 4}));
      },
      {"index_select", "index 4", "dim 1 of size 4", "[3, 4]"});
  expect_error<IndexError>(
      [] {
        index_select(ones({3, 4}), 0, tensor<int64_t>({-4}));
      },
      {"index_select", "-4"});
  expect_error<DTypeError>([] { index_select(ones({3}), 0, tensor<float>({0.f})); },
                           {"index_select", "i64", "f32"});
  expect_error<ShapeError>(
      [] {
        index_select(ones({3}), 0, zeros({1, 1}, DType::I64));
      },
      {"index_select", "1-d"});
  expect_error<IndexError>([] { index_select(ones({3}), 1, tensor<int64_t>({0})); },
                           {"index_select", "dim 1"});
  expect_error<ShapeError>(
      [] {
        gather(ones({3, 4}), 1, zeros({3}, DType::I64));
      },
      {"gather", "[3]", "[3, 4]"});
  expect_error<IndexError>(
      [] {
        gather(ones({3, 4}), 0, full({1, 1}, 3, DType::I64));
      },
      {"gather", "index 3"});
  expect_error<ShapeError>(
      [] {
        scatter_add(ones({3, 4}), 1, zeros({2, 4}, DType::I64), ones({3, 4}));
      },
      {"scatter_add", "[2, 4]"});
  expect_error<ShapeError>([] { cat({ones({2, 3}), ones({2, 4})}, 0); }, {"cat", "[2, 4]", "[2, 3]"});
  expect_error<Error>([] { cat({}, 0); }, {"cat", "at least one"});
  expect_error<ShapeError>([] { stack({ones({2}), ones({3})}); }, {"stack", "[3]", "[2]"});
  expect_error<IndexError>([] { one_hot(tensor<int64_t>({0, 3}), 3); }, {"one_hot", "[0, 3)"});
  expect_error<DTypeError>([] { one_hot(ones({2})); }, {"one_hot", "integer"});
}

// ops::integer_range on the CPU (its one-copy GPU form: tests/cuda/test_index_optim.cpp): both ends of i64,
// i32 and u8, a strided view, and bad inputs.
TEST(IntegerRange, MinAndMaxOfEveryIntegerDtypeAndView) {
  const std::vector<int64_t> v = {3, INT64_MIN, 7, INT64_MAX, -2, 0};
  const Tensor x = tensor<int64_t>(v);
  EXPECT_EQ(ops::integer_range(x), std::make_pair(INT64_MIN, INT64_MAX));
  // Every other element: 3, 7, -2.
  EXPECT_EQ(ops::integer_range(x.reshape({3, 2}).select(1, 0)), std::make_pair(int64_t(-2), int64_t(7)));
  EXPECT_EQ(ops::integer_range(tensor<int32_t>({-4, 8, 1})), std::make_pair(int64_t(-4), int64_t(8)));
  EXPECT_EQ(ops::integer_range(tensor<int32_t>({5}).to(DType::U8)), std::make_pair(int64_t(5), int64_t(5)));
  expect_error<Error>([] { ops::integer_range(tensor<int64_t>(std::vector<int64_t>{})); },
                      {"integer_range", "non-empty"});
  expect_error<DTypeError>([] { ops::integer_range(ones({2})); }, {"integer_range", "integer", "f32"});
}

}  // namespace
}  // namespace frugal

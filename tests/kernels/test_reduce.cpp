// Reductions against a naive reference that visits every element in f64: all dims subsets, keepdim,
// non-contiguous inputs, every dtype, the parallel and column-accumulating paths, and bad inputs.
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <type_traits>

#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::tol_for;
using testing::uniform;

enum class Kind { Sum, Mean, Max, Min, Var, ArgMax, ArgMin };

// Groups every element by its output position (the multi-index with reduced dims removed), then reduces.
std::vector<double> reference(const Tensor& x, const std::vector<int>& dims, Kind kind,
                              int64_t correction = 1) {
  const auto v = x.to_vector<double>();
  std::map<std::vector<int64_t>, std::vector<double>> groups;
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto idx = testing::unravel(i, x.shape());
    std::vector<int64_t> key;
    for (int d = 0; d < x.dim(); ++d)
      if (std::find(dims.begin(), dims.end(), d) == dims.end()) key.push_back(idx[size_t(d)]);
    groups[key].push_back(v[size_t(i)]);
  }
  std::vector<double> out;
  for (const auto& [key, g] : groups) {
    double r = 0;
    switch (kind) {
      case Kind::Sum:
      case Kind::Mean:
        for (double e : g) r += e;
        if (kind == Kind::Mean) r /= double(g.size());
        break;
      case Kind::Max:
        r = *std::max_element(g.begin(), g.end());
        break;
      case Kind::Min:
        r = *std::min_element(g.begin(), g.end());
        break;
      case Kind::ArgMax:
        r = double(std::max_element(g.begin(), g.end()) - g.begin());
        break;
      case Kind::ArgMin:
        r = double(std::min_element(g.begin(), g.end()) - g.begin());
        break;
      case Kind::Var: {
        double m = 0;
        for (double e : g) m += e;
        m /= double(g.size());
        for (double e : g) r += (e - m) * (e - m);
        r /= double(int64_t(g.size()) - correction);
      }
    }
    out.push_back(r);
  }
  return out;
}

Shape to_shape(const std::vector<int>& dims) {
  Shape s;
  for (int d : dims) s.push_back(d);
  return s;
}

// Tolerance for a reduction of n elements stored in t (the 16-bit results round once at the end).
testing::Tol reduce_tol(DType t) {
  testing::Tol tol = tol_for(t);
  if (t == DType::F32) tol = {1e-4, 1e-5};
  return tol;
}

const std::vector<std::vector<int>> kDimSets = {{}, {0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1, 2}};

TEST(Reduce, SumMeanMaxMinVarEveryDimSetAndDtype) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16})
    for (const auto& dims : kDimSets)
      for (bool keepdim : {false, true}) {
        const Tensor x = uniform({5, 6, 7}, -2, 2, t);
        const std::vector<int> all = dims.empty() ? std::vector<int>{0, 1, 2} : dims;
        const std::string what = std::string(dtype_name(t)) + " dims " + to_shape(dims).str();
        const Tensor s = sum(x, to_shape(dims), keepdim);
        EXPECT_EQ(s.dim(), keepdim ? 3 : 3 - int(all.size())) << what;
        expect_close(s, reference(x, all, Kind::Sum), reduce_tol(t), "sum " + what);
        expect_close(mean(x, to_shape(dims), keepdim), reference(x, all, Kind::Mean), reduce_tol(t),
                     "mean " + what);
        expect_close(max(x, to_shape(dims), keepdim), reference(x, all, Kind::Max), tol_for(t),
                     "max " + what);
        expect_close(min(x, to_shape(dims), keepdim), reference(x, all, Kind::Min), tol_for(t),
                     "min " + what);
        expect_close(var(x, to_shape(dims), 1, keepdim), reference(x, all, Kind::Var), reduce_tol(t),
                     "var " + what);
        expect_close(var(x, to_shape(dims), 0, keepdim), reference(x, all, Kind::Var, 0), reduce_tol(t),
                     "var0 " + what);
      }
}

TEST(Reduce, NonContiguousInputs) {
  const Tensor base = uniform({6, 8, 10}, -2, 2);
  for (const Tensor& x : {base.permute({2, 0, 1}), base.slice(2, 1, 10, 2).transpose(0, 1)}) {
    ASSERT_FALSE(x.is_contiguous());
    for (const auto& dims : kDimSets) {
      const std::vector<int> all = dims.empty() ? std::vector<int>{0, 1, 2} : dims;
      expect_close(sum(x, to_shape(dims)), reference(x, all, Kind::Sum), reduce_tol(DType::F32),
                   "sum strided");
      expect_close(max(x, to_shape(dims)), reference(x, all, Kind::Max), tol_for(DType::F32), "max strided");
      expect_close(var(x, to_shape(dims)), reference(x, all, Kind::Var), reduce_tol(DType::F32),
                   "var strided");
    }
  }
}

TEST(Reduce, ArgMaxArgMin) {
  const Tensor x = uniform({4, 9, 5}, -1, 1, DType::F32, 11);
  for (int d = 0; d < 3; ++d) {
    const Tensor a = argmax(x, d);
    EXPECT_EQ(a.dtype(), DType::I64);
    EXPECT_EQ(a.to_vector<double>(), reference(x, {d}, Kind::ArgMax)) << d;
    EXPECT_EQ(argmin(x, d).to_vector<double>(), reference(x, {d}, Kind::ArgMin)) << d;
    EXPECT_EQ(argmax(x, d, true).dim(), 3);
  }
  EXPECT_EQ(argmax(x).item<double>(), reference(x.reshape({-1}), {0}, Kind::ArgMax)[0]);
  EXPECT_EQ(argmax(x.transpose(0, 2), 1).to_vector<double>(),
            reference(x.transpose(0, 2), {1}, Kind::ArgMax));
  EXPECT_EQ(argmax(tensor<float>({1.f, 3.f, 3.f, 2.f})).item<int64_t>(), 1);  // ties: the first
  EXPECT_EQ(argmax(tensor<float>({1.f, NAN, 3.f})).item<int64_t>(), 1);       // nan wins, as in PyTorch
  EXPECT_TRUE(std::isnan(max(tensor<float>({1.f, NAN, 3.f})).item<float>()));
}

// max / min along a dim with indices (libtorch's max(x, dim, keepdim)): the values of the Shape form, the
// indices of argmax / argmin, in every dtype and on a non-contiguous view; a braced dim stays the Shape form.
TEST(Reduce, MaxMinAlongADimWithIndices) {
  static_assert(std::is_same_v<decltype(max(Tensor(), {1})), Tensor>, "max(x, {1}) is the Shape reduction");
  static_assert(std::is_same_v<decltype(max(Tensor(), 1)), ValuesIndices>);
  static_assert(std::is_same_v<decltype(ops::min(Tensor(), int64_t(1), true)), ValuesIndices>);
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::I64}) {
    const Tensor x =
        t == DType::I64 ? randint(-50, 50, {4, 9, 5}, DType::I64) : uniform({4, 9, 5}, -1, 1, t, 12);
    for (const Tensor& v : {x, x.transpose(0, 2)})
      for (int d = -1; d < 3; ++d)
        for (bool keepdim : {false, true}) {
          const auto [values, indices] = max(v, d, keepdim);
          const auto [lo, lo_at] = min(v, d, keepdim);
          const std::string what = std::string(dtype_name(t)) + " dim " + std::to_string(d);
          EXPECT_EQ(values.dtype(), t) << what;
          EXPECT_EQ(indices.dtype(), DType::I64) << what;
          EXPECT_EQ(values.shape(), max(v, {d}, keepdim).shape()) << what;
          EXPECT_EQ(values.to_vector<double>(), max(v, {d}, keepdim).to_vector<double>()) << what;
          EXPECT_EQ(indices.to_vector<double>(), argmax(v, d, keepdim).to_vector<double>()) << what;
          EXPECT_EQ(lo.to_vector<double>(), min(v, {d}, keepdim).to_vector<double>()) << what;
          EXPECT_EQ(lo_at.to_vector<double>(), argmin(v, d, keepdim).to_vector<double>()) << what;
          // The values are the elements the indices name.
          const Tensor at = keepdim ? indices : indices.unsqueeze(d);
          const Tensor picked = gather(v, d, at);
          EXPECT_EQ(picked.to_vector<double>(), values.to_vector<double>()) << what;
        }
  }
  const ValuesIndices r = max(tensor<float>({1.f, 3.f, 3.f, 2.f}), 0);  // ties: the first index
  EXPECT_EQ(r.values.item<float>(), 3.f);
  EXPECT_EQ(r.indices.item<int64_t>(), 1);
}

TEST(Reduce, MaxMinAlongADimBadInputs) {
  const Tensor x = uniform({2, 3}, -1, 1, DType::F32, 13);
  expect_error<IndexError>([&] { max(x, 2); }, {"max", "dim 2 is out of range", "2 dimension(s)", "[-2, 1]"});
  expect_error<IndexError>([&] { min(x, -3, true); }, {"min", "dim -3 is out of range", "[-2, 1]"});
  expect_error<Error>([&] { max(Tensor(), 0); }, {"max", "undefined"});
  expect_error<ShapeError>(
      [&] {
        min(zeros({2, 0}), 1);
      },
      {"min", "cannot reduce over a dim of size 0", "[2, 0]"});
}

TEST(Reduce, IntegerAndBool) {
  const Tensor i = tensor<int32_t>({3, -1, 4, 1, -5, 9}, {2, 3});
  EXPECT_EQ(sum(i).dtype(), DType::I64);
  EXPECT_EQ(sum(i).item<int64_t>(), 11);
  EXPECT_EQ(sum(i, {0}).to_vector<int64_t>(), (std::vector<int64_t>{4, -6, 13}));
  EXPECT_EQ(max(i, {1}).to_vector<int32_t>(), (std::vector<int32_t>{4, 9}));
  EXPECT_EQ(min(i).item<int32_t>(), -5);
  EXPECT_EQ(sum(tensor<bool>({true, false, true})).item<int64_t>(), 2);
  EXPECT_EQ(sum(tensor<uint8_t>(std::vector<uint8_t>(1000, 255))).item<int64_t>(), 255000);  // no u8 overflow
}

// An i64 sum past the range wraps modulo 2^64 (Note [integer overflow wraps] in kernels/math.h): the same in
// any order, along a dim and over all. Under the sanitizers' build this failed before the sums wrapped.
TEST(Reduce, IntegerSumsWrapModulo2To64) {
  const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  const Tensor x = tensor<int64_t>({hi, 1, lo, lo, hi, hi, -1, lo}, {4, 2});
  EXPECT_EQ(sum(x, {1}).to_vector<int64_t>(), (std::vector<int64_t>{lo, 0, -2, hi}));
  EXPECT_EQ(sum(x, {0}).to_vector<int64_t>(), (std::vector<int64_t>{hi - 2, lo}));
  EXPECT_EQ(sum(x).item<int64_t>(), -3);
  EXPECT_EQ(sum(x.transpose(0, 1), {0}).to_vector<int64_t>(), (std::vector<int64_t>{lo, 0, -2, hi}));
}

TEST(Reduce, LargeSumsParallelAndColumnPaths) {
  const Tensor x = uniform({1 << 20}, 0, 1, DType::F32, 13);  // one long run, split across threads
  double expected = 0;
  for (double v : x.to_vector<double>()) expected += v;
  EXPECT_NEAR(sum(x).item<double>(), expected, 1e-6 * expected);
  const Tensor m = uniform({1000, 300}, -1, 1, DType::F32, 14);  // reduce the outer dim: accumulated rows
  expect_close(sum(m, {0}), reference(m, {0}, Kind::Sum), {1e-3, 1e-5}, "column sum");
  const Tensor wide = uniform({3, 5000}, -1, 1, DType::F32, 15);  // columns split across threads
  expect_close(sum(wide, {0}), reference(wide, {0}, Kind::Sum), {1e-4, 1e-5}, "wide column sum");
  // Many rows of a short run (a bias gradient): rows split into chunks, the same sums for any thread count.
  const Tensor tall = uniform({2048, 128}, -1, 1, DType::F32, 16);
  expect_close(sum(tall, {0}), reference(tall, {0}, Kind::Sum), {1e-4, 1e-5}, "tall column sum");
  const Tensor tall_bf16 = tall.to(DType::BF16);
  expect_close(sum(tall_bf16, {0}), reference(tall_bf16, {0}, Kind::Sum), {0.25, 1e-2},
               "tall column sum bf16");
  const int before = num_threads();
  set_num_threads(1);
  const auto one = sum(tall, {0}).to_vector<float>();
  set_num_threads(std::max(2, before));
  const auto many = sum(tall, {0}).to_vector<float>();
  set_num_threads(before);
  EXPECT_EQ(one, many);
}

// Note [pairwise sums] (kernels/cpu/cascade.h): the sums of long runs, rows and columns are accurate (the
// error grows with log n, not n) and do not depend on the thread count.

// The naive sum of each output in long double (64 significant bits), for x of 1 to 3 dims reduced over all
// dims, or over one dim.
std::vector<double> naive_sums(const Tensor& x, const Shape& dims) {
  const auto v = x.contiguous().to_vector<double>();
  if (dims.empty()) {
    long double s = 0;
    for (double e : v) s += e;
    return {double(s)};
  }
  // [outer, n, inner] around the reduced dim.
  const int d = int(dims[0]);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= x.size(i);
  for (int i = d + 1; i < x.dim(); ++i) inner *= x.size(i);
  const int64_t n = x.size(d);
  std::vector<double> out;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      long double s = 0;
      for (int64_t k = 0; k < n; ++k) s += v[size_t((o * n + k) * inner + i)];
      out.push_back(double(s));
    }
  return out;
}

// |got - ref| <= rtol |ref| for each output, with the first failure reported.
void expect_relative(const Tensor& got, const std::vector<double>& ref, double rtol,
                     const std::string& what) {
  const auto g = got.reshape({-1}).to_vector<double>();
  ASSERT_EQ(g.size(), ref.size()) << what;
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_LE(std::fabs(g[i] - ref[i]), rtol * std::fabs(ref[i]))
        << what << " at " << i << ": got " << g[i] << ", expected " << ref[i];
  }
}

// With every thread count.
template <typename F>
void for_thread_counts(F&& f) {
  const int before = num_threads();
  for (int threads : {1, 2, 3, 8}) {
    set_num_threads(threads);
    f(threads);
  }
  set_num_threads(before);
}

TEST(Reduce, LongF32MeanIsAccurateForAnyThreadCount) {
  // PyTorch gives 0.0999999; a sum in chunks of f32 lanes gave 0.1004102 with 1 thread and 0.0997529 with 2.
  const Tensor x = full({1 << 24}, 0.1);
  const double expected = double(0.1f);
  for_thread_counts([&](int threads) {
    const double m = mean(x).item<double>();
    EXPECT_LE(std::fabs(m - expected), 1e-6 * expected) << threads << " threads: " << m;
  });
}

TEST(Reduce, LongRowsAndColumnsAreAccurateInEveryFloatDtype) {
  struct Case {
    Shape shape, dims;
  };
  // A long run (full and per row), long columns (a few kept contiguous columns), a strided walk.
  const Case cases[] = {{{1 << 22}, {}}, {{4, 1 << 20}, {1}}, {{1 << 20, 4}, {0}}, {{2, 1 << 19, 3}, {1}}};
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16})
    for (const Case& c : cases)
      for (bool transposed : {false, true}) {
        // Positive values: the relative error of the sum is that of the summation alone (small ones in f16,
        // whose largest value is 65504).
        const double scale = t == DType::F16 ? 1.0 / 256 : 1.0;
        Tensor x = uniform(c.shape, 0.5 * scale, scale, t, 31);
        Shape dims = c.dims;
        if (transposed) {  // the same sums read through a transposed view: rows become columns
          if (c.shape.size() != 2) continue;
          x = x.t().contiguous().t();
        }
        const std::string what = std::string(dtype_name(t)) + " " + c.shape.str() + " dims " + dims.str() +
                                 (transposed ? " transposed" : "");
        const auto ref = naive_sums(x, dims);
        // f32 sums to 1e-6 (PyTorch's reach about 1e-7), f64 ones to 1e-13; the 16-bit sums accumulate in
        // f32 and then round once to their own precision (half an ulp: 2^-11, 2^-8).
        const double rtol = t == DType::F16 ? 5e-4 : t == DType::BF16 ? 4e-3 : t == DType::F64 ? 1e-13 : 1e-6;
        expect_relative(sum(x, dims), ref, rtol, what);
      }
}

TEST(Reduce, SumsAreBitIdenticalForAnyThreadCount) {
  struct Case {
    Shape shape, dims;
  };
  const Case cases[] = {
      {{1 << 21}, {}},        {{5, 300007}, {1}},      {{300007, 5}, {0}}, {{2048, 128}, {0}},
      {{3, 70001, 5}, {1}},   {{70001, 3, 2}, {0, 2}}, {{7, 9}, {}},       {{64, 3000}, {0}},
      {{1000, 1000}, {0, 1}}, {{130000}, {0}},         {{3, 1 << 19}, {}}, {{1 << 19, 3}, {1}},
  };
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16})
    for (const Case& c : cases)
      for (bool transposed : {false, true}) {
        Tensor x = uniform(c.shape, -1, 1, t, 32);
        if (transposed) x = x.transpose(0, -1);
        const std::string what = std::string(dtype_name(t)) + " " + x.shape().str() + " dims " +
                                 c.dims.str() + (transposed ? " transposed" : "");
        std::vector<double> first_sum, first_mean;
        for_thread_counts([&](int threads) {
          const auto s = sum(x, c.dims).to_vector<double>();
          const auto m = mean(x, c.dims).to_vector<double>();
          if (first_sum.empty()) {
            first_sum = s;
            first_mean = m;
          }
          EXPECT_EQ(s, first_sum) << what << ": sum with " << threads << " threads";
          EXPECT_EQ(m, first_mean) << what << ": mean with " << threads << " threads";
        });
      }
}

// Note [checked sizes] (core/shape.h): a huge-by-zero tensor is either refused or empty, and a reduction over
// it gives an empty result or a clear error, never an out-of-bounds write.
TEST(Reduce, HugeByZeroTensorsReduceToEmptyResultsOrClearErrors) {
  // Note [checked sizes]: [2^62, 0] of u8 is a valid (empty) tensor; of f32 its nonzero sizes need 2^64
  // bytes.
  expect_error<ShapeError>([] { empty({int64_t(1) << 62, 0}); }, {"empty", "[4611686018427387904, 0]"});
  const Tensor x = empty({int64_t(1) << 62, 0}, DType::U8);
  EXPECT_EQ(x.numel(), 0);
  EXPECT_EQ(x.nbytes(), 0);
  EXPECT_EQ(sum(x).item<int64_t>(), 0);
  EXPECT_EQ(sum(x, {0}).shape(), Shape({0}));
  EXPECT_EQ(max(x, {0}).shape(), Shape({0}));
  // Over the zero dim the result would have 2^62 elements: i64 ones do not fit, u8 ones do not fit in memory.
  expect_error<ShapeError>([&] { sum(x, {1}); }, {"[4611686018427387904]"});
  expect_error<Error>([&] { max(x, {1}); }, {});
  const Tensor f = empty({int64_t(1) << 60, 0});
  EXPECT_EQ(sum(f).item<float>(), 0.0f);
  EXPECT_EQ(mean(f, {0}).shape(), Shape({0}));
  EXPECT_EQ(var(f, {0}).shape(), Shape({0}));
  expect_error<OutOfMemoryError>([&] { sum(f, {1}); }, {"out of memory"});
}

TEST(Reduce, EmptyAndSizeOne) {
  EXPECT_EQ(sum(zeros({0, 3}), {0}).to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(sum(zeros({0})).item<float>(), 0.f);
  EXPECT_EQ(sum(ones({1, 4}), {0}).to_vector<float>(), (std::vector<float>{1, 1, 1, 1}));
  EXPECT_EQ(sum(scalar_tensor(2.5)).item<float>(), 2.5f);
  EXPECT_TRUE(std::isnan(var(ones({1})).item<float>()));  // n - 1 = 0
}

TEST(Reduce, BadInputs) {
  expect_error<IndexError>([] { sum(ones({2, 3}), {2}); }, {"sum", "dim 2", "2 dimension"});
  expect_error<IndexError>([] { sum(ones({2, 3}), {0, -2}); }, {"sum", "more than once"});
  expect_error<DTypeError>([] { mean(arange(4)); }, {"mean", "i64", "floating"});
  expect_error<DTypeError>([] { var(arange(4)); }, {"var", "i64"});
  expect_error<ShapeError>([] { max(zeros({0, 3}), {0}); }, {"max", "size 0", "[0, 3]"});
  expect_error<IndexError>([] { argmax(ones({2, 3}), 3); }, {"argmax", "dim 3"});
}

}  // namespace
}  // namespace frugal

// Tests of the factories (core/factories.cpp) and the random generator (core/rng.cpp): filled tensors,
// tensors from values, ranges, the distributions of rand/randn/randint, reproducibility from a seed or a
// saved state, and independence from the number of threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <typeinfo>
#include <vector>

#include "frugal.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

constexpr DType kAllDTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16,
                                DType::I64, DType::I32, DType::U8,  DType::Bool};
constexpr DType kFloatDTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16};

using testing::expect_exact_error;

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}
double variance_of(const std::vector<double>& v) {
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return s / double(v.size() - 1);
}
// How many elements equal the one `lag` places before them (consecutive draws should rarely repeat).
int64_t repeats_at_lag(const std::vector<double>& v, size_t lag) {
  int64_t n = 0;
  for (size_t i = lag; i < v.size(); ++i) n += v[i] == v[i - lag];
  return n;
}

// ---- filled tensors ---------------------------------------------------------------------------------------

TEST(Factories, EmptyZerosOnesFullForEveryDType) {
  for (DType t : kAllDTypes) {
    const Tensor e = empty({2, 3}, t);
    EXPECT_EQ(e.shape(), (Shape{2, 3}));
    EXPECT_EQ(e.dtype(), t);
    EXPECT_TRUE(e.is_contiguous());
    EXPECT_EQ(zeros({2, 3}, t).to_vector<double>(), std::vector<double>(6, 0.0)) << dtype_name(t);
    EXPECT_EQ(ones({4}, t).to_vector<double>(), std::vector<double>(4, 1.0)) << dtype_name(t);
    const double value = t == DType::Bool ? 1.0 : 5.0;
    EXPECT_EQ(full({3, 1}, 5, t).to_vector<double>(), std::vector<double>(3, value)) << dtype_name(t);
    EXPECT_EQ(full({3, 1}, 5, t).dtype(), t);
  }
  EXPECT_EQ(full({2}, -3.5, DType::F64).to_vector<double>(), std::vector<double>(2, -3.5));
  EXPECT_EQ(full({2}, -3, DType::I32).to_vector<int32_t>(), std::vector<int32_t>(2, -3));
  EXPECT_EQ(full({2}, 0.1, DType::F16).to_vector<float>(), std::vector<float>(2, float(Half(0.1f))));
  EXPECT_EQ(zeros({}).dim(), 0);
  EXPECT_EQ(ones({0, 3}).numel(), 0);
  EXPECT_EQ(zeros({2}, TensorOptions().dtype(DType::F64).device(kCPU)).dtype(), DType::F64);
}

TEST(Factories, LikeVariantsKeepShapeAndDType) {
  Generator g(3);
  const Tensor src = randn({3, 2}, DType::F16, &g).t();  // non-contiguous f16
  for (const Tensor& t : {empty_like(src), zeros_like(src), ones_like(src), full_like(src, 2.5)}) {
    EXPECT_EQ(t.shape(), (Shape{2, 3}));
    EXPECT_EQ(t.dtype(), DType::F16);
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_FALSE(t.storage() == src.storage());
  }
  EXPECT_EQ(zeros_like(src).to_vector<double>(), std::vector<double>(6, 0.0));
  EXPECT_EQ(ones_like(src).to_vector<double>(), std::vector<double>(6, 1.0));
  EXPECT_EQ(full_like(src, 2.5).to_vector<double>(), std::vector<double>(6, 2.5));
  EXPECT_EQ(full_like(arange(4), 7).to_vector<int64_t>(), std::vector<int64_t>(4, 7));
}

// ---- tensors from values ----------------------------------------------------------------------------------

template <typename T>
void check_tensor_from_vector(const std::vector<T>& values) {
  const Tensor t = tensor(values, {2, 2});
  EXPECT_EQ(t.dtype(), dtype_v<T>);
  EXPECT_EQ(t.shape(), (Shape{2, 2}));
  const std::vector<T> back = t.to_vector<T>();
  for (size_t i = 0; i < values.size(); ++i)
    EXPECT_EQ(acc_t<T>(back[i]), acc_t<T>(values[i])) << dtype_name(dtype_v<T>) << " element " << i;
  EXPECT_EQ(tensor(values).shape(), (Shape{4}));
}

TEST(Factories, TensorFromVectorOfEveryType) {
  check_tensor_from_vector<float>({1.5f, -2.25f, 1e-30f, 3e38f});
  check_tensor_from_vector<double>({1e-300, -2.5, 1e300, 0.1});
  check_tensor_from_vector<Half>({Half(0.5f), Half(-65504.0f), Half::from_bits(0x0001), Half(3.0f)});
  check_tensor_from_vector<BFloat16>({BFloat16(0.5f), BFloat16(-1e38f), BFloat16(7.0f), BFloat16(-0.125f)});
  check_tensor_from_vector<int64_t>({int64_t(1) << 62, -5, 0, 42});
  check_tensor_from_vector<int32_t>({-2147483647, 5, 0, 2147483647});
  check_tensor_from_vector<uint8_t>({0, 255, 128, 7});
  check_tensor_from_vector<bool>({true, false, false, true});
  EXPECT_EQ(tensor<float>({}).numel(), 0);
}

TEST(Factories, FromBufferCopiesTheBytes) {
  float buf[6] = {0.5f, -1.0f, 2.0f, 3.5f, -4.25f, 5.0f};
  const Tensor t = from_buffer(buf, {2, 3}, DType::F32);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(buf, buf + 6));
  buf[0] = 99.0f;
  EXPECT_EQ(t.to_vector<float>()[0], 0.5f);
  const int32_t ints[3] = {-1, 0, 1 << 30};
  EXPECT_EQ(from_buffer(ints, {3}, DType::I32).to_vector<int32_t>(), std::vector<int32_t>(ints, ints + 3));
  const uint16_t halves[2] = {0x3c00, 0xc000};  // 1, -2
  EXPECT_EQ(from_buffer(halves, {2}, DType::F16).to_vector<float>(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(from_buffer(nullptr, {0, 4}, DType::F64).numel(), 0);
}

TEST(Factories, ScalarTensor) {
  const Tensor s = scalar_tensor(3.5);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.dtype(), DType::F32);
  EXPECT_EQ(s.item<float>(), 3.5f);
  EXPECT_EQ(scalar_tensor(3, DType::I64).item<int64_t>(), 3);
  EXPECT_EQ(scalar_tensor(0.1, DType::F64).item<double>(), 0.1);
}

TEST(Factories, BadShapes) {
  const std::vector<float> three{1, 2, 3};
  expect_exact_error<ShapeError>(
      [&] {
        tensor(three, {2, 2});
      },
      {"tensor", "3 values", "[2, 2]", "4 elements"});
  expect_exact_error<ShapeError>([] { empty({2, -1}); }, {"empty", "[2, -1]"});
  expect_exact_error<ShapeError>([] { zeros({3, -2}, DType::I32); }, {"empty", "[3, -2]"});
}

// Note [checked sizes]: a shape whose bytes do not fit in int64 is refused before anything is allocated; a
// wrapped product would give a tensor of 2^62 elements and 0 bytes, which fill_ then writes past.
TEST(Factories, SizesThatOverflowAreRefused) {
  const int64_t big = int64_t(1) << 62;
  expect_exact_error<ShapeError>([&] { empty({big}); }, {"empty", "[4611686018427387904]", "4-byte", "2^63"});
  expect_exact_error<ShapeError>([&] { full({big}, 1.0); }, {"empty", "[4611686018427387904]"});
  // 2^61 elements fit in int64, their 2^63 bytes do not.
  expect_exact_error<ShapeError>([] { empty({int64_t(1) << 61}); }, {"empty", "[2305843009213693952]"});
  expect_exact_error<ShapeError>([] { zeros({int64_t(1) << 60}, DType::F64); }, {"empty", "8-byte"});
  // Empty, but the nonzero sizes' bytes still must fit (as PyTorch asks of its strides).
  expect_exact_error<ShapeError>([&] { empty({big, 0}); }, {"empty", "[4611686018427387904, 0]", "empty"});
  expect_exact_error<ShapeError>(
      [] {
        empty({int64_t(1) << 40, int64_t(1) << 40, 0}, DType::U8);
      },
      {"empty", "[1099511627776, 1099511627776, 0]"});
  const Tensor e = empty({big, 0}, DType::U8);
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.nbytes(), 0);
  EXPECT_EQ(e.strides(), (Shape{1, 1}));
  // A valid shape beyond any memory is an allocation that fails.
  expect_exact_error<OutOfMemoryError>([] { empty({int64_t(1) << 60}, DType::U8); }, {"out of memory"});
  expect_exact_error<Error>([] { arange(0, 1e300, 1, DType::F32); },
                            {"arange", "more than a tensor can hold"});
}

// ---- ranges -----------------------------------------------------------------------------------------------

TEST(Factories, Arange) {
  const Tensor a = arange(5);
  EXPECT_EQ(a.dtype(), DType::I64);
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(2, 7).to_vector<int64_t>(), (std::vector<int64_t>{2, 3, 4, 5, 6}));
  EXPECT_EQ(arange(-3, 3, 2).to_vector<int64_t>(), (std::vector<int64_t>{-3, -1, 1}));
  EXPECT_EQ(arange(0, 10, 3).to_vector<int64_t>(), (std::vector<int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(arange(5, 0, -2).to_vector<int64_t>(), (std::vector<int64_t>{5, 3, 1}));
  EXPECT_EQ(arange(1, 2, 0.25, DType::F32).to_vector<float>(), (std::vector<float>{1, 1.25f, 1.5f, 1.75f}));
  EXPECT_EQ(arange(0, -1, -0.25, DType::F64).to_vector<double>(),
            (std::vector<double>{0, -0.25, -0.5, -0.75}));
  EXPECT_EQ(arange(4, DType::F16).to_vector<float>(), (std::vector<float>{0, 1, 2, 3}));
  const auto tenths = arange(0, 1, 0.1, DType::F64).to_vector<double>();
  ASSERT_EQ(tenths.size(), 10u);  // like PyTorch: 1 is excluded
  for (int i = 0; i < 10; ++i) EXPECT_NEAR(tenths[size_t(i)], i / 10.0, 1e-15);
  // Empty ranges: equal bounds, or a step pointing away from the end.
  for (const Tensor& e : {arange(3, 3), arange(3, 1), arange(1, 3, -1), arange(0)}) {
    EXPECT_EQ(e.numel(), 0);
    EXPECT_EQ(e.shape(), (Shape{0}));
  }
  expect_exact_error<Error>([] { arange(0, 5, 0); }, {"arange", "step", "step=0"});
  expect_exact_error<Error>([] { arange(0, INFINITY); }, {"arange", "finite", "end=inf"});
}

TEST(Factories, Linspace) {
  EXPECT_EQ(linspace(0, 1, 5).to_vector<float>(), (std::vector<float>{0, 0.25f, 0.5f, 0.75f, 1}));
  EXPECT_EQ(linspace(-1, 2, 7, DType::F64).to_vector<double>(),
            (std::vector<double>{-1, -0.5, 0, 0.5, 1, 1.5, 2}));
  EXPECT_EQ(linspace(5, -5, 11, DType::I64).to_vector<int64_t>(),
            (std::vector<int64_t>{5, 4, 3, 2, 1, 0, -1, -2, -3, -4, -5}));
  // Both endpoints exact even when the step is not representable.
  for (int64_t steps : {2, 3, 7, 10, 101}) {
    const auto v = linspace(0.1, 0.7, steps, DType::F64).to_vector<double>();
    ASSERT_EQ(v.size(), size_t(steps));
    EXPECT_EQ(v.front(), 0.1);
    EXPECT_EQ(v.back(), 0.7);
    for (int64_t i = 0; i < steps; ++i)
      EXPECT_NEAR(v[size_t(i)], 0.1 + 0.6 * double(i) / double(steps - 1), 1e-15) << steps << " " << i;
  }
  EXPECT_EQ(linspace(3, 3, 4).to_vector<float>(), std::vector<float>(4, 3));
  EXPECT_EQ(linspace(2, 5, 1).to_vector<float>(),
            std::vector<float>{2});  // one step: the start, as in PyTorch
  const Tensor none = linspace(2, 5, 0);
  EXPECT_EQ(none.shape(), (Shape{0}));
  EXPECT_EQ(none.dtype(), DType::F32);
  expect_exact_error<Error>([] { linspace(0, 1, -1); }, {"linspace", "steps", "-1"});
}

// ---- random draws -----------------------------------------------------------------------------------------

TEST(Random, PhiloxMatchesRandom123KnownAnswer) {
  // Random123's tests/kat_vectors: "philox4x32 10", counter 0 and key 0 give 6627e8d5 e169c58d bc57ac4c
  // 9b00dbd8.
  uint32_t out[4];
  Generator::block(0, 0, out);
  EXPECT_EQ(out[0], 0x6627e8d5u);
  EXPECT_EQ(out[1], 0xe169c58du);
  EXPECT_EQ(out[2], 0xbc57ac4cu);
  EXPECT_EQ(out[3], 0x9b00dbd8u);
}

TEST(Random, RandIsUniformOnZeroOne) {
  constexpr int64_t n = 100000;
  for (DType t : kFloatDTypes) {
    manual_seed(1234);
    const Tensor r = rand({n}, t);
    EXPECT_EQ(r.dtype(), t);
    EXPECT_EQ(r.shape(), (Shape{n}));
    const auto v = r.to_vector<double>();
    const double lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
    EXPECT_GE(lo, 0.0) << dtype_name(t);
    EXPECT_LT(hi, 1.0) << dtype_name(t) << ": rand must never give 1";
    // The mean's standard error is 0.29 / sqrt(n) ~ 0.0009; the variance of U[0, 1) is 1/12.
    EXPECT_NEAR(mean_of(v), 0.5, 0.006) << dtype_name(t);
    EXPECT_NEAR(variance_of(v), 1.0 / 12, 0.003) << dtype_name(t);
    int64_t counts[10] = {};
    for (double x : v) ++counts[std::min(9, int(x * 10))];
    for (int b = 0; b < 10; ++b)
      EXPECT_NEAR(double(counts[b]) / n, 0.1, 0.006) << dtype_name(t) << " bucket " << b;
  }
}

TEST(Random, NeighbouringDrawsAreNotRepeated) {
  // A 128-bit Philox block holds two 64-bit draws: element i must not repeat element i - 2 (or any other).
  manual_seed(77);
  auto r64 = rand({20000}, DType::F64).to_vector<double>();
  EXPECT_EQ(repeats_at_lag(r64, 1) + repeats_at_lag(r64, 2) + repeats_at_lag(r64, 3), 0);
  std::sort(r64.begin(), r64.end());
  EXPECT_EQ(std::adjacent_find(r64.begin(), r64.end()), r64.end()) << "53-bit uniforms should not collide";
  const auto n64 = randn({20000}, DType::F64).to_vector<double>();
  EXPECT_EQ(repeats_at_lag(n64, 1) + repeats_at_lag(n64, 2) + repeats_at_lag(n64, 3), 0);
  const auto n32 = randn({20000}, DType::F32).to_vector<double>();
  EXPECT_EQ(repeats_at_lag(n32, 1) + repeats_at_lag(n32, 2) + repeats_at_lag(n32, 3), 0);
  // randint over 1000 values: a repeat at any lag has probability 1/1000.
  const auto ri = randint(0, 1000, {20000}).to_vector<double>();
  for (size_t lag : {1, 2, 3, 4}) EXPECT_LT(repeats_at_lag(ri, lag), 60) << "lag " << lag;
}

TEST(Random, RandnIsStandardNormal) {
  constexpr int64_t n = 100000;
  for (DType t : kFloatDTypes) {
    manual_seed(99);
    const Tensor r = randn({n}, t);
    EXPECT_EQ(r.dtype(), t);
    const auto v = r.to_vector<double>();
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); })) << dtype_name(t);
    // Standard errors: mean 1/sqrt(n) ~ 0.003, variance sqrt(2/n) ~ 0.0045, P(|x| < 1) ~ 0.0015.
    EXPECT_NEAR(mean_of(v), 0.0, 0.02) << dtype_name(t);
    EXPECT_NEAR(variance_of(v), 1.0, 0.03) << dtype_name(t);
    const double within_one =
        double(std::count_if(v.begin(), v.end(), [](double x) { return std::fabs(x) < 1; }));
    EXPECT_NEAR(within_one / n, 0.6827, 0.01) << dtype_name(t);
    const double beyond_three =
        double(std::count_if(v.begin(), v.end(), [](double x) { return std::fabs(x) > 3; }));
    EXPECT_NEAR(beyond_three / n, 0.0027, 0.001) << dtype_name(t);
  }
}

TEST(Random, RandintCoversEveryValueInHalfOpenRange) {
  manual_seed(5);
  constexpr int64_t n = 70000;
  const Tensor r = randint(-3, 4, {n});
  EXPECT_EQ(r.dtype(), DType::I64);
  std::map<int64_t, int64_t> counts;
  for (int64_t x : r.to_vector<int64_t>()) ++counts[x];
  ASSERT_EQ(counts.size(), 7u);
  EXPECT_EQ(counts.begin()->first, -3);
  EXPECT_EQ(counts.rbegin()->first, 3);
  for (auto [value, count] : counts) EXPECT_NEAR(double(count), n / 7.0, 600) << value;  // sd ~ 93

  const Tensor small = randint(0, 3, {1000}, DType::U8);
  EXPECT_EQ(small.dtype(), DType::U8);
  const auto s = small.to_vector<int64_t>();
  EXPECT_EQ(*std::max_element(s.begin(), s.end()), 2);
  EXPECT_EQ(*std::min_element(s.begin(), s.end()), 0);
  EXPECT_EQ(randint(0, 10, {4, 5}, DType::I32).dtype(), DType::I32);
  EXPECT_EQ(randint(0, 10, {4, 5}).shape(), (Shape{4, 5}));
  EXPECT_EQ(randint(5, 6, {8}).to_vector<int64_t>(), std::vector<int64_t>(8, 5));
  const auto big = randint(0, int64_t(1) << 40, {20000}).to_vector<double>();
  EXPECT_GE(*std::min_element(big.begin(), big.end()), 0.0);
  EXPECT_LT(*std::max_element(big.begin(), big.end()), std::ldexp(1.0, 40));
  EXPECT_NEAR(mean_of(big) / std::ldexp(1.0, 40), 0.5, 0.01);
}

TEST(Random, ManualSeedReplays) {
  for (DType t : kFloatDTypes) {
    manual_seed(2024);
    const auto a = rand({1000}, t).to_vector<double>(), an = randn({1000}, t).to_vector<double>();
    const auto ai = randint(0, 100, {1000}).to_vector<double>();
    manual_seed(2024);
    EXPECT_EQ(rand({1000}, t).to_vector<double>(), a) << dtype_name(t);
    EXPECT_EQ(randn({1000}, t).to_vector<double>(), an) << dtype_name(t);
    EXPECT_EQ(randint(0, 100, {1000}).to_vector<double>(), ai) << dtype_name(t);
    EXPECT_NE(rand({1000}, t).to_vector<double>(), a) << "the next draw continues, it does not repeat";
    manual_seed(2025);
    EXPECT_NE(rand({1000}, t).to_vector<double>(), a) << "another seed, another draw";
  }
}

TEST(Random, GeneratorStateSaveAndRestoreReplaysExactly) {
  Generator g(42);
  EXPECT_EQ(g.seed(), 42u);
  rand({100}, {}, &g);  // move away from offset 0
  const Generator::State saved = g.state();
  const auto a = randn({777}, DType::F64, &g).to_vector<double>();
  const auto b = rand({33}, {}, &g).to_vector<double>();
  EXPECT_NE(g.state(), saved);
  g.set_state(saved);
  EXPECT_EQ(g.state(), saved);
  EXPECT_EQ(randn({777}, DType::F64, &g).to_vector<double>(), a);
  EXPECT_EQ(rand({33}, {}, &g).to_vector<double>(), b);

  Generator same(42);
  rand({100}, {}, &same);
  EXPECT_EQ(same.state(), saved);
  EXPECT_EQ(randn({777}, DType::F64, &same).to_vector<double>(), a);

  g.manual_seed(42);
  EXPECT_EQ(g.state(), (Generator::State{42, 0}));
}

TEST(Random, ExplicitGeneratorLeavesTheDefaultAlone) {
  manual_seed(8);
  const Generator::State before = default_generator().state();
  Generator g(8);
  randn({5000}, {}, &g);
  randint(0, 9, {5000}, DType::I64, &g);
  EXPECT_EQ(default_generator().state(), before);
  EXPECT_EQ(default_generator().seed(), 8u);
}

TEST(Random, ElementsDependOnlyOnSeedOffsetAndIndex) {
  // Two draws of 8 continue exactly where one draw of 16 goes.
  for (DType t : {DType::F32, DType::F64}) {
    Generator g(11), h(11);
    auto parts = rand({8}, t, &g).to_vector<double>();
    const auto second = rand({8}, t, &g).to_vector<double>();
    parts.insert(parts.end(), second.begin(), second.end());
    EXPECT_EQ(parts, rand({16}, t, &h).to_vector<double>()) << dtype_name(t);
  }
  // A reshaped request draws the same numbers.
  Generator g(12), h(12);
  EXPECT_EQ(randn({6, 4}, {}, &g).to_vector<double>(), randn({24}, {}, &h).to_vector<double>());
}

TEST(Random, ResultsDoNotDependOnThreadCount) {
  const int saved = num_threads();
  const Shape big{1 << 20};  // 256k Philox blocks: far past the parallel grain
  std::vector<std::vector<double>> runs;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    EXPECT_EQ(num_threads(), threads);
    manual_seed(31337);
    std::vector<double> all = rand(big).to_vector<double>();
    for (const Tensor& t : {randn(big, DType::F64), randint(-50, 50, big), rand(big, DType::BF16)}) {
      const auto v = t.to_vector<double>();
      all.insert(all.end(), v.begin(), v.end());
    }
    runs.push_back(std::move(all));
  }
  set_num_threads(saved);
  EXPECT_TRUE(runs[0] == runs[1]);
}

TEST(Random, BadArguments) {
  expect_exact_error<DTypeError>([] { rand({3}, DType::I64); }, {"rand", "floating dtype", "i64", "randint"});
  expect_exact_error<DTypeError>([] { rand({3}, DType::Bool); }, {"rand", "bool"});
  expect_exact_error<DTypeError>([] { randn({3}, DType::I32); }, {"randn", "i32"});
  expect_exact_error<Error>([] { randint(5, 5, {3}); }, {"randint", "low < high", "low=5", "high=5"});
  expect_exact_error<Error>([] { randint(5, 2, {3}); }, {"randint", "low=5", "high=2"});
}

}  // namespace
}  // namespace frugal

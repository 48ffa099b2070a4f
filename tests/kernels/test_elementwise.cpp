// Elementwise ops against naive f64 references: every op, every dtype, broadcast and non-contiguous operands,
// scalar and in-place forms, promotion, and bad inputs.
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/math.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::tol_for;
using testing::uniform;

const DType kFloatTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16};

struct UnaryCase {
  const char* name;
  Tensor (*fn)(const Tensor&);
  double (*ref)(double);
  double lo, hi;  // input range
};

// Every one-input op of core/op_list.h, against its functor (kernels/math.h) evaluated in f64, on inputs of
// the range named here ([-5, 5) otherwise).
struct Range {
  const char* name;
  double lo, hi;
};
const Range kRanges[] = {{"neg", -3, 3},      {"abs", -3, 3},  {"log", 0.01, 10},    {"sqrt", 0, 10},
                         {"rsqrt", 0.05, 10}, {"relu", -3, 3}, {"sigmoid", -10, 10}, {"silu", -10, 10},
                         {"sin", -10, 10},    {"cos", -10, 10}};
Range range_of(const char* name) {
  for (const Range& r : kRanges)
    if (std::string(r.name) == name) return r;
  return {name, -5, 5};
}
std::vector<UnaryCase> unary_cases() {
  std::vector<UnaryCase> cases;
#define FRUGAL_CASE(name, F, ...) \
  cases.push_back(                \
      {#name, name, [](double x) { return math::F{}(x); }, range_of(#name).lo, range_of(#name).hi});
  FRUGAL_UNARY_OP_LIST(FRUGAL_CASE)
#undef FRUGAL_CASE
  return cases;
}
const std::vector<UnaryCase> kUnary = unary_cases();

std::vector<double> map_values(const std::vector<double>& v, double (*f)(double)) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = f(v[i]);
  return r;
}

TEST(Unary, MatchesReferenceForEveryFloatDtype) {
  for (const auto& c : kUnary)
    for (DType t : kFloatTypes) {
      const Tensor x = uniform({37, 300}, c.lo, c.hi, t);  // 11100 elements: several buffered chunks
      expect_close(c.fn(x), map_values(x.to_vector<double>(), c.ref), tol_for(t),
                   std::string(c.name) + " " + dtype_name(t));
    }
}

TEST(Unary, NonContiguousInputs) {
  for (const auto& c : kUnary)
    for (DType t : {DType::F32, DType::BF16}) {
      const Tensor base = uniform({40, 60}, c.lo, c.hi, t);
      for (const Tensor& x : {base.t(), base.slice(1, 1, 60, 3), base.select(1, 7)}) {
        ASSERT_FALSE(x.is_contiguous());
        const Tensor y = c.fn(x);
        EXPECT_EQ(y.shape(), x.shape());
        expect_close(y, map_values(x.to_vector<double>(), c.ref), tol_for(t),
                     std::string(c.name) + " strided");
      }
    }
}

TEST(Unary, LargeInputUsesThreadsAndStaysCorrect) {
  const Tensor x = uniform({1 << 20}, -4, 4);
  expect_close(tanh(x), map_values(x.to_vector<double>(), [](double v) { return std::tanh(v); }),
               tol_for(DType::F32), "tanh 1M");
}

TEST(Unary, IntegerForms) {
  const Tensor x = tensor<int64_t>({-3, 0, 5, -7});
  EXPECT_EQ(neg(x).to_vector<int64_t>(), (std::vector<int64_t>{3, 0, -5, 7}));
  EXPECT_EQ(abs(x).to_vector<int64_t>(), (std::vector<int64_t>{3, 0, 5, 7}));
  EXPECT_EQ(relu(x).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 5, 0}));
  EXPECT_EQ(clamp(x.to(DType::I32), -4, 2).to_vector<int32_t>(), (std::vector<int32_t>{-3, 0, 2, -4}));
}

TEST(Unary, Clamp) {
  for (DType t : kFloatTypes) {
    const Tensor x = uniform({500}, -3, 3, t);
    expect_close(clamp(x, -1, 0.5),
                 map_values(x.to_vector<double>(), [](double v) { return std::clamp(v, -1.0, 0.5); }),
                 tol_for(t), "clamp");
    expect_close(clamp_min(x, 0),
                 map_values(x.to_vector<double>(), [](double v) { return std::max(v, 0.0); }), tol_for(t),
                 "clamp_min");
    expect_close(clamp_max(x, 0),
                 map_values(x.to_vector<double>(), [](double v) { return std::min(v, 0.0); }), tol_for(t),
                 "clamp_max");
  }
}

TEST(Unary, SpecialValues) {
  const Tensor x = tensor<float>({0.f, -0.f, INFINITY, -INFINITY, NAN, 1e-40f});
  const auto e = exp(x).to_vector<float>();
  EXPECT_EQ(e[0], 1.f);
  EXPECT_EQ(e[2], INFINITY);
  EXPECT_EQ(e[3], 0.f);
  EXPECT_TRUE(std::isnan(e[4]));
  const auto s = sigmoid(tensor<float>({-100.f, 100.f})).to_vector<float>();
  EXPECT_LT(s[0], 1e-40f);  // e^-100: a float subnormal
  EXPECT_EQ(s[1], 1.f);
  EXPECT_TRUE(std::isnan(log(tensor<float>({-1.f})).item<float>()));
  // Down to the underflow (subnormal results; Eigen's SSE/AVX exp alone clamps at about -88.4 / -709.4),
  // against std::exp, in vectors long enough for the vectorised path.
  const std::vector<float> xf{-87.5f, -90.f, -100.f, -103.f, -110.f, -1e30f, 2.f, -3.f};
  std::vector<float> bf(16 * xf.size());
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = xf[i % xf.size()];
  const auto ef = exp(tensor<float>(bf)).to_vector<float>();
  const auto sf = sigmoid(tensor<float>(bf)).to_vector<float>();
  for (size_t i = 0; i < bf.size(); ++i) {
    EXPECT_NEAR(ef[i], std::exp(bf[i]), 1e-6f * std::exp(bf[i]) + 2e-45f) << "exp(" << bf[i] << ")";
    EXPECT_NEAR(sf[i], 1 / (1 + std::exp(-bf[i])), 1e-6f / (1 + std::exp(-bf[i])) + 2e-45f)
        << "sigmoid(" << bf[i] << ")";
  }
  std::vector<double> bd(32);
  for (size_t i = 0; i < bd.size(); ++i) bd[i] = -700.0 - 2.0 * double(i);
  const auto ed = exp(tensor<double>(bd)).to_vector<double>();
  for (size_t i = 0; i < bd.size(); ++i)
    EXPECT_NEAR(ed[i], std::exp(bd[i]), 1e-13 * std::exp(bd[i]) + 1e-323) << "exp(" << bd[i] << ")";
  // A row with masked (-inf) entries: exactly 0 there.
  const auto p = softmax(tensor<float>({0.f, -INFINITY, 1.f, -INFINITY, -95.f, 2.f, 3.f, -INFINITY}), 0)
                     .to_vector<float>();
  EXPECT_EQ(p[1], 0.f);
  EXPECT_EQ(p[3], 0.f);
  EXPECT_EQ(p[7], 0.f);
  EXPECT_LT(p[4], 1e-41f);
}

struct BinaryCase {
  const char* name;
  Tensor (*fn)(const Tensor&, const Tensor&);
  double (*ref)(double, double);
  double lo, hi;
};

// Every two-input op of core/op_list.h against its functor in f64, inputs drawn from [lo, hi).
std::vector<BinaryCase> binary_cases() {
  const Range ranges[] = {{"div", 0.5, 3}, {"pow", 0.1, 2}};
  auto range = [&](const char* name) {
    for (const Range& r : ranges)
      if (std::string(r.name) == name) return r;
    return Range{name, -3, 3};
  };
  std::vector<BinaryCase> cases;
#define FRUGAL_CASE(name, F, ...) \
  cases.push_back(                \
      {#name, name, [](double a, double b) { return math::F{}(a, b); }, range(#name).lo, range(#name).hi});
  FRUGAL_BINARY_OP_LIST(FRUGAL_CASE)
#undef FRUGAL_CASE
  return cases;
}
const std::vector<BinaryCase> kBinary = binary_cases();

TEST(Binary, BroadcastingEveryDtype) {
  const std::pair<Shape, Shape> shapes[] = {{{7, 300}, {7, 300}}, {{7, 300}, {300}}, {{7, 1}, {1, 300}},
                                            {{2, 3, 4}, {3, 1}},  {{5}, {}},         {{}, {4, 1}}};
  for (const auto& c : kBinary)
    for (DType t : kFloatTypes)
      for (const auto& [sa, sb] : shapes) {
        const Tensor a = uniform(sa, c.lo, c.hi, t, 3), b = uniform(sb, c.lo, c.hi, t, 4);
        const Tensor y = c.fn(a, b);
        EXPECT_EQ(y.shape(), broadcast_shapes(sa, sb, "test"));
        EXPECT_EQ(y.dtype(), t);
        expect_close(y, testing::reference_binary(a, b, c.ref), tol_for(t),
                     std::string(c.name) + " " + dtype_name(t) + " " + sa.str() + " " + sb.str());
      }
}

TEST(Binary, NonContiguousOperands) {
  for (const auto& c : kBinary) {
    const Tensor a = uniform({30, 20}, c.lo, c.hi, DType::F32, 5).t();                 // [20, 30], transposed
    const Tensor b = uniform({20, 60}, c.lo, c.hi, DType::F32, 6).slice(1, 0, 60, 2);  // [20, 30], step 2
    expect_close(c.fn(a, b), testing::reference_binary(a, b, c.ref), tol_for(DType::F32),
                 std::string(c.name) + " strided");
  }
}

TEST(Binary, IntegerArithmeticAndPromotion) {
  const Tensor a = tensor<int64_t>({1, -2, 3}), b = tensor<int64_t>({4, 5, -6});
  EXPECT_EQ(add(a, b).to_vector<int64_t>(), (std::vector<int64_t>{5, 3, -3}));
  EXPECT_EQ(mul(a, b).dtype(), DType::I64);
  EXPECT_EQ(pow(tensor<int32_t>({2, 3, -1}), tensor<int32_t>({10, 3, 3})).to_vector<int32_t>(),
            (std::vector<int32_t>{1024, 27, -1}));
  const Tensor q = div(a, b);  // true division
  EXPECT_EQ(q.dtype(), DType::F32);
  expect_close(q, {0.25, -0.4, -0.5}, tol_for(DType::F32), "int div");
  EXPECT_EQ(add(a, tensor<float>({0.5f, 0.5f, 0.5f})).dtype(), DType::F32);
  EXPECT_EQ(add(a, 2.5).dtype(), DType::F32);
  EXPECT_EQ(add(a, 2.0).dtype(), DType::I64);
  EXPECT_EQ(add(tensor<float>({1.f}).to(DType::BF16), tensor<float>({1.f}).to(DType::F16)).dtype(),
            DType::F32);
  EXPECT_EQ(add(uniform({2}, 0, 1, DType::BF16), 3.0).dtype(), DType::BF16);
}

// Note [integer overflow wraps]: i64 and i32 arithmetic past the type's range wraps modulo 2^bits (what the
// unsigned type of the same width computes), on contiguous runs and strided ones; u8 wraps modulo 256. Under
// the sanitizers' build (signed overflow is undefined in C++) this failed before the functors wrapped.
template <typename I>
void expect_wrapping_arithmetic() {
  using U = std::make_unsigned_t<I>;
  const I lo = std::numeric_limits<I>::min(), hi = std::numeric_limits<I>::max();
  const std::vector<I> xs{hi, lo, lo, hi, I(-1), I(hi / 3 + 7), I(1), I(lo + 1), I(3)};
  const std::vector<I> ys{I(1), I(-1), lo, hi, lo, I(5), I(-1), I(-2), I(8 * sizeof(I) + 5)};
  std::vector<I> sums, diffs, prods, negated, absolute, powers;
  for (size_t i = 0; i < xs.size(); ++i) {
    sums.push_back(I(U(xs[i]) + U(ys[i])));
    diffs.push_back(I(U(xs[i]) - U(ys[i])));
    prods.push_back(I(U(xs[i]) * U(ys[i])));
    negated.push_back(I(U(0) - U(xs[i])));
    absolute.push_back(xs[i] < 0 ? I(U(0) - U(xs[i])) : xs[i]);
  }
  // 3 to the power 8 * sizeof(I) + 5 (past the range), and two cases that stay inside it.
  const std::vector<I> bases{3, -2, 7}, exps{I(8 * sizeof(I) + 5), 5, 2};
  for (size_t i = 0; i < bases.size(); ++i) {
    U r = 1;
    for (I e = 0; e < exps[i]; ++e) r = U(r * U(bases[i]));
    powers.push_back(I(r));
  }
  // Each value twice, read with a stride of 2: the functor's strided loop beside the contiguous runs.
  auto strided = [](const std::vector<I>& v) {
    std::vector<I> twice;
    for (I e : v) twice.insert(twice.end(), {e, I(0)});
    return tensor<I>(twice).slice(0, 0, int64_t(twice.size()), 2);
  };
  const std::string name = dtype_name(dtype_v<I>);
  for (const bool stride : {false, true}) {
    const Tensor x = stride ? strided(xs) : tensor<I>(xs), y = stride ? strided(ys) : tensor<I>(ys);
    const std::string what = name + (stride ? " strided" : " contiguous");
    EXPECT_EQ(add(x, y).template to_vector<I>(), sums) << what;
    EXPECT_EQ(sub(x, y).template to_vector<I>(), diffs) << what;
    EXPECT_EQ(mul(x, y).template to_vector<I>(), prods) << what;
    EXPECT_EQ(neg(x).template to_vector<I>(), negated) << what;
    EXPECT_EQ(abs(x).template to_vector<I>(), absolute) << what;
    const Tensor b = stride ? strided(bases) : tensor<I>(bases), e = stride ? strided(exps) : tensor<I>(exps);
    EXPECT_EQ(pow(b, e).template to_vector<I>(), powers) << what;
  }
  Tensor inplace = tensor<I>({hi, lo});
  inplace.add_(tensor<I>({I(1), I(-1)}));
  EXPECT_EQ(inplace.template to_vector<I>(), (std::vector<I>{lo, hi})) << name;
}

TEST(Binary, IntegerOverflowWrapsAsTwosComplement) {
  expect_wrapping_arithmetic<int64_t>();
  expect_wrapping_arithmetic<int32_t>();
  EXPECT_EQ(add(tensor<uint8_t>({255, 200}), tensor<uint8_t>({1, 100})).to_vector<uint8_t>(),
            (std::vector<uint8_t>{0, 44}));
  EXPECT_EQ(mul(tensor<uint8_t>({16, 255}), tensor<uint8_t>({16, 255})).to_vector<uint8_t>(),
            (std::vector<uint8_t>{0, 1}));
}

// An f32 and a 16-bit operand (autocast's residual adds): add reads the 16-bit one as it is (op_add_widened),
// and its values are those of the cast and the f32 add, bit for bit, in either order, broadcast, strided,
// and past one buffer of the kernel; no f32 copy of the 16-bit operand is made (one allocation: the result).
TEST(Binary, AddOfF32AndSixteenBitWidensAsItReads) {
  for (DType h : {DType::BF16, DType::F16}) {
    const std::pair<Shape, Shape> shapes[] = {
        {{7, 300}, {7, 300}}, {{7, 300}, {300}}, {{7, 1}, {1, 300}}, {{3}, {}}, {{1000}, {1000}}};
    for (const auto& [sa, sb] : shapes)
      for (bool wide_first : {true, false}) {
        const Tensor w = uniform(wide_first ? sa : sb, -3, 3, DType::F32, 11);
        const Tensor n = uniform(wide_first ? sb : sa, -3, 3, h, 12);
        const Tensor got = wide_first ? add(w, n) : add(n, w);
        const Tensor ref = wide_first ? add(w, n.to(DType::F32)) : add(n.to(DType::F32), w);
        const std::string what = std::string(dtype_name(h)) + " " + sa.str() + " " + sb.str() +
                                 (wide_first ? " f32 first" : " f32 second");
        EXPECT_EQ(got.dtype(), DType::F32) << what;
        EXPECT_EQ(got.shape(), ref.shape()) << what;
        EXPECT_EQ(got.to_vector<float>(), ref.to_vector<float>()) << what;
      }
    const Tensor w = uniform({30, 20}, -3, 3, DType::F32, 13).t();        // [20, 30], transposed
    const Tensor n = uniform({20, 60}, -3, 3, h, 14).slice(1, 0, 60, 2);  // [20, 30], step 2
    EXPECT_EQ(add(w, n).to_vector<float>(), add(w, n.to(DType::F32)).to_vector<float>()) << dtype_name(h);
    const Tensor a = uniform({64, 64}, -3, 3, DType::F32, 15), b = uniform({64, 64}, -3, 3, h, 16);
    const int64_t before = memory::allocator(kCPU).stats().num_allocs;
    const Tensor y = add(a, b);
    EXPECT_EQ(memory::allocator(kCPU).stats().num_allocs - before, 1) << dtype_name(h);
    // The gradient reaches each operand in its own dtype and broadcast shape.
    const Tensor wa = uniform({7, 30}, -3, 3, DType::F32, 17).requires_grad_();
    const Tensor nb = uniform({30}, -3, 3, h, 18).requires_grad_();
    const Tensor g = uniform({7, 30}, -1, 1, DType::F32, 19);
    add(wa, nb).backward(g);
    EXPECT_EQ(wa.grad().to_vector<float>(), g.to_vector<float>()) << dtype_name(h);
    ASSERT_EQ(nb.grad().dtype(), h) << dtype_name(h);
    EXPECT_EQ(nb.grad().to_vector<float>(), sum(g, {0}).to(h).to_vector<float>()) << dtype_name(h);
    // Shapes that do not broadcast are refused before anything is allocated.
    testing::expect_error<ShapeError>([&] { add(uniform({3}, 0, 1), uniform({4}, 0, 1, h)); },
                                      {"add", "[3]", "[4]"});
  }
}

TEST(Binary, ScalarForms) {
  const Tensor x = uniform({100}, 0.5, 2);
  const auto v = x.to_vector<double>();
  const testing::Tol t = tol_for(DType::F32);
  expect_close(x + 2.0, map_values(v, [](double e) { return e + 2; }), t, "x + 2");
  expect_close(2.0 - x, map_values(v, [](double e) { return 2 - e; }), t, "2 - x");
  expect_close(x * 3.0, map_values(v, [](double e) { return e * 3; }), t, "x * 3");
  expect_close(1.0 / x, map_values(v, [](double e) { return 1 / e; }), t, "1 / x");
  expect_close(pow(x, 2.0), map_values(v, [](double e) { return e * e; }), t, "x^2");
  expect_close(-x, map_values(v, [](double e) { return -e; }), t, "-x");
}

TEST(Compare, EveryOpAndWhere) {
  const Tensor a = uniform({6, 50}, -1, 1, DType::F32, 7), b = uniform({50}, -1, 1, DType::F32, 8);
  struct C {
    Tensor (*fn)(const Tensor&, const Tensor&);
    double (*ref)(double, double);
  };
  const C cases[] = {{eq, [](double x, double y) { return double(x == y); }},
                     {ne, [](double x, double y) { return double(x != y); }},
                     {lt, [](double x, double y) { return double(x < y); }},
                     {le, [](double x, double y) { return double(x <= y); }},
                     {gt, [](double x, double y) { return double(x > y); }},
                     {ge, [](double x, double y) { return double(x >= y); }}};
  for (const auto& c : cases) {
    const Tensor r = c.fn(a, b);
    EXPECT_EQ(r.dtype(), DType::Bool);
    EXPECT_EQ(r.to_vector<double>(), testing::reference_binary(a, b, c.ref));
  }
  EXPECT_EQ(eq(tensor<int64_t>({1, 2, 3}), 2.0).to_vector<bool>(), (std::vector<bool>{false, true, false}));
  const Tensor w = where(gt(a, b), a, b);
  EXPECT_EQ(w.to_vector<double>(),
            testing::reference_binary(a, b, [](double x, double y) { return std::max(x, y); }));
  const Tensor s = where(tensor<bool>({true, false}), scalar_tensor(1.0), zeros({3, 2}));
  EXPECT_EQ(s.shape(), (Shape{3, 2}));
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1, 0, 1, 0, 1, 0}));
}

TEST(Cast, EveryPairRoundTrips) {
  const std::vector<double> vals = {0, 1, 2, 3, 7, 100, 0, 1};
  const DType all[] = {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8};
  for (DType from : all)
    for (DType to : all) {
      const Tensor x = tensor<double>(vals).to(from);
      EXPECT_EQ(cast(x, to).dtype(), to);
      EXPECT_EQ(cast(x, to).to_vector<double>(), vals) << dtype_name(from) << " -> " << dtype_name(to);
    }
  EXPECT_EQ(cast(tensor<float>({0.f, -2.5f, 0.1f}), DType::Bool).to_vector<bool>(),
            (std::vector<bool>{false, true, true}));
  EXPECT_EQ(cast(tensor<float>({-2.7f, 2.7f}), DType::I64).to_vector<int64_t>(),
            (std::vector<int64_t>{-2, 2}));
  EXPECT_EQ(cast(tensor<float>({65536.f * 2}), DType::F16).item<float>(), INFINITY);
}

TEST(InPlace, WritesSelfAndBumpsVersion) {
  Tensor x = uniform({4, 5}, -1, 1);
  const auto before = x.to_vector<double>();
  const Tensor row = uniform({5}, -1, 1, DType::F32, 9);
  const uint64_t v0 = x.storage()->version();
  Tensor* same = &add_(x, row);
  EXPECT_EQ(same, &x);
  EXPECT_GT(x.storage()->version(), v0);
  expect_close(x,
               testing::reference_binary(tensor<double>(before, {4, 5}), row,
                                         [](double a, double b) { return a + b; }),
               tol_for(DType::F32), "add_");
  Tensor view = x.select(0, 1);
  mul_(view, 0.0);
  EXPECT_EQ(x.select(0, 1).to_vector<float>(), std::vector<float>(5, 0.f));  // the base sees the write
  Tensor r = tensor<float>({-1.f, 2.f});
  relu_(r);
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{0.f, 2.f}));
  Tensor i = tensor<int64_t>({1, 2});
  add_(i, tensor<float>({0.7f, 0.7f}));  // computed in self's dtype
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
}

TEST(Elementwise, EmptyTensors) {
  const Tensor e = zeros({0, 3});
  EXPECT_EQ(exp(e).shape(), (Shape{0, 3}));
  EXPECT_EQ(add(e, ones({3})).shape(), (Shape{0, 3}));
}

TEST(Elementwise, BadInputs) {
  expect_error<ShapeError>([] { add(ones({2, 3}), ones({4})); }, {"add", "[2, 3]", "[4]", "broadcast"});
  expect_error<DTypeError>([] { exp(arange(3)); }, {"exp", "i64", "floating"});
  expect_error<DTypeError>([] { sin(arange(3)); }, {"sin", "i64", "floating"});
  expect_error<DTypeError>([] { cos(tensor<bool>({true})); }, {"cos", "bool", "floating"});
  expect_error<Error>([] { sin(Tensor()); }, {"undefined"});
  expect_error<DTypeError>([] { neg(tensor<bool>({true})); }, {"neg", "bool", "cpu", "supports"});
  expect_error<DTypeError>([] { where(ones({2}), ones({2}), ones({2})); }, {"where", "bool", "f32"});
  expect_error<ShapeError>(
      [] {
        Tensor x = ones({3});
        add_(x, ones({2, 3}));
      },
      {"add", "[2, 3]", "[3]"});
  expect_error<Error>([] { clamp(ones({2}), 1, 0); }, {"clamp", "min"});
  expect_error<Error>([] { add(Tensor(), ones({2})); }, {"add", "undefined"});
  // Nothing is corrupted by a failed op: the inputs keep their values.
  Tensor x = tensor<float>({1.f, 2.f});
  try {
    add_(x, ones({3}));
  } catch (const Error&) {
  }
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{1.f, 2.f}));
}

// softplus (PyTorch's): x where beta x > threshold, log1p(exp(beta x)) / beta elsewhere; against the formula
// in f64 (the functor's branch included), every dtype, strided too, and the defaults beta 1, threshold 20.
TEST(Unary, Softplus) {
  auto ref = [](double beta, double threshold) {
    return [=](double x) { return x * beta > threshold ? x : std::log1p(std::exp(beta * x)) / beta; };
  };
  for (DType t : kFloatTypes)
    for (auto [beta, threshold] : {std::pair{1.0, 20.0}, std::pair{2.0, 1.0}, std::pair{0.5, 3.0}}) {
      const Tensor x = uniform({37, 300}, -30, 30, t);
      const auto v = x.to_vector<double>();
      std::vector<double> want(v.size());
      for (size_t i = 0; i < v.size(); ++i) want[i] = ref(beta, threshold)(v[i]);
      expect_close(softplus(x, beta, threshold), want, tol_for(t), std::string("softplus ") + dtype_name(t));
      expect_close(x.softplus(beta, threshold), want, tol_for(t), "softplus method");
      expect_close(softplus(x.t(), beta, threshold).t(), want, tol_for(t), "softplus strided");
    }
  const Tensor x = tensor<double>({-100, -1, 0, 1, 19.9, 20.1, 100});
  expect_close(
      softplus(x),
      map_values(x.to_vector<double>(), [](double v) { return v > 20 ? v : std::log1p(std::exp(v)); }),
      tol_for(DType::F64), "softplus defaults");
  EXPECT_EQ(softplus(x).to_vector<double>()[5], 20.1);  // above the threshold: x itself
  expect_error<DTypeError>([] { softplus(arange(3)); }, {"softplus", "i64", "floating"});
}

// sin and cos also on the vectorised (contiguous f32) runs and against std:: directly.
TEST(Unary, SinCos) {
  const Tensor x = uniform({4099}, -20, 20, DType::F32, 21);
  expect_close(sin(x), map_values(x.to_vector<double>(), [](double v) { return std::sin(v); }),
               tol_for(DType::F32), "sin");
  expect_close(x.cos(), map_values(x.to_vector<double>(), [](double v) { return std::cos(v); }),
               tol_for(DType::F32), "cos");
}

// PyTorch's bool arithmetic: add is a logical or, mul a logical and; sub refuses bool with a message.
TEST(Binary, BoolAddMulAndSub) {
  const Tensor a = tensor<bool>({true, true, false, false}), b = tensor<bool>({true, false, true, false});
  EXPECT_EQ(add(a, b).dtype(), DType::Bool);
  EXPECT_EQ((a + b).to_vector<bool>(), (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(mul(a, b).dtype(), DType::Bool);
  EXPECT_EQ((a * b).to_vector<bool>(), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(add(a.slice(0, 0, 4, 2), b.slice(0, 1, 4, 2)).to_vector<bool>(),
            (std::vector<bool>{true, false}));
  expect_error<DTypeError>([&] { sub(a, b); }, {"sub", "bool", "not supported", "[4]"});
  expect_error<DTypeError>([&] { a - b; }, {"sub", "bool"});
}

// Scalar-first forms: op(s, x) is op(scalar_tensor(s), x), the Scalar taking x's dtype.
TEST(Binary, ScalarFirstForms) {
  const Tensor x = uniform({100}, 0.5, 2);
  const auto v = x.to_vector<double>();
  const testing::Tol t = tol_for(DType::F32);
  expect_close(div(2.0, x), map_values(v, [](double e) { return 2 / e; }), t, "div(2, x)");
  expect_close(sub(1.0, x), map_values(v, [](double e) { return 1 - e; }), t, "sub(1, x)");
  expect_close(pow(2.0, x), map_values(v, [](double e) { return std::pow(2, e); }), t, "pow(2, x)");
  expect_close(add(1.0, x), map_values(v, [](double e) { return 1 + e; }), t, "add(1, x)");
  expect_close(mul(2.0, x), map_values(v, [](double e) { return 2 * e; }), t, "mul(2, x)");
  expect_close(maximum(1.0, x), map_values(v, [](double e) { return std::max(1.0, e); }), t, "maximum(1, x)");
  EXPECT_EQ(div(2.0, x).dtype(), DType::F32);
  EXPECT_EQ(sub(1.0, arange(3)).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, -1}));
}

// The methods are the free functions (core/op_list.h generates the elementwise ones).
TEST(Methods, ElementwiseMethodsAreTheFreeFunctions) {
  const Tensor x = uniform({6, 7}, 0.5, 2, DType::F32, 31), y = uniform({7}, 0.5, 2, DType::F32, 32);
  auto same = [](const Tensor& a, const Tensor& b, const char* what) {
    EXPECT_EQ(a.shape(), b.shape()) << what;
    EXPECT_EQ(a.to_vector<double>(), b.to_vector<double>()) << what;
  };
  same(x.relu(), relu(x), "relu");
  same(x.exp(), exp(x), "exp");
  same(x.log(), log(x), "log");
  same(x.sqrt(), sqrt(x), "sqrt");
  same(x.sigmoid(), sigmoid(x), "sigmoid");
  same(x.tanh(), tanh(x), "tanh");
  same(x.abs(), abs(x), "abs");
  same(x.neg(), neg(x), "neg");
  same(x.pow(2), pow(x, 2.0), "pow");
  same(x.pow(y), pow(x, y), "pow tensor");
  same(x.clamp(0.7, 1.5), clamp(x, 0.7, 1.5), "clamp");
  same(x.add(y), add(x, y), "add");
  same(x.sub(1.0), sub(x, 1.0), "sub");
  same(x.mul(y), mul(x, y), "mul");
  same(x.div(y), div(x, y), "div");
  same(x.maximum(y), maximum(x, y), "maximum");
  same(x.gt(1.0), gt(x, 1.0), "gt");
  same(x.eq(y), eq(x, y), "eq");
  same(x.where(x.gt(1.0), y), where(x.gt(1.0), x, y), "where");
  same(x.clamp_min(1.0), clamp_min(x, 1.0), "clamp_min");
  Tensor z = x.clone();
  z.sub_(1.0).relu_();
  same(z, relu(sub(x, 1.0)), "sub_ relu_");
  z.clamp_(0.1, 0.2);
  same(z, clamp(relu(sub(x, 1.0)), 0.1, 0.2), "clamp_");
  z.div_(2.0);
  same(z, div(clamp(relu(sub(x, 1.0)), 0.1, 0.2), 2.0), "div_");
}

TEST(Methods, ReductionsAndSoftmax) {
  const Tensor x = uniform({5, 8}, -2, 2, DType::F32, 33);
  auto same = [](const Tensor& a, const Tensor& b, const char* what) {
    EXPECT_EQ(a.shape(), b.shape()) << what;
    EXPECT_EQ(a.to_vector<double>(), b.to_vector<double>()) << what;
  };
  same(x.max(), max(x), "max");
  same(x.min(), min(x), "min");
  same(x.max({1}, true), max(x, {1}, true), "max dims");
  same(x.min({0}), min(x, {0}), "min dims");
  same(x.var(), var(x), "var");
  same(x.var({1}, 0), var(x, {1}, 0), "var dims");
  same(x.argmax(), argmax(x), "argmax");
  same(x.argmax(1), argmax(x, 1), "argmax dim");
  same(x.argmin(0, true), argmin(x, 0, true), "argmin dim");
  same(x.softmax(-1), softmax(x, -1), "softmax");
  same(x.log_softmax(0), log_softmax(x, 0), "log_softmax");
}

}  // namespace
}  // namespace frugal

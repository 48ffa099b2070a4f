// CUDA elementwise ops, casts and fills against the CPU on random inputs, in f32, f16 and bf16 (and the
// integer types where the GPU has them): contiguous (the 16-byte vector path), misaligned and strided views
// (the strided path), broadcasting and scalar operands, in-place forms. Skipped without a GPU.
#include <cmath>

#include "tests/cuda/gpu_test.h"

namespace frugal {
namespace {

using testing::expect_gpu_matches_cpu;
using testing::GpuTest;
using testing::tol_for;
using testing::uniform;

using Elementwise = GpuTest;
using Inputs = std::vector<Tensor>;

const DType kFloats[] = {DType::F32, DType::F16, DType::BF16};

// Every layout the kernels distinguish, for a unary op f: contiguous with a ragged tail, one element in (not
// 16-byte aligned), a transposed view, a 0-d tensor.
void check_unary_layouts(const std::function<Tensor(const Tensor&)>& f, const Tensor& x, testing::Tol tol,
                         const std::string& what) {
  expect_gpu_matches_cpu([&](const Inputs& in) { return f(in[0]); }, {x}, tol, what + " contiguous");
  expect_gpu_matches_cpu([&](const Inputs& in) { return f(in[0].reshape({-1}).narrow(0, 1, x.numel() - 1)); },
                         {x}, tol, what + " misaligned");
  expect_gpu_matches_cpu([&](const Inputs& in) { return f(in[0].t()); }, {x}, tol, what + " transposed");
  expect_gpu_matches_cpu([&](const Inputs& in) { return f(in[0].select(0, 2).select(0, 3)); }, {x}, tol,
                         what + " 0-d");
}

TEST_F(Elementwise, UnaryOpsMatchTheCpu) {
  struct Case {
    const char* name;
    Tensor (*f)(const Tensor&);
    double lo, hi;
  };
  const Case cases[] = {
      {"neg", ops::neg, -5, 5},           {"abs", ops::abs, -5, 5},   {"exp", ops::exp, -8, 8},
      {"log", ops::log, 0.01, 50},        {"sqrt", ops::sqrt, 0, 50}, {"rsqrt", ops::rsqrt, 0.01, 50},
      {"relu", ops::relu, -5, 5},         {"gelu", ops::gelu, -6, 6}, {"gelu_tanh", ops::gelu_tanh, -6, 6},
      {"sigmoid", ops::sigmoid, -12, 12}, {"tanh", ops::tanh, -6, 6}, {"silu", ops::silu, -12, 12},
      {"erf", ops::erf, -3, 3},
  };
  for (DType t : kFloats)
    for (const Case& c : cases)
      check_unary_layouts(c.f, uniform({37, 29}, c.lo, c.hi, t, 3), tol_for(t),
                          std::string(c.name) + " " + dtype_name(t));
  for (DType t : kFloats)
    check_unary_layouts([](const Tensor& x) { return ops::clamp(x, -0.5, 1.25); },
                        uniform({37, 29}, -2, 2, t, 4), tol_for(t), std::string("clamp ") + dtype_name(t));
  for (DType t : {DType::I64, DType::I32}) {
    const Tensor x = uniform({37, 29}, -100, 100, DType::F64, 5).to(t);
    for (auto f : {ops::neg, ops::abs, ops::relu}) check_unary_layouts(f, x, {0, 0}, dtype_name(t));
    check_unary_layouts([](const Tensor& v) { return ops::clamp(v, -20.5, INFINITY); }, x, {0, 0},
                        "clamp int");
  }
}

TEST_F(Elementwise, BinaryOpsBroadcastLikeTheCpu) {
  struct Case {
    const char* name;
    Tensor (*f)(const Tensor&, const Tensor&);
  };
  const Case cases[] = {{"add", ops::add},        {"sub", ops::sub}, {"mul", ops::mul},
                        {"div", ops::div},        {"pow", ops::pow}, {"maximum", ops::maximum},
                        {"minimum", ops::minimum}};
  for (DType t : kFloats) {
    const Tensor a = uniform({4, 1, 65}, 0.5, 3, t, 6), b = uniform({3, 65}, -2, 2, t, 7);
    const Tensor same = uniform({4, 3, 65}, 0.5, 2, t, 8);
    for (const Case& c : cases) {
      const std::string what = std::string(c.name) + " " + dtype_name(t);
      expect_gpu_matches_cpu([&](const Inputs& in) { return c.f(in[0], in[1]); }, {a, b}, tol_for(t),
                             what + " broadcast");
      expect_gpu_matches_cpu([&](const Inputs& in) { return c.f(in[0], in[1]); }, {same, a}, tol_for(t),
                             what + " one broadcast");
      expect_gpu_matches_cpu([&](const Inputs& in) { return c.f(in[0], in[1].select(0, 1).select(0, 2)); },
                             {same, same}, tol_for(t), what + " scalar tensor");
      // Rows and columns broadcast over a matrix whose rows hold whole vectors: the vector path.
      expect_gpu_matches_cpu(
          [&](const Inputs& in) {
            return c.f(in[0].reshape({12, 64}), in[1].narrow(1, 0, 64));
          },
          {uniform({3, 4, 64}, 0.5, 2, t, 15), uniform({1, 65}, 0.5, 2, t, 16)}, tol_for(t),
          what + " row broadcast");
      expect_gpu_matches_cpu([&](const Inputs& in) { return c.f(in[1], in[0]); },
                             {uniform({12, 1}, 0.5, 2, t, 17), uniform({12, 64}, 0.5, 2, t, 18)}, tol_for(t),
                             what + " column broadcast");
      expect_gpu_matches_cpu(
          [&](const Inputs& in) { return c.f(in[0].transpose(0, 2), in[1].transpose(0, 2)); }, {same, same},
          tol_for(t), what + " transposed");
    }
    expect_gpu_matches_cpu([](const Inputs& in) { return ops::add(in[0], 2.5); }, {same}, tol_for(t),
                           "add scalar");
    expect_gpu_matches_cpu(
        [](const Inputs& in) {
          Tensor x = in[0].clone();
          x.add_(in[1]);
          x.mul_(0.5);
          return x;
        },
        {same, b}, tol_for(t), "in place");
  }
  for (DType t : {DType::I64, DType::I32}) {
    const Tensor a = uniform({5, 1}, -50, 50, DType::F64, 9).to(t),
                 b = uniform({7}, -50, 50, DType::F64, 10).to(t);
    for (const Case& c : cases) {
      if (std::string(c.name) == "div" || std::string(c.name) == "pow") continue;
      expect_gpu_matches_cpu([&](const Inputs& in) { return c.f(in[0], in[1]); }, {a, b}, {0, 0},
                             std::string(c.name) + " " + dtype_name(t));
    }
    const Tensor base = uniform({64}, -4, 4, DType::F64, 11).to(t),
                 e = uniform({64}, -2, 6, DType::F64, 12).to(t);
    expect_gpu_matches_cpu([](const Inputs& in) { return ops::pow(in[0], in[1]); }, {base, e}, {0, 0},
                           "int pow");
  }
}

TEST_F(Elementwise, ComparisonsAndWhereMatchTheCpu) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8, DType::Bool}) {
    // Few distinct values, so that equal elements are common.
    const Tensor a = uniform({6, 1, 33}, 0, 4, DType::F64, 13).to(DType::I64).to(t);
    const Tensor b = uniform({5, 33}, 0, 4, DType::F64, 14).to(DType::I64).to(t);
    using Compare = Tensor (*)(const Tensor&, const Tensor&);
    for (Compare f : {Compare(ops::eq), Compare(ops::ne), Compare(ops::lt), Compare(ops::le),
                      Compare(ops::gt), Compare(ops::ge)})
      expect_gpu_matches_cpu([&](const Inputs& in) { return f(in[0], in[1]); }, {a, b}, {0, 0},
                             std::string("compare ") + dtype_name(t));
    expect_gpu_matches_cpu([](const Inputs& in) { return ops::where(ops::gt(in[0], in[1]), in[0], in[1]); },
                           {a, b}, {0, 0}, std::string("where ") + dtype_name(t));
  }
}

TEST_F(Elementwise, CastsBetweenEveryPairOfDtypesMatchTheCpu) {
  const DType all[] = {DType::F32, DType::F64, DType::F16, DType::BF16,
                       DType::I64, DType::I32, DType::U8,  DType::Bool};
  // Values every dtype holds (u8 takes no negatives), with fractions that truncate and halves that round.
  const Tensor v = uniform({41, 17}, 0, 120, DType::F64, 15);
  for (DType from : all) {
    const Tensor x = v.to(from);
    for (DType to : all) {
      const std::string what = std::string("cast ") + dtype_name(from) + " -> " + dtype_name(to);
      expect_gpu_matches_cpu([&](const Inputs& in) { return ops::cast(in[0], to); }, {x}, {0, 0}, what);
      expect_gpu_matches_cpu([&](const Inputs& in) { return ops::cast(in[0].t(), to); }, {x}, {0, 0},
                             what + " transposed");
    }
  }
  // Same-dtype contiguous copies (a cudaMemcpyAsync) and strided ones.
  expect_gpu_matches_cpu([](const Inputs& in) { return in[0].clone(); }, {v.to(DType::BF16)}, {0, 0},
                         "clone");
  expect_gpu_matches_cpu([](const Inputs& in) { return in[0].t().contiguous(); }, {v}, {0, 0}, "contiguous");
}

TEST_F(Elementwise, FillMakesEveryDtype) {
  for (DType t :
       {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8, DType::Bool}) {
    EXPECT_EQ(full({3, 5}, 7.75, TensorOptions(t).device(testing::kGpu)).to(kCPU).to_vector<double>(),
              full({3, 5}, 7.75, t).to_vector<double>())
        << dtype_name(t);
    Tensor z = ones({4, 6}, TensorOptions(t).device(testing::kGpu));
    Tensor view = z.narrow(1, 1, 3);
    view.zero_();  // a strided fill
    EXPECT_EQ(z.to(kCPU).to_vector<double>(), [&] {
      Tensor c = ones({4, 6}, t);
      Tensor cv = c.narrow(1, 1, 3);
      cv.zero_();
      return c.to_vector<double>();
    }()) << dtype_name(t);
  }
}

}  // namespace
}  // namespace frugal

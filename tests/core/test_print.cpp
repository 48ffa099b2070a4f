// Tests of tensor printing (core/print.cpp) against PyTorch's format (torch/_tensor_str.py, default options:
// precision 4, threshold 1000, edgeitems 3, linewidth 80). The expected strings were written by hand from
// those rules; frugal's dtype names (f64) and shapes in size=(...) replace torch.float64 and torch.Size.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "frugal.h"

namespace frugal {
namespace {

std::string printed(const Tensor& t) {
  std::ostringstream os;
  os << t;
  EXPECT_EQ(os.str(), t.str()) << "operator<< and str() differ";
  return os.str();
}

TEST(Print, WholeFloatsGetATrailingPoint) {
  EXPECT_EQ(printed(tensor<float>({1, 2, 3})), "tensor([1., 2., 3.])");
  EXPECT_EQ(printed(tensor<float>({-1, 20, 300})), "tensor([ -1.,  20., 300.])");
  EXPECT_EQ(printed(zeros({3})), "tensor([0., 0., 0.])");
  EXPECT_EQ(printed(tensor<float>({100000000})), "tensor([100000000.])");  // 1e8 itself is not > 1e8
}

TEST(Print, FixedPointWithFourDecimalsAlignedToTheWidest) {
  EXPECT_EQ(printed(tensor<float>({0.5f, -1.25f, 2, 3}, {2, 2})),
            "tensor([[ 0.5000, -1.2500],\n"
            "        [ 2.0000,  3.0000]])");
  EXPECT_EQ(printed(tensor<float>({0.5f, 400.25f})), "tensor([  0.5000, 400.2500])");  // ratio 800.5 < 1000
  EXPECT_EQ(printed(tensor<float>({0.123449f, 0.000199f})), "tensor([0.1234, 0.0002])");  // min >= 1e-4
}

TEST(Print, IntegersAndBools) {
  EXPECT_EQ(printed(arange(3)), "tensor([0, 1, 2])");
  EXPECT_EQ(printed(tensor<int64_t>({-10, 5, 300})), "tensor([-10,   5, 300])");
  EXPECT_EQ(printed(tensor<int32_t>({1, 2})), "tensor([1, 2], dtype=i32)");
  EXPECT_EQ(printed(tensor<uint8_t>({0, 255})), "tensor([  0, 255], dtype=u8)");
  EXPECT_EQ(printed(tensor<bool>({true, false})), "tensor([ True, False])");
  EXPECT_EQ(printed(tensor<bool>({true, true})), "tensor([True, True])");
}

TEST(Print, DTypeSuffix) {
  EXPECT_EQ(printed(tensor<double>({1, 2})), "tensor([1., 2.], dtype=f64)");
  EXPECT_EQ(printed(tensor<float>({0.5f, 1}).to(DType::F16)), "tensor([0.5000, 1.0000], dtype=f16)");
  EXPECT_EQ(printed(tensor<float>({0.5f, -2}).to(DType::BF16)), "tensor([ 0.5000, -2.0000], dtype=bf16)");
}

TEST(Print, ZeroDimTensors) {
  EXPECT_EQ(printed(scalar_tensor(3.5)), "tensor(3.5000)");
  EXPECT_EQ(printed(scalar_tensor(-2)), "tensor(-2.)");
  EXPECT_EQ(printed(scalar_tensor(7, DType::I64)), "tensor(7)");
  EXPECT_EQ(printed(scalar_tensor(0.25, DType::F64)), "tensor(0.2500, dtype=f64)");
  EXPECT_EQ(printed(scalar_tensor(1, DType::Bool)), "tensor(True)");
  EXPECT_EQ(printed(scalar_tensor(1e-5)), "tensor(1.0000e-05)");
}

TEST(Print, EmptyTensorsShowSizeUnlessOneDimAndDTypeUnlessF32) {
  EXPECT_EQ(printed(empty({0})), "tensor([])");
  EXPECT_EQ(printed(zeros({0, 3})), "tensor([], size=(0, 3))");
  // With no elements, not even i64 or bool can be told apart, so PyTorch names every dtype but the default.
  EXPECT_EQ(printed(arange(0)), "tensor([], dtype=i64)");
  EXPECT_EQ(printed(empty({0}, DType::Bool)), "tensor([], dtype=bool)");
  EXPECT_EQ(printed(empty({2, 0, 1}, DType::F16)), "tensor([], size=(2, 0, 1), dtype=f16)");
}

TEST(Print, ScientificNotation) {
  EXPECT_EQ(printed(tensor<float>({1e10f, 1})), "tensor([1.0000e+10, 1.0000e+00])");      // max > 1e8
  EXPECT_EQ(printed(tensor<float>({1e-5f, 1.5f})), "tensor([1.0000e-05, 1.5000e+00])");   // min < 1e-4
  EXPECT_EQ(printed(tensor<float>({0.001f, 2.5f})), "tensor([1.0000e-03, 2.5000e+00])");  // ratio > 1000
  EXPECT_EQ(printed(tensor<float>({1, 2000})), "tensor([1.0000e+00, 2.0000e+03])");       // whole, ratio
  EXPECT_EQ(printed(tensor<float>({150000000})), "tensor([1.5000e+08])");                 // whole, > 1e8
  EXPECT_EQ(printed(tensor<float>({-1e10f, 1})), "tensor([-1.0000e+10,  1.0000e+00])");
  EXPECT_EQ(printed(tensor<double>({1e100, 1})), "tensor([1.0000e+100,  1.0000e+00], dtype=f64)");
  // Zeros do not count as the smallest value.
  EXPECT_EQ(printed(tensor<float>({0, 0.5f})), "tensor([0.0000, 0.5000])");
}

TEST(Print, NonFiniteValues) {
  // The width comes from the finite non-zero values only; nan and inf get no trailing point.
  EXPECT_EQ(printed(tensor<float>({1, -INFINITY, NAN})), "tensor([1., -inf, nan])");
  EXPECT_EQ(printed(tensor<float>({1.5f, NAN, INFINITY})), "tensor([1.5000,    nan,    inf])");
  EXPECT_EQ(printed(tensor<float>({NAN, -INFINITY})), "tensor([nan, -inf])");
  EXPECT_EQ(printed(tensor<float>({1e10f, NAN})), "tensor([1.0000e+10,        nan])");
  EXPECT_EQ(printed(tensor<float>({0, -0.0f})), "tensor([0., -0.])");
}

TEST(Print, NestedDimsAndViews) {
  EXPECT_EQ(printed(arange(8).view({2, 2, 2})),
            "tensor([[[0, 1],\n"
            "         [2, 3]],\n"
            "\n"
            "        [[4, 5],\n"
            "         [6, 7]]])");
  EXPECT_EQ(printed(arange(6).view({2, 3}).t()),
            "tensor([[0, 3],\n"
            "        [1, 4],\n"
            "        [2, 5]])");
  EXPECT_EQ(printed(arange(3).view({3, 1})),
            "tensor([[0],\n"
            "        [1],\n"
            "        [2]])");
}

TEST(Print, LongRowsWrapAtEightyColumns) {
  // Elements per line: (80 - indent) / (width + 2); continuation lines are indented past "tensor([".
  EXPECT_EQ(printed(arange(30)),
            "tensor([ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15, 16, 17,\n"
            "        18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29])");
  EXPECT_EQ(printed(add(arange(12, DType::F32), 0.5)),
            "tensor([ 0.5000,  1.5000,  2.5000,  3.5000,  4.5000,  5.5000,  6.5000,  7.5000,\n"
            "         8.5000,  9.5000, 10.5000, 11.5000])");
  // Rows of a matrix are one deeper, so 72 columns hold 18 four-wide elements.
  EXPECT_EQ(printed(arange(40).view({2, 20})),
            "tensor([[ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15, 16, 17,\n"
            "         18, 19],\n"
            "        [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37,\n"
            "         38, 39]])");
}

TEST(Print, SuffixMovesToItsOwnLineWhenTheLastLineIsFull) {
  // PyTorch's _add_suffixes: a suffix starts a new line when (last line length + 2) + len + 2 > 80.
  EXPECT_EQ(printed(add(arange(7, DType::F64), 0.5)),
            "tensor([0.5000, 1.5000, 2.5000, 3.5000, 4.5000, 5.5000, 6.5000], dtype=f64)");
  EXPECT_EQ(printed(add(arange(8, DType::F64), 0.5)),
            "tensor([0.5000, 1.5000, 2.5000, 3.5000, 4.5000, 5.5000, 6.5000, 7.5000],\n"
            "       dtype=f64)");
}

TEST(Print, SummarizesAboveAThousandElements) {
  EXPECT_EQ(printed(arange(2000)), "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
  EXPECT_EQ(printed(arange(1000)).find("..."), std::string::npos);
  EXPECT_NE(printed(arange(1001)).find(",  ...,  998,  999, 1000])"), std::string::npos);
  EXPECT_EQ(printed(zeros({100, 100})),
            "tensor([[0., 0., 0.,  ..., 0., 0., 0.],\n"
            "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
            "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
            "        ...,\n"
            "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
            "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
            "        [0., 0., 0.,  ..., 0., 0., 0.]])");
  EXPECT_EQ(printed(ones({2, 600}, DType::I32)),
            "tensor([[1, 1, 1,  ..., 1, 1, 1],\n"
            "        [1, 1, 1,  ..., 1, 1, 1]], dtype=i32)");
}

TEST(Print, SummaryOfRandomValuesShowsTheEdges) {
  Generator g(21);
  const Tensor x = add(mul(rand({5000}, DType::F32, &g), 0.5), 0.25);  // in [0.25, 0.75): fixed point
  const auto v = x.to_vector<float>();
  auto f = [](float value) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%.4f", double(value));
    return std::string(buf);
  };
  const std::string expected = "tensor([" + f(v[0]) + ", " + f(v[1]) + ", " + f(v[2]) + ",  ..., " +
                               f(v[4997]) + ", " + f(v[4998]) + ", " + f(v[4999]) + "])";
  EXPECT_EQ(printed(x), expected);
}

}  // namespace
}  // namespace frugal

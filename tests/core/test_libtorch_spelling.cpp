// The libtorch spellings core takes: dtype constants (kF32, kFloat32, kLong, ...) and tensor() from a braced
// list without naming the element type.
#include <gtest/gtest.h>

#include <type_traits>
#include <vector>

#include "frugal.h"

namespace frugal {
namespace {

TEST(LibtorchSpelling, DTypeConstantsNameTheirDType) {
  static_assert(std::is_same_v<decltype(kF32), const DType>);
  struct Row {
    DType constant, expected;
  };
  const Row rows[] = {
      {kF32, DType::F32},     {kFloat32, DType::F32}, {kFloat, DType::F32},     {kF64, DType::F64},
      {kFloat64, DType::F64}, {kDouble, DType::F64},  {kF16, DType::F16},       {kFloat16, DType::F16},
      {kHalf, DType::F16},    {kBF16, DType::BF16},   {kBFloat16, DType::BF16}, {kI64, DType::I64},
      {kInt64, DType::I64},   {kLong, DType::I64},    {kI32, DType::I32},       {kInt32, DType::I32},
      {kInt, DType::I32},     {kU8, DType::U8},       {kUInt8, DType::U8},      {kByte, DType::U8},
      {kBool, DType::Bool},
  };
  for (const Row& r : rows) EXPECT_EQ(r.constant, r.expected) << dtype_name(r.expected);
  EXPECT_EQ(zeros({2}, kBFloat16).dtype(), DType::BF16);
}

TEST(LibtorchSpelling, TensorFromABracedListTakesItsElementType) {
  const Tensor d = tensor({1.0, 2.5});
  EXPECT_EQ(d.dtype(), DType::F64);
  EXPECT_EQ(d.shape(), (Shape{2}));
  EXPECT_EQ(d.to_vector<double>(), (std::vector<double>{1.0, 2.5}));

  const Tensor f = tensor({1.f, -2.f, 3.f});
  EXPECT_EQ(f.dtype(), DType::F32);
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{1.f, -2.f, 3.f}));

  const Tensor i = tensor({1, 2, 3});  // int literals widen to i64, frugal's integer default
  EXPECT_EQ(i.dtype(), DType::I64);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3}));

  const Tensor b = tensor({true, false});
  EXPECT_EQ(b.dtype(), DType::Bool);
  EXPECT_EQ(b.to_vector<bool>(), (std::vector<bool>{true, false}));
}

TEST(LibtorchSpelling, TensorFromABracedListWithShapeOrOptions) {
  const Tensor m = tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(m.shape(), (Shape{2, 3}));
  EXPECT_EQ(m.dtype(), DType::I64);

  const Tensor h = tensor({1.f, 2.f}, kF16);
  EXPECT_EQ(h.dtype(), DType::F16);
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{1.f, 2.f}));
  const Tensor o = tensor({1, 2}, TensorOptions().dtype(kF32).device(kCPU));
  EXPECT_EQ(o.dtype(), DType::F32);

  // Naming the element type still picks it, and a shape that the values do not fill is the usual error.
  EXPECT_EQ(tensor<float>({1, 2}).dtype(), DType::F32);
  EXPECT_EQ(tensor<int32_t>({1, 2}).dtype(), DType::I32);
  EXPECT_EQ(tensor<int32_t>({1, 2}, {2, 1}).dtype(), DType::I32);
  EXPECT_EQ(tensor<double>({1, 2}, kF32).dtype(), DType::F32);
  EXPECT_THROW(tensor({1.0, 2.0, 3.0}, {2, 2}), ShapeError);
}

}  // namespace
}  // namespace frugal

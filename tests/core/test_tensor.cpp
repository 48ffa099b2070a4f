// Tests of the tensor handle (core/tensor.cpp): metadata, views checked against index math written by hand,
// storage sharing and write-through, copies and conversions, element access, and the messages of bad calls.
// The factories and random draws are tested in test_factories.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <typeinfo>
#include <vector>

#include "frugal.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using Index = std::vector<int64_t>;

using testing::expect_exact_error;

// Distinct normal values from a fixed seed, stored as f64 (drawn in f32 so that any dtype holds them).
Tensor random_tensor(const Shape& shape, uint64_t seed = 1) {
  Generator g(seed);
  return randn(shape, DType::F32, &g).to(DType::F64);
}

// Position of idx in a contiguous row-major tensor of this shape.
int64_t flat(const Index& idx, const Shape& shape) {
  int64_t f = 0;
  for (int d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[size_t(d)];
  return f;
}

// Every multi-index of shape, in row-major order.
std::vector<Index> all_indices(const Shape& shape) {
  std::vector<Index> out;
  Index idx(size_t(shape.size()), 0);
  for (int64_t n = 0; n < shape.numel(); ++n) {
    out.push_back(idx);
    for (int d = shape.size() - 1; d >= 0; --d) {
      if (++idx[size_t(d)] < shape[d]) break;
      idx[size_t(d)] = 0;
    }
  }
  return out;
}

// Expects `view` to share base's storage and hold, at each index i, base's element at map(i). base is
// contiguous; map is the view's index math written out by hand.
void expect_view(const Tensor& view, const Tensor& base, const std::function<Index(const Index&)>& map) {
  EXPECT_TRUE(view.storage() == base.storage()) << "the view does not share the base's storage";
  const auto got = view.to_vector<double>(), b = base.to_vector<double>();
  const auto indices = all_indices(view.shape());
  ASSERT_EQ(got.size(), indices.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const Index src = map(indices[i]);
    ASSERT_EQ(got[i], b[size_t(flat(src, base.shape()))])
        << "at view element " << i << " of shape " << view.shape();
  }
}

// Expects t to hold the same elements as base in the same row-major order, sharing storage.
void expect_same_order_view(const Tensor& t, const Tensor& base) {
  EXPECT_TRUE(t.storage() == base.storage());
  EXPECT_EQ(t.to_vector<double>(), base.to_vector<double>());
}

// ---- metadata ---------------------------------------------------------------------------------------------

TEST(TensorMetadata, ContiguousTensor) {
  const Tensor t = empty({2, 3, 4});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.stride(1), 4);
  EXPECT_EQ(t.stride(-3), 12);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.dtype(), DType::F32);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_EQ(t.element_size(), 4);
  EXPECT_EQ(t.nbytes(), 96);
  EXPECT_EQ(t.byte_offset(), 0);
  EXPECT_EQ(t.options().dtype_, DType::F32);
  EXPECT_TRUE(t.is_same(t));
  EXPECT_FALSE(t.is_same(empty({2, 3, 4})));
}

TEST(TensorMetadata, ElementSizeAndBytesPerDType) {
  const std::pair<DType, int64_t> sizes[] = {{DType::F32, 4},  {DType::F64, 8}, {DType::F16, 2},
                                             {DType::BF16, 2}, {DType::I64, 8}, {DType::I32, 4},
                                             {DType::U8, 1},   {DType::Bool, 1}};
  for (auto [t, size] : sizes) {
    const Tensor x = empty({3, 5}, t);
    EXPECT_EQ(x.dtype(), t);
    EXPECT_EQ(x.element_size(), size) << dtype_name(t);
    EXPECT_EQ(x.nbytes(), 15 * size) << dtype_name(t);
  }
}

TEST(TensorMetadata, ScalarAndEmptyTensors) {
  const Tensor s = scalar_tensor(2.0);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_EQ(s.strides(), Shape{});
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.nbytes(), 4);
  EXPECT_TRUE(s.is_contiguous());

  const Tensor e = empty({2, 0, 3});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.nbytes(), 0);
  EXPECT_EQ(e.strides(), (Shape{3, 3, 1}));
  EXPECT_TRUE(e.is_contiguous());
}

TEST(TensorMetadata, ContiguityIgnoresSizeOneDims) {
  const Tensor a = empty({3, 4});
  EXPECT_TRUE(a.narrow(0, 1, 1).is_contiguous());  // shape [1, 4], strides [4, 1]
  EXPECT_FALSE(a.narrow(1, 0, 2).is_contiguous());
  EXPECT_FALSE(a.t().is_contiguous());
  EXPECT_TRUE(a.select(1, 2).unsqueeze(1).narrow(0, 0, 1).is_contiguous());  // [1, 1], any strides
  EXPECT_EQ(a.narrow(0, 2, 1).byte_offset(), 2 * 4 * 4);
  EXPECT_EQ(a.to(DType::F64).narrow(1, 3, 1).byte_offset(), 3 * 8);
}

// ---- views ------------------------------------------------------------------------------------------------

TEST(TensorViews, ViewWithInferredDimSharesStorageAndSeesWrites) {
  const Tensor base = random_tensor({2, 3, 4});
  const Tensor v = base.view({4, -1});
  EXPECT_EQ(v.shape(), (Shape{4, 6}));
  EXPECT_EQ(v.strides(), (Shape{6, 1}));
  expect_same_order_view(v, base);
  expect_same_order_view(base.view({-1}), base);
  EXPECT_EQ(base.view({2, -1, 2}).shape(), (Shape{2, 6, 2}));
  expect_same_order_view(base.view({1, 24, 1}), base);

  const auto before = base.to_vector<double>();
  v.select(0, 2).fill_(9.5);  // row 2 of the [4, 6] view is base elements 12..17
  const auto after = base.to_vector<double>();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i], i >= 12 && i < 18 ? 9.5 : before[i]) << i;

  EXPECT_EQ(scalar_tensor(3.0).view({1, 1}).shape(), (Shape{1, 1}));
  EXPECT_EQ(scalar_tensor(3.0).view({-1}).shape(), (Shape{1}));
  EXPECT_EQ(random_tensor({1}).view({}).dim(), 0);
  EXPECT_EQ(zeros({2, 0}).view({0, 5}).shape(), (Shape{0, 5}));
}

TEST(TensorViews, ViewOfNonContiguousTensorWithCompatibleStrides) {
  const Tensor base = random_tensor({4, 6});
  const Tensor x = base.narrow(1, 0, 3);  // [4, 3], strides [6, 1]
  const Tensor y = x.view({2, 2, 3});     // splits the outer dim only
  EXPECT_EQ(y.strides(), (Shape{12, 6, 1}));
  expect_view(y, base, [](const Index& i) { return Index{2 * i[0] + i[1], i[2]}; });

  const Tensor t = base.t();  // [6, 4], strides [1, 6]
  const Tensor z = t.view({6, 2, 2});
  EXPECT_EQ(z.strides(), (Shape{1, 12, 6}));
  expect_view(z, base, [](const Index& i) { return Index{2 * i[1] + i[2], i[0]}; });
}

TEST(TensorViews, ReshapeViewsWhenPossibleAndCopiesOtherwise) {
  const Tensor base = random_tensor({4, 6});
  expect_same_order_view(base.reshape({3, 8}), base);
  expect_same_order_view(base.reshape({-1}), base);
  const Tensor compatible = base.narrow(1, 0, 3).reshape({2, 2, 3});
  EXPECT_TRUE(compatible.storage() == base.storage());

  Tensor copied = base.t().reshape({24});  // element k is base(k % 4, k / 4)
  EXPECT_FALSE(copied.storage() == base.storage());
  EXPECT_TRUE(copied.is_contiguous());
  const auto c = copied.to_vector<double>(), b = base.to_vector<double>();
  for (int64_t k = 0; k < 24; ++k)
    EXPECT_EQ(c[size_t(k)], b[size_t(flat({k % 4, k / 4}, base.shape()))]) << k;
  copied.fill_(1.0);
  EXPECT_EQ(base.to_vector<double>(), b);
}

TEST(TensorViews, Flatten) {
  const Tensor base = random_tensor({2, 3, 4});
  EXPECT_EQ(base.flatten().shape(), (Shape{24}));
  expect_same_order_view(base.flatten(), base);
  EXPECT_EQ(base.flatten(1).shape(), (Shape{2, 12}));
  EXPECT_EQ(base.flatten(0, 1).shape(), (Shape{6, 4}));
  EXPECT_EQ(base.flatten(-2, -1).shape(), (Shape{2, 12}));
  EXPECT_EQ(base.flatten(1, 1).shape(), (Shape{2, 3, 4}));
  expect_same_order_view(base.flatten(0, 1), base);
  EXPECT_EQ(scalar_tensor(1.0).flatten().shape(), (Shape{1}));
  // A transposed tensor flattens in its own (logical) order: element k of [4, 3, 2] -> (k/6, k/2 % 3, k % 2).
  const Tensor f = base.transpose(0, 2).flatten();
  const auto got = f.to_vector<double>(), b = base.to_vector<double>();
  for (int64_t k = 0; k < 24; ++k)
    EXPECT_EQ(got[size_t(k)], b[size_t(flat({k % 2, k / 2 % 3, k / 6}, base.shape()))]) << k;
}

TEST(TensorViews, TransposeAndT) {
  const Tensor base = random_tensor({2, 3, 4});
  const Tensor v = base.transpose(0, 2);
  EXPECT_EQ(v.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(v.strides(), (Shape{1, 4, 12}));
  expect_view(v, base, [](const Index& i) { return Index{i[2], i[1], i[0]}; });
  expect_view(base.transpose(-1, -3), base, [](const Index& i) { return Index{i[2], i[1], i[0]}; });
  expect_view(base.transpose(1, 2), base, [](const Index& i) { return Index{i[0], i[2], i[1]}; });
  expect_view(base.transpose(1, 1), base, [](const Index& i) { return i; });

  const Tensor m = random_tensor({3, 5});
  EXPECT_EQ(m.t().shape(), (Shape{5, 3}));
  expect_view(m.t(), m, [](const Index& i) { return Index{i[1], i[0]}; });
  expect_view(m.t().t(), m, [](const Index& i) { return i; });
  EXPECT_EQ(random_tensor({5}).t().shape(), (Shape{5}));

  v.select(0, 1).fill_(-7.0);  // base[:, :, 1] = -7
  const auto b = base.to_vector<double>();
  for (const Index& i : all_indices(base.shape())) {
    if (i[2] == 1) {
      EXPECT_EQ(b[size_t(flat(i, base.shape()))], -7.0);
    }
  }
}

TEST(TensorViews, Permute) {
  const Tensor base = random_tensor({2, 3, 4});
  const Tensor p = base.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  expect_view(p, base, [](const Index& i) { return Index{i[1], i[2], i[0]}; });
  expect_view(base.permute({-1, 0, 1}), base, [](const Index& i) { return Index{i[1], i[2], i[0]}; });
  expect_view(base.permute({1, 2, 0}), base, [](const Index& i) { return Index{i[2], i[0], i[1]}; });
  expect_view(base.permute({0, 1, 2}), base, [](const Index& i) { return i; });
}

TEST(TensorViews, Narrow) {
  const Tensor base = random_tensor({2, 3, 4});
  const Tensor n = base.narrow(1, 1, 2);
  EXPECT_EQ(n.shape(), (Shape{2, 2, 4}));
  EXPECT_EQ(n.byte_offset(), 4 * 8);
  expect_view(n, base, [](const Index& i) { return Index{i[0], i[1] + 1, i[2]}; });
  expect_view(base.narrow(2, -3, 2), base, [](const Index& i) { return Index{i[0], i[1], i[2] + 1}; });
  expect_view(base.narrow(-1, 3, 1), base, [](const Index& i) { return Index{i[0], i[1], 3}; });
  EXPECT_EQ(base.narrow(2, 4, 0).shape(), (Shape{2, 3, 0}));

  base.narrow(0, 1, 1).narrow(2, 1, 2).fill_(0.25);  // base[1, :, 1:3]
  const auto b = base.to_vector<double>();
  for (const Index& i : all_indices(base.shape()))
    EXPECT_EQ(b[size_t(flat(i, base.shape()))] == 0.25, i[0] == 1 && (i[2] == 1 || i[2] == 2));
}

TEST(TensorViews, SliceWithStepAndNegativeBounds) {
  const Tensor base = random_tensor({2, 3, 10});
  // Each case: (start, end, step) and the positions Python's x[..., start:end:step] picks.
  const struct {
    int64_t start, end, step;
    Index picks;
  } cases[] = {{1, 8, 3, {1, 4, 7}},   {-4, -1, 1, {6, 7, 8}},
               {0, 100, 4, {0, 4, 8}}, {7, 3, 1, {}},
               {-100, 2, 1, {0, 1}},   {2, 10, 5, {2, 7}},
               {9, 10, 2, {9}},        {0, 10, 1, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}}};
  for (const auto& c : cases) {
    for (int64_t dim : {2, -1}) {
      const Tensor s = base.slice(dim, c.start, c.end, c.step);
      ASSERT_EQ(s.shape(), (Shape{2, 3, int64_t(c.picks.size())}))
          << c.start << ":" << c.end << ":" << c.step;
      expect_view(s, base, [&](const Index& i) { return Index{i[0], i[1], c.picks[size_t(i[2])]}; });
    }
  }
  expect_view(base.slice(1, 0, 3, 2), base, [](const Index& i) { return Index{i[0], 2 * i[1], i[2]}; });
  // Writing through a stepped slice: base[:, :, 1::3] = 4.
  base.slice(2, 1, 10, 3).fill_(4.0);
  const auto b = base.to_vector<double>();
  for (const Index& i : all_indices(base.shape()))
    EXPECT_EQ(b[size_t(flat(i, base.shape()))] == 4.0, i[2] % 3 == 1) << i[2];
}

TEST(TensorViews, SelectWithNegativeIndex) {
  const Tensor base = random_tensor({2, 3, 4});
  const Tensor s = base.select(1, -1);
  EXPECT_EQ(s.shape(), (Shape{2, 4}));
  EXPECT_EQ(s.strides(), (Shape{12, 1}));
  expect_view(s, base, [](const Index& i) { return Index{i[0], 2, i[1]}; });
  expect_view(base.select(0, 1), base, [](const Index& i) { return Index{1, i[0], i[1]}; });
  expect_view(base.select(-1, -4), base, [](const Index& i) { return Index{i[0], i[1], 0}; });
  const Tensor scalar = base.select(0, 1).select(0, 2).select(0, 3);
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.item<double>(), base.to_vector<double>()[size_t(flat({1, 2, 3}, base.shape()))]);

  base.select(2, -2).copy_(full({2, 3}, 6.5, DType::F64));  // base[:, :, 2] = 6.5
  const auto b = base.to_vector<double>();
  for (const Index& i : all_indices(base.shape()))
    EXPECT_EQ(b[size_t(flat(i, base.shape()))] == 6.5, i[2] == 2);
}

TEST(TensorViews, ExpandAndExpandAs) {
  const Tensor x = random_tensor({3, 1});
  const Tensor e = x.expand({2, 3, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  expect_view(e, x, [](const Index& i) { return Index{i[1], 0}; });
  expect_view(x.expand({-1, 5}), x, [](const Index& i) { return Index{i[0], 0}; });
  expect_view(x.expand({3, 1}), x, [](const Index& i) { return i; });
  expect_view(x.expand_as(zeros({7, 3, 2})), x, [](const Index& i) { return Index{i[1], 0}; });
  expect_view(x.expand({0, 3, 1}), x, [](const Index& i) { return i; });  // a new dim of size 0
  const Tensor s = random_tensor({});
  expect_view(s.expand({2, 2}), s, [](const Index&) { return Index{}; });
  const Tensor row = random_tensor({1, 4});
  expect_view(row.expand({3, -1}), row, [](const Index& i) { return Index{0, i[1]}; });
}

TEST(TensorViews, SqueezeAndUnsqueeze) {
  const Tensor base = random_tensor({1, 3, 1, 2});
  const std::pair<Tensor, Shape> squeezed[] = {{base.squeeze(), {3, 2}},
                                               {base.squeeze(2), {1, 3, 2}},
                                               {base.squeeze(1), {1, 3, 1, 2}},  // size 3: unchanged
                                               {base.squeeze(-4), {3, 1, 2}},
                                               {base.squeeze(-2), {1, 3, 2}}};
  for (const auto& [t, shape] : squeezed) {
    EXPECT_EQ(t.shape(), shape);
    expect_same_order_view(t, base);
  }
  EXPECT_EQ(scalar_tensor(1.0).squeeze().dim(), 0);
  EXPECT_EQ(scalar_tensor(1.0).squeeze(0).dim(), 0);

  const Tensor m = random_tensor({3, 4});
  const std::pair<int64_t, Shape> unsqueezed[] = {{0, {1, 3, 4}},  {1, {3, 1, 4}},  {2, {3, 4, 1}},
                                                  {-1, {3, 4, 1}}, {-2, {3, 1, 4}}, {-3, {1, 3, 4}}};
  for (const auto& [d, shape] : unsqueezed) {
    const Tensor u = m.unsqueeze(d);
    EXPECT_EQ(u.shape(), shape) << "unsqueeze(" << d << ")";
    EXPECT_TRUE(u.is_contiguous());
    expect_same_order_view(u, m);
  }
  expect_view(m.t().unsqueeze(1), m, [](const Index& i) { return Index{i[2], i[0]}; });
  EXPECT_EQ(scalar_tensor(1.0).unsqueeze(0).shape(), (Shape{1}));
  EXPECT_EQ(scalar_tensor(1.0).unsqueeze(-1).shape(), (Shape{1}));
}

TEST(TensorViews, AsStrided) {
  const Tensor base = random_tensor({10});
  const Tensor w = base.as_strided({4, 3}, {2, 1}, 1);  // overlapping windows: w[i][j] = base[1 + 2i + j]
  EXPECT_EQ(w.shape(), (Shape{4, 3}));
  expect_view(w, base, [](const Index& i) { return Index{1 + 2 * i[0] + i[1]}; });
  expect_view(base.as_strided({2, 5}, {1, 2}, 0), base,
              [](const Index& i) { return Index{i[0] + 2 * i[1]}; });
  w.select(1, 0).fill_(-1.0);  // base[1], base[3], base[5], base[7]
  const auto b = base.to_vector<double>();
  for (int64_t k = 0; k < 10; ++k) EXPECT_EQ(b[size_t(k)] == -1.0, k % 2 == 1 && k < 9) << k;
}

TEST(TensorViews, ChainedViewsWriteThroughToTheBase) {
  const Tensor base = random_tensor({4, 6});
  const auto before = base.to_vector<double>();
  // t: (i, j) -> base(j, i); narrow rows 1..4: -> base(j, i + 1); every other column: -> base(2j, i + 1).
  Tensor v = base.t().narrow(0, 1, 4).slice(1, 0, 4, 2);
  EXPECT_EQ(v.shape(), (Shape{4, 2}));
  expect_view(v, base, [](const Index& i) { return Index{2 * i[1], i[0] + 1}; });
  v.copy_(arange(100, 108, 1, DType::F64).view({4, 2}));
  const auto after = base.to_vector<double>();
  for (const Index& i : all_indices(base.shape())) {
    const bool written = i[0] % 2 == 0 && i[1] >= 1 && i[1] <= 4;
    const double want = written ? 100 + 2 * (i[1] - 1) + i[0] / 2 : before[size_t(flat(i, base.shape()))];
    EXPECT_EQ(after[size_t(flat(i, base.shape()))], want) << i[0] << "," << i[1];
  }
}

// ---- copies and conversions -------------------------------------------------------------------------------

TEST(TensorCopies, ContiguousReturnsTheSameTensorOrACopy) {
  const Tensor base = random_tensor({3, 5});
  EXPECT_TRUE(base.contiguous().is_same(base));
  EXPECT_TRUE(base.narrow(0, 1, 1).contiguous().storage() == base.storage());
  Tensor c = base.t().contiguous();
  EXPECT_FALSE(c.storage() == base.storage());
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.strides(), (Shape{3, 1}));
  EXPECT_EQ(c.to_vector<double>(), base.t().to_vector<double>());
  const auto before = base.to_vector<double>();
  c.fill_(0.5);
  EXPECT_EQ(base.to_vector<double>(), before);
}

TEST(TensorCopies, CloneIsIndependent) {
  Tensor base = random_tensor({2, 3}).to(DType::F32);
  Tensor c = base.clone();
  EXPECT_FALSE(c.storage() == base.storage());
  EXPECT_EQ(c.dtype(), DType::F32);
  EXPECT_EQ(c.to_vector<double>(), base.to_vector<double>());
  const auto before = base.to_vector<double>();
  c.fill_(3.0);
  EXPECT_EQ(base.to_vector<double>(), before);
  base.fill_(-1.0);
  EXPECT_EQ(c.to_vector<double>(), std::vector<double>(6, 3.0));

  const Tensor t = random_tensor({4, 5}).t();
  const Tensor tc = t.clone();
  EXPECT_TRUE(tc.is_contiguous());
  EXPECT_EQ(tc.to_vector<double>(), t.to_vector<double>());
}

TEST(TensorCopies, ToDTypeConvertsAndRoundTrips) {
  const Tensor x = random_tensor({50}).to(DType::F32);
  EXPECT_TRUE(x.to(DType::F32).is_same(x));
  EXPECT_EQ(x.to(DType::F64).to(DType::F32).to_vector<float>(), x.to_vector<float>());  // exact
  const auto xs = x.to_vector<float>();
  const auto h = x.to(DType::F16).to_vector<float>(), b = x.to(DType::BF16).to_vector<float>();
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_EQ(h[i], float(Half(xs[i]))) << i;
    EXPECT_EQ(b[i], float(BFloat16(xs[i]))) << i;
  }
  // Floats to integers truncate toward zero; to bool is x != 0; bool to numbers is 0 / 1.
  const Tensor f = tensor<float>({-2.75f, 2.75f, 0.0f, 0.001f, -0.5f, 100.5f});
  EXPECT_EQ(f.to(DType::I64).to_vector<int64_t>(), (std::vector<int64_t>{-2, 2, 0, 0, 0, 100}));
  EXPECT_EQ(f.to(DType::I32).to_vector<int32_t>(), (std::vector<int32_t>{-2, 2, 0, 0, 0, 100}));
  EXPECT_EQ(f.to(DType::Bool).to_vector<bool>(), (std::vector<bool>{true, true, false, true, true, true}));
  EXPECT_EQ(tensor<bool>({true, false, true}).to(DType::F32).to_vector<float>(),
            (std::vector<float>{1, 0, 1}));
  EXPECT_EQ(tensor<int64_t>({-3, 0, 7, 1 << 20}).to(DType::F64).to_vector<double>(),
            (std::vector<double>{-3, 0, 7, 1 << 20}));
  EXPECT_EQ(tensor<int32_t>({0, 17, 255}).to(DType::U8).to_vector<uint8_t>(),
            (std::vector<uint8_t>{0, 17, 255}));
  const Tensor nc = random_tensor({3, 4}).t();
  EXPECT_EQ(nc.to(DType::F32).to_vector<float>(), nc.to_vector<float>());
}

// Note [float to integer casts] (kernels/cpu/elementwise.cpp): truncation toward zero; to u8 through i64,
// wrapping modulo 256 as PyTorch's CPU does; NaN gives 0 and values beyond the integer type saturate.
int64_t reference_i64(double v) {
  if (std::isnan(v)) return 0;
  if (v >= 0x1p63) return std::numeric_limits<int64_t>::max();
  if (v < -0x1p63) return std::numeric_limits<int64_t>::min();
  return int64_t(std::trunc(v));
}
int32_t reference_i32(double v) {
  return int32_t(std::clamp<int64_t>(reference_i64(v), std::numeric_limits<int32_t>::min(),
                                     std::numeric_limits<int32_t>::max()));
}
uint8_t reference_u8(double v) { return uint8_t(uint64_t(reference_i64(v)) & 0xff); }

TEST(TensorCopies, FloatToIntegerCastsAreDefinedForEveryValue) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> values = {-1,    -3.7,  -255,   -256.5,       -257,          300,    255.9,
                                      256,   1e10,  -1e10,  3e9,          -3e9,          nan,    inf,
                                      -inf,  1e30,  -1e30,  9.3e18,       -9.3e18,       0.0,    -0.0,
                                      -0.99, 65504, -65504, 2147483647.0, -2147483648.0, 0x1p63, -0x1p63};
  for (DType from : {DType::F64, DType::F32, DType::F16, DType::BF16}) {
    const Tensor x = tensor(values).to(from);
    const auto held = x.to(DType::F64).to_vector<double>();  // the values as the source dtype holds them
    std::vector<int64_t> i64;
    std::vector<int32_t> i32;
    std::vector<uint8_t> u8;
    for (double v : held) {
      i64.push_back(reference_i64(v));
      i32.push_back(reference_i32(v));
      u8.push_back(reference_u8(v));
    }
    const std::string what = dtype_name(from);
    EXPECT_EQ(x.to(DType::I64).to_vector<int64_t>(), i64) << what;
    EXPECT_EQ(x.to(DType::I32).to_vector<int32_t>(), i32) << what;
    EXPECT_EQ(x.to(DType::U8).to_vector<uint8_t>(), u8) << what;
    // Strided and broadcast runs take the same conversion.
    EXPECT_EQ(x.expand({2, x.size(0)}).t().to(DType::U8).t().select(0, 1).to_vector<uint8_t>(), u8) << what;
  }
  // As PyTorch's CPU: torch.tensor([-1., 300., -3.7]).to(torch.uint8) is [255, 44, 253].
  EXPECT_EQ(tensor<float>({-1.0f, 300.0f, -3.7f}).to(DType::U8).to_vector<uint8_t>(),
            (std::vector<uint8_t>{255, 44, 253}));
  // fill converts its value the same way.
  EXPECT_EQ(full({2}, -1, DType::U8).to_vector<uint8_t>(), std::vector<uint8_t>(2, 255));
  EXPECT_EQ(full({2}, nan, DType::I32).to_vector<int32_t>(), std::vector<int32_t>(2, 0));
  EXPECT_EQ(full({2}, 1e300, DType::I64).to_vector<int64_t>(),
            std::vector<int64_t>(2, std::numeric_limits<int64_t>::max()));
}

TEST(TensorCopies, CopyBroadcastsAndConverts) {
  Tensor dst = zeros({2, 3}, DType::F64);
  Tensor& ret = dst.copy_(tensor<float>({1.5f, -2.0f, 3.25f}));
  EXPECT_EQ(&ret, &dst);
  EXPECT_EQ(dst.to_vector<double>(), (std::vector<double>{1.5, -2, 3.25, 1.5, -2, 3.25}));
  dst.copy_(tensor<int64_t>({7, -8}, {2, 1}));
  EXPECT_EQ(dst.to_vector<double>(), (std::vector<double>{7, 7, 7, -8, -8, -8}));
  dst.copy_(scalar_tensor(4, DType::I32));
  EXPECT_EQ(dst.to_vector<double>(), std::vector<double>(6, 4.0));

  // Into a transposed view: base(j, i) = src(i, j).
  const Tensor base = zeros({3, 2}, DType::F64);
  const Tensor src = random_tensor({2, 3});
  base.t().copy_(src);
  const auto b = base.to_vector<double>(), s = src.to_vector<double>();
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(b[size_t(j * 2 + i)], s[size_t(i * 3 + j)]);

  // f32 -> f16 rounds each element as Half(float) does.
  const Tensor f32 = random_tensor({20}).to(DType::F32);
  Tensor f16 = empty({20}, DType::F16);
  f16.copy_(f32);
  const auto a = f32.to_vector<float>(), h = f16.to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(h[i], float(Half(a[i])));
}

TEST(TensorCopies, FillConvertsToTheDType) {
  EXPECT_EQ(full({3}, 2.5, DType::F64).to_vector<double>(), std::vector<double>(3, 2.5));
  EXPECT_EQ(full({2}, 0.1, DType::F16).to_vector<float>(), std::vector<float>(2, float(Half(0.1f))));
  EXPECT_EQ(full({2}, 0.1, DType::BF16).to_vector<float>(), std::vector<float>(2, float(BFloat16(0.1f))));
  EXPECT_EQ(full({2}, -7, DType::I32).to_vector<int32_t>(), std::vector<int32_t>(2, -7));
  EXPECT_EQ(full({2}, 200, DType::U8).to_vector<uint8_t>(), std::vector<uint8_t>(2, 200));
  EXPECT_EQ(full({2}, 2, DType::Bool).to_vector<bool>(), std::vector<bool>(2, true));
  EXPECT_EQ(full({2}, 0, DType::Bool).to_vector<bool>(), std::vector<bool>(2, false));
  Tensor t = ones({3, 3}, DType::I64);
  EXPECT_EQ(&t.fill_(5), &t);
  t.narrow(1, 1, 1).fill_(-2);  // only the middle column
  EXPECT_EQ(t.to_vector<int64_t>(), (std::vector<int64_t>{5, -2, 5, 5, -2, 5, 5, -2, 5}));
  t.zero_();
  EXPECT_EQ(t.to_vector<int64_t>(), std::vector<int64_t>(9, 0));
}

// ---- element access ---------------------------------------------------------------------------------------

// to_vector<T>() of values 0, 1, 2, 7 held in dtype `from`, for every target T.
template <typename T>
void check_to_vector_from(DType from) {
  const Tensor src = tensor<double>({0, 1, 2, 7}).to(from);
  const std::vector<T> got = src.to_vector<T>();
  ASSERT_EQ(got.size(), 4u);
  const double held[4] = {0, 1, from == DType::Bool ? 1.0 : 2.0, from == DType::Bool ? 1.0 : 7.0};
  for (int i = 0; i < 4; ++i) {
    const double want = std::is_same_v<T, bool> ? double(held[i] != 0) : held[i];
    EXPECT_EQ(double(acc_t<T>(got[size_t(i)])), want) << dtype_name(from) << " -> " << dtype_name(dtype_v<T>);
  }
  const double want_last = std::is_same_v<T, bool> ? 1.0 : held[3];
  EXPECT_EQ(double(acc_t<T>(src.select(0, 3).item<T>())), want_last);
}

TEST(TensorAccess, ToVectorAndItemConvertBetweenEveryPairOfDTypes) {
  for (DType from :
       {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8, DType::Bool}) {
    check_to_vector_from<float>(from);
    check_to_vector_from<double>(from);
    check_to_vector_from<Half>(from);
    check_to_vector_from<BFloat16>(from);
    check_to_vector_from<int64_t>(from);
    check_to_vector_from<int32_t>(from);
    check_to_vector_from<uint8_t>(from);
    check_to_vector_from<bool>(from);
  }
  const Tensor t = tensor<double>({1.5, -2.0, 0.0, 3.25});
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1.5f, -2.0f, 0.0f, 3.25f}));
  EXPECT_EQ(t.to_vector<int64_t>(), (std::vector<int64_t>{1, -2, 0, 3}));
  EXPECT_EQ(t.to_vector<bool>(), (std::vector<bool>{true, true, false, true}));
  EXPECT_EQ(scalar_tensor(-2.5).item<double>(), -2.5);
  EXPECT_EQ(scalar_tensor(-2.5).item<int64_t>(), -2);
  EXPECT_EQ(scalar_tensor(-2.5).item<bool>(), true);
  EXPECT_EQ(float(scalar_tensor(0.1, DType::F64).item<Half>()), float(Half(0.1f)));
  EXPECT_EQ(tensor<int32_t>({7}, {1, 1, 1}).item<float>(), 7.0f);
}

TEST(TensorAccess, DataPointsAtTheFirstElementOfTheView) {
  const Tensor t = tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const float* p = t.data<float>();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(p[i], float(i + 1));
  EXPECT_EQ(t.narrow(0, 1, 1).data<float>(), p + 3);
  EXPECT_EQ(t.select(1, 2).data<float>(), p + 2);
  EXPECT_EQ(t.raw_data(), static_cast<const void*>(p));
  t.data<float>()[4] = -5.0f;
  EXPECT_EQ(t.to_vector<float>()[4], -5.0f);
}

// ---- bad inputs -------------------------------------------------------------------------------------------

TEST(TensorErrors, ViewAndReshape) {
  const Tensor x = random_tensor({2, 3});
  expect_exact_error<ShapeError>([&] { x.t().view({6}); }, {"view", "[3, 2]", "[1, 3]", "[6]", "reshape"});
  expect_exact_error<ShapeError>([&] { x.view({4, 2}); }, {"view", "[4, 2]", "[2, 3]", "6 elements"});
  expect_exact_error<ShapeError>([&] { x.view({4, -1}); }, {"view", "[4, -1]", "[2, 3]"});
  expect_exact_error<ShapeError>([&] { x.reshape({7}); }, {"reshape", "[7]", "[2, 3]"});
  expect_exact_error<ShapeError>(
      [&] {
        x.view({-1, -1});
      },
      {"view", "only one dimension can be -1", "[-1, -1]"});
  expect_exact_error<ShapeError>([&] { x.reshape({-1, 3, -1}); }, {"reshape", "[-1, 3, -1]"});
  expect_exact_error<ShapeError>([&] { x.view({-2, -3}); }, {"view", "-2", "[-2, -3]"});
}

TEST(TensorErrors, DimsOutOfRange) {
  const Tensor x = random_tensor({2, 3, 4});
  expect_exact_error<IndexError>([&] { x.transpose(0, 3); }, {"transpose", "dim 3", "[-3, 2]"});
  expect_exact_error<IndexError>([&] { x.transpose(-4, 0); }, {"transpose", "dim -4"});
  expect_exact_error<IndexError>([&] { x.narrow(5, 0, 1); }, {"narrow", "dim 5"});
  expect_exact_error<IndexError>([&] { x.select(-4, 0); }, {"select", "dim -4"});
  expect_exact_error<IndexError>([&] { x.slice(3, 0, 1); }, {"slice", "dim 3"});
  expect_exact_error<IndexError>([&] { x.unsqueeze(4); }, {"unsqueeze", "dim 4", "[-4, 3]"});
  expect_exact_error<IndexError>([&] { x.unsqueeze(-5); }, {"unsqueeze", "dim -5"});
  expect_exact_error<IndexError>([&] { x.squeeze(3); }, {"squeeze", "dim 3"});
  expect_exact_error<IndexError>([&] { x.flatten(0, 3); }, {"flatten", "dim 3"});
  expect_exact_error<IndexError>([&] { x.flatten(2, 1); },
                                 {"flatten", "start_dim 2", "end_dim 1", "[2, 3, 4]"});
  expect_exact_error<IndexError>([&] { x.size(3); }, {"size", "dim 3"});
  expect_exact_error<IndexError>([&] { x.stride(-4); }, {"stride", "dim -4"});
  expect_exact_error<IndexError>([&] { scalar_tensor(1.0).select(0, 0); }, {"select", "0-d"});
}

TEST(TensorErrors, NarrowSelectSliceOutOfRange) {
  const Tensor x = random_tensor({2, 3, 4});
  expect_exact_error<IndexError>([&] { x.narrow(1, 2, 2); },
                                 {"narrow", "start 2", "length 2", "size 3", "[2, 3, 4]"});
  expect_exact_error<IndexError>([&] { x.narrow(1, 0, -1); }, {"narrow", "length -1", "size 3"});
  expect_exact_error<IndexError>([&] { x.narrow(2, -5, 1); }, {"narrow", "size 4", "[2, 3, 4]"});
  expect_exact_error<IndexError>([&] { x.select(1, 3); }, {"select", "index 3", "size 3", "[2, 3, 4]"});
  expect_exact_error<IndexError>([&] { x.select(1, -4); }, {"select", "index -4", "size 3"});
  expect_exact_error<IndexError>([&] { x.slice(2, 0, 4, 0); }, {"slice", "step", "0"});
  expect_exact_error<IndexError>([&] { x.slice(2, 4, 0, -1); }, {"slice", "step", "-1"});
}

TEST(TensorErrors, ExpandPermuteAndT) {
  const Tensor x = random_tensor({2, 3});
  expect_exact_error<ShapeError>(
      [&] {
        x.expand({4, 3});
      },
      {"expand", "[2, 3]", "[4, 3]", "size 2", "size-1"});
  expect_exact_error<ShapeError>([&] { x.expand({3}); }, {"expand", "[3]", "fewer dims", "[2, 3]"});
  expect_exact_error<ShapeError>([&] { x.expand({-1, 2, 3}); }, {"expand", "-1", "[-1, 2, 3]"});
  expect_exact_error<ShapeError>([&] { x.expand_as(zeros({2, 6})); }, {"expand", "[2, 3]", "[2, 6]"});
  const Tensor y = random_tensor({2, 3, 4});
  expect_exact_error<IndexError>(
      [&] {
        y.permute({0, 0, 1});
      },
      {"permute", "dim 0 appears twice", "[0, 0, 1]"});
  expect_exact_error<IndexError>([&] { y.permute({2, 1, -1}); }, {"permute", "appears twice", "[2, 1, -1]"});
  expect_exact_error<ShapeError>(
      [&] {
        y.permute({1, 0});
      },
      {"permute", "expected 3 dims", "[2, 3, 4]", "[1, 0]"});
  expect_exact_error<IndexError>([&] { y.permute({0, 1, 3}); }, {"permute", "dim 3"});
  expect_exact_error<ShapeError>([&] { y.t(); }, {"t:", "[2, 3, 4]", "transpose"});
}

// Note [checked sizes]: a view's shape must fit its dtype and its elements must lie inside its storage.
TEST(TensorErrors, ViewsThatOverflowOrLeaveTheStorage) {
  const int64_t big = int64_t(1) << 62, max = std::numeric_limits<int64_t>::max();
  const Tensor one = ones({1});
  expect_exact_error<ShapeError>(
      [&] {
        one.expand({big, big});
      },
      {"expand", "[4611686018427387904, 4611686018427387904]"});
  expect_exact_error<ShapeError>([&] { one.expand({big}); }, {"expand", "[4611686018427387904]", "4-byte"});
  EXPECT_EQ(ones({1}, DType::U8).expand({big}).numel(), big);  // no copy: a valid view of one byte
  const Tensor base = random_tensor({10}).to(DType::F32);
  expect_exact_error<ShapeError>(
      [&] { base.as_strided({5}, {3}, 0); },
      {"as_strided", "[5]", "[3]", "outside its storage of 40 bytes", "bytes 0 to 52"});
  expect_exact_error<ShapeError>([&] { base.as_strided({2}, {1}, 9); }, {"as_strided", "offset 9"});
  expect_exact_error<ShapeError>([&] { base.as_strided({2}, {1}, -1); }, {"as_strided", "offset -1"});
  expect_exact_error<ShapeError>([&] { base.as_strided({2}, {big}, 0); }, {"as_strided", "int64 overflows"});
  expect_exact_error<ShapeError>([&] { base.as_strided({2}, {1}, max); }, {"as_strided", "int64 overflows"});
  expect_exact_error<ShapeError>([&] { base.as_strided({2, 2}, {1}, 0); }, {"as_strided", "differ in rank"});
  EXPECT_EQ(base.as_strided({5}, {2}, 1).to_vector<float>().back(), base.to_vector<float>()[9]);  // the last
  // start + length, end - start + step: sums that would overflow.
  expect_exact_error<IndexError>([&] { base.narrow(0, 1, max); }, {"narrow", "length 9223372036854775807"});
  const Tensor s = base.slice(0, 2, 10, max);
  EXPECT_EQ(s.shape(), (Shape{1}));
  EXPECT_EQ(s.item<float>(), base.select(0, 2).item<float>());
  expect_exact_error<ShapeError>(
      [&] {
        zeros({0}).reshape({big, big, 0});
      },
      {"reshape", "[4611686018427387904"});
  expect_exact_error<ShapeError>([&] { zeros({0}).view({-1, big, big}); }, {"view"});
}

TEST(TensorErrors, MoreThanEightDims) {
  const Tensor eight = zeros({1, 2, 1, 2, 1, 2, 1, 2});
  EXPECT_EQ(eight.dim(), kMaxDims);
  expect_exact_error<ShapeError>([&] { eight.unsqueeze(0); }, {"unsqueeze", "[1, 2, 1, 2, 1, 2, 1, 2]", "8"});
  expect_exact_error<ShapeError>([] { zeros(Shape(std::vector<int64_t>(9, 1))); }, {"at most 8", "9"});
}

TEST(TensorErrors, ElementAccess) {
  const Tensor x = random_tensor({2, 3}).to(DType::F32);
  expect_exact_error<Error>([&] { x.item<float>(); }, {"item", "one element", "[2, 3]"});
  expect_exact_error<Error>([&] { zeros({0}).item<float>(); }, {"item", "[0]"});
  expect_exact_error<DTypeError>([&] { x.data<double>(); }, {"data<f64>", "f32"});
  expect_exact_error<DTypeError>([&] { arange(3).data<int32_t>(); }, {"data<i32>", "i64"});
  expect_exact_error<ShapeError>([] { zeros({2, 3}).copy_(ones({4})); }, {"copy_", "[2, 3]", "[4]"});
  expect_exact_error<ShapeError>([] { zeros({3}).copy_(ones({2, 3})); }, {"copy_", "[2, 3]", "[3]"});
}

TEST(TensorErrors, UndefinedTensor) {
  const Tensor u;
  EXPECT_FALSE(u.defined());
  EXPECT_EQ(u.str(), "tensor(undefined)");
  expect_exact_error<Error>([&] { u.shape(); }, {"undefined", "zeros() or empty()"});
  expect_exact_error<Error>([&] { u.numel(); }, {"undefined"});
  expect_exact_error<Error>([&] { u.view({1}); }, {"undefined"});
  expect_exact_error<Error>([&] { u.to_vector<float>(); }, {"undefined"});
  expect_exact_error<Error>([&] { zeros({2}).copy_(u); }, {"copy_", "undefined"});
}

}  // namespace
}  // namespace frugal

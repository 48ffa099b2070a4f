// Row-wise sparse gradients (autograd/sparse.h) from nn::Embedding with sparse(true): densified, they equal
// the dense embedding gradient (duplicates summed); they accumulate over backward calls; zero_grad drops
// them; coalesce against a naive loop; memory tag; errors.
#include <map>

#include "autograd/sparse.h"
#include "core/memory.h"
#include "frugal.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_close;
using testing::expect_error;

// The dense gradient of sum(emb(idx) * w) for a weight like `weight` (a fresh leaf with the same values).
Tensor dense_embedding_grad(const Tensor& weight, const Tensor& idx, const Tensor& w) {
  Tensor dense_w = weight.detach().clone().requires_grad_();
  sum(mul(nn::functional::embedding(idx, dense_w), w)).backward();
  return dense_w.grad();
}

TEST(SparseGrad, EmbeddingMatchesDenseGradient) {
  Generator gen(7);
  nn::Embedding emb(nn::EmbeddingOptions(50, 6).sparse(true));
  const Tensor idx = randint(0, 50, {4, 9}, DType::I64, &gen);  // 36 draws from 50 rows: repeats
  const Tensor w = testing::uniform({4, 9, 6}, -1, 1, DType::F32, 3);
  sum(mul(emb(idx), w)).backward();

  EXPECT_FALSE(emb->weight.grad().defined());
  const SparseGrad g = autograd::sparse_grad(emb->weight);
  ASSERT_TRUE(g.defined());
  EXPECT_EQ(g.rows, 50);
  EXPECT_EQ(g.indices.dtype(), DType::I64);
  const auto rows = g.indices.to_vector<int64_t>();
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_LT(rows[i - 1], rows[i]) << "indices sorted and unique";
  std::map<int64_t, int> distinct;
  for (int64_t i : idx.to_vector<int64_t>()) ++distinct[i];
  EXPECT_EQ(int64_t(rows.size()), int64_t(distinct.size()));
  EXPECT_EQ(g.values.shape(), (Shape{int64_t(rows.size()), 6}));
  expect_close(autograd::to_dense(g), dense_embedding_grad(emb->weight, idx, w).to_vector<double>(),
               testing::tol_for(DType::F32), "sparse gradient densified");
}

TEST(SparseGrad, AccumulatesOverBackwardCalls) {
  nn::Embedding emb(nn::EmbeddingOptions(10, 3).sparse(true));
  const Tensor idx1 = tensor<int64_t>({1, 4, 4, 9}), idx2 = tensor<int32_t>({4, 0, 1, 1});
  const Tensor w1 = testing::uniform({4, 3}, -1, 1, DType::F32, 11),
               w2 = testing::uniform({4, 3}, -1, 1, DType::F32, 12);
  sum(mul(emb(idx1), w1)).backward();
  sum(mul(emb(idx2), w2)).backward();
  const SparseGrad g = autograd::sparse_grad(emb->weight);
  EXPECT_EQ(g.indices.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 4, 9}));
  const Tensor expected =
      add(dense_embedding_grad(emb->weight, idx1, w1), dense_embedding_grad(emb->weight, idx2, w2));
  expect_close(autograd::to_dense(g), expected.to_vector<double>(), testing::tol_for(DType::F32),
               "two backward calls");
}

TEST(SparseGrad, ZeroGradDropsIt) {
  nn::Embedding emb(nn::EmbeddingOptions(8, 2).sparse(true));
  sum(emb(tensor<int64_t>({1, 2}))).backward();
  ASSERT_TRUE(autograd::sparse_grad(emb->weight).defined());
  emb->weight.zero_grad(/*set_to_none=*/false);
  EXPECT_FALSE(autograd::sparse_grad(emb->weight).defined());
  sum(emb(tensor<int64_t>({3}))).backward();
  EXPECT_EQ(autograd::sparse_grad(emb->weight).indices.to_vector<int64_t>(), (std::vector<int64_t>{3}));
  emb->zero_grad();
  EXPECT_FALSE(autograd::sparse_grad(emb->weight).defined());
}

TEST(SparseGrad, PaddingRowGetsNoGradient) {
  nn::Embedding emb(nn::EmbeddingOptions(6, 2).padding_idx(2).sparse(true));
  sum(emb(tensor<int64_t>({2, 5, 2, 0}))).backward();
  const SparseGrad g = autograd::sparse_grad(emb->weight);
  EXPECT_EQ(g.indices.to_vector<int64_t>(), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(g.values.to_vector<double>(), (std::vector<double>{1, 1, 1, 1}));
}

TEST(SparseGrad, CoalesceMatchesNaiveSum) {
  for (DType t : {DType::F32, DType::F64, DType::BF16}) {
    Generator gen(5);
    const Tensor idx = randint(0, 20, {200}, DType::I64, &gen);
    const Tensor values = testing::uniform({200, 7}, -1, 1, t, 9);
    const SparseGrad g = autograd::coalesce(idx, values, 20);
    std::map<int64_t, std::vector<double>> naive;
    const auto iv = idx.to_vector<int64_t>();
    const auto vv = values.to_vector<double>();
    for (size_t k = 0; k < iv.size(); ++k) {
      auto& row = naive[iv[k]];
      row.resize(7);
      for (size_t j = 0; j < 7; ++j) row[j] += vv[k * 7 + j];
    }
    std::vector<int64_t> rows;
    std::vector<double> sums;
    for (const auto& [i, row] : naive) {
      rows.push_back(i);
      sums.insert(sums.end(), row.begin(), row.end());
    }
    EXPECT_EQ(g.indices.to_vector<int64_t>(), rows);
    EXPECT_EQ(g.values.dtype(), t);
    expect_close(g.values, sums, t == DType::BF16 ? testing::Tol{0.05, 0.02} : testing::tol_for(t),
                 std::string("coalesce ") + dtype_name(t));
  }
}

TEST(SparseGrad, CountedUnderGradients) {
  auto gradient_bytes = [] {
    for (const auto& t : memory::tag_stats())
      if (t.tag == "gradients") return t.allocated.current;
    return int64_t(0);
  };
  const int64_t before = gradient_bytes();
  nn::Embedding emb(nn::EmbeddingOptions(1000, 64).sparse(true));
  {
    memory::Tag tag("backward");
    sum(emb(tensor<int64_t>({1, 2, 3, 2}))).backward();
  }
  // Three rows of 64 f32 values and three i64 indices, each rounded up to the arena's 512-byte minimum.
  const int64_t held = gradient_bytes() - before;
  EXPECT_GE(held, 3 * 64 * 4 + 3 * 8);
  EXPECT_LT(held, 1000 * 64 * 4 / 10);
  emb->zero_grad();
  EXPECT_EQ(gradient_bytes(), before);
}

TEST(SparseGrad, Errors) {
  expect_error<IndexError>(
      [] {
        autograd::coalesce(tensor<int64_t>({0, 5}), ones({2, 3}), 5);
      },
      {"coalesce", "index 5", "5 rows"});
  expect_error<ShapeError>(
      [] {
        autograd::coalesce(tensor<int64_t>({0, 1}), ones({3, 3}), 5);
      },
      {"coalesce", "[n, dim]"});
  expect_error<Error>([] { autograd::to_dense(SparseGrad()); }, {"to_dense", "undefined"});
  // A weight that is not a leaf cannot take a sparse gradient.
  Tensor base = ones({4, 2}).requires_grad_();
  expect_error<Error>([&] { nn::functional::embedding(tensor<int64_t>({1}), mul(base, 2.0), {}, true); },
                      {"embedding", "leaf", "sparse(false)"});
  // Mixing a dense and a sparse gradient on one weight.
  nn::Embedding emb(nn::EmbeddingOptions(4, 2).sparse(true));
  sum(emb->weight).backward();
  expect_error<Error>([&] { sum(emb(tensor<int64_t>({1}))).backward(); },
                      {"dense gradient", "sparse(false)"});
}

}  // namespace
}  // namespace frugal

// dist's collectives against a naive reference on random data (every rank can draw every other rank's data
// from its seed), every dtype; bad inputs: a clear Error, and nothing stuck or corrupted after it.
#include <cmath>

#include "tests/dist/dist_test.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::uniform;

const DType kFloats[] = {DType::F32, DType::F64, DType::F16, DType::BF16};

// Rank r's data for a test: the same on every rank that asks.
Tensor data_of(int r, const Shape& shape, DType dtype, uint64_t salt) {
  return uniform(shape, -2, 2, dtype, 1000 * salt + uint64_t(r));
}

TEST(Collectives, WorldIsWhatTheLauncherSays) {
  EXPECT_TRUE(dist::is_initialized());
  EXPECT_GE(dist::world_size(), 1);
  EXPECT_GE(dist::rank(), 0);
  EXPECT_LT(dist::rank(), dist::world_size());
  if (dist::world_size() > 1) {
    EXPECT_TRUE(dist::built_with_mpi());
  }
}

TEST(Collectives, AllReduceMatchesANaiveReference) {
  const int w = dist::world_size();
  uint64_t salt = 1;
  for (DType dtype : kFloats)
    for (dist::ReduceOp op : {dist::ReduceOp::Sum, dist::ReduceOp::Average, dist::ReduceOp::Max}) {
      const Shape shape{37, 5};
      Tensor t = data_of(dist::rank(), shape, dtype, salt);
      dist::all_reduce(t, op);
      // The reference: each rank's values widened to f64, combined, rounded once to the dtype.
      std::vector<double> expected(size_t(shape.numel()), op == dist::ReduceOp::Max ? -INFINITY : 0.0);
      for (int r = 0; r < w; ++r) {
        const std::vector<double> v = data_of(r, shape, dtype, salt).to_vector<double>();
        for (size_t i = 0; i < v.size(); ++i)
          expected[i] = op == dist::ReduceOp::Max ? std::max(expected[i], v[i]) : expected[i] + v[i];
      }
      if (op == dist::ReduceOp::Average)
        for (double& e : expected) e /= w;
      const std::vector<double> rounded = tensor(expected, shape).to(dtype).to_vector<double>();
      EXPECT_EQ(t.dtype(), dtype);
      testing::expect_close(t.to_vector<double>(), rounded, testing::tol_for(dtype),
                            std::string("all_reduce ") + dtype_name(dtype));
      ++salt;
    }
}

TEST(Collectives, BroadcastGivesEveryRankTheRootsBytes) {
  const int root = dist::world_size() - 1;
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::I64, DType::U8, DType::Bool}) {
    Tensor t = dtype == DType::Bool ? gt(data_of(dist::rank(), {9, 4}, DType::F32, 7), 0.0)
                                    : data_of(dist::rank(), {9, 4}, DType::F32, 7).mul(10).to(dtype);
    const Tensor expected = dtype == DType::Bool ? gt(data_of(root, {9, 4}, DType::F32, 7), 0.0)
                                                 : data_of(root, {9, 4}, DType::F32, 7).mul(10).to(dtype);
    dist::broadcast(t, root);
    EXPECT_EQ(t.to_vector<double>(), expected.to_vector<double>()) << dtype_name(dtype);
  }
}

TEST(Collectives, AllGatherConcatenatesInRankOrder) {
  const int w = dist::world_size();
  for (DType dtype : {DType::F32, DType::BF16, DType::I64}) {
    const Tensor mine = data_of(dist::rank(), {3, 2}, DType::F32, 11).mul(10).to(dtype);
    const Tensor all = dist::all_gather(mine);
    ASSERT_EQ(all.shape(), Shape({3 * w, 2}));
    for (int r = 0; r < w; ++r)
      EXPECT_EQ(all.narrow(0, 3 * r, 3).to_vector<double>(),
                data_of(r, {3, 2}, DType::F32, 11).mul(10).to(dtype).to_vector<double>());
  }
  const Tensor scalars = dist::all_gather(tensor(std::vector<int64_t>{dist::rank()}, {}));
  EXPECT_EQ(scalars.shape(), Shape({w}));
  for (int r = 0; r < w; ++r) EXPECT_EQ(scalars.to_vector<int64_t>()[size_t(r)], r);
}

TEST(Collectives, ReduceScatterGivesEachRankItsRowsOfTheSum) {
  const int w = dist::world_size();
  for (DType dtype : kFloats) {
    const Shape shape{4 * w, 3};
    const Tensor mine = data_of(dist::rank(), shape, dtype, 13);
    const Tensor part = dist::reduce_scatter(mine, dist::ReduceOp::Sum);
    ASSERT_EQ(part.shape(), Shape({4, 3}));
    EXPECT_EQ(part.dtype(), dtype);
    std::vector<double> expected(12, 0.0);
    for (int r = 0; r < w; ++r) {
      const std::vector<double> v =
          data_of(r, shape, dtype, 13).narrow(0, 4 * dist::rank(), 4).to_vector<double>();
      for (size_t i = 0; i < v.size(); ++i) expected[i] += v[i];
    }
    testing::expect_close(part.to_vector<double>(), tensor(expected, {4, 3}).to(dtype).to_vector<double>(),
                          testing::tol_for(dtype), std::string("reduce_scatter ") + dtype_name(dtype));
  }
}

TEST(Collectives, UnevenPartsScatterAndGatherBack) {
  const int w = dist::world_size();
  std::vector<int64_t> counts;
  for (int r = 0; r < w; ++r) counts.push_back(5 + 2 * r);  // uneven
  int64_t total = 0, begin = 0;
  for (int r = 0; r < w; ++r) {
    if (r < dist::rank()) begin += counts[size_t(r)];
    total += counts[size_t(r)];
  }
  const Tensor flat = data_of(dist::rank(), {total}, DType::F64, 17);
  Tensor part = empty({counts[size_t(dist::rank())]}, DType::F64);
  dist::reduce_scatter_flat(flat, part, counts, dist::ReduceOp::Average);
  std::vector<double> expected(size_t(part.numel()), 0.0);
  for (int r = 0; r < w; ++r) {
    const std::vector<double> v =
        data_of(r, {total}, DType::F64, 17).narrow(0, begin, part.numel()).to_vector<double>();
    for (size_t i = 0; i < v.size(); ++i) expected[i] += v[i] / w;
  }
  testing::expect_close(part.to_vector<double>(), expected, testing::tol_for(DType::F64),
                        {"reduce_scatter_flat"});

  // Each rank fills its own part with its rank; after the gather every rank holds every part.
  Tensor whole = full({total}, -1.0, DType::F32);
  whole.narrow(0, begin, counts[size_t(dist::rank())]).fill_(dist::rank());
  dist::all_gather_flat(whole, counts);
  const std::vector<float> v = whole.to_vector<float>();
  size_t i = 0;
  for (int r = 0; r < w; ++r)
    for (int64_t k = 0; k < counts[size_t(r)]; ++k, ++i) ASSERT_EQ(v[i], float(r)) << "element " << i;
}

TEST(Collectives, AsyncAllReduceFinishesOnWait) {
  Tensor t = data_of(dist::rank(), {1000}, DType::F32, 19);
  dist::Work work = dist::all_reduce_async(t, dist::ReduceOp::Average);
  EXPECT_TRUE(work.defined());
  work.wait();
  std::vector<double> expected(1000, 0.0);
  for (int r = 0; r < dist::world_size(); ++r) {
    const std::vector<double> v = data_of(r, {1000}, DType::F32, 19).to_vector<double>();
    for (size_t i = 0; i < v.size(); ++i) expected[i] += v[i];
  }
  for (double& e : expected) e /= dist::world_size();
  testing::expect_close(t.to_vector<double>(), expected, testing::tol_for(DType::F32), {"all_reduce_async"});
}

TEST(Collectives, BadInputsAreClearErrorsAndLeaveTheWorldUsable) {
  Tensor strided = uniform({4, 6}, -1, 1).transpose(0, 1);
  expect_error<Error>([&] { dist::all_reduce(strided); }, {"not contiguous"});
  Tensor ints = zeros({3}, DType::I64);
  expect_error<Error>([&] { dist::all_reduce(ints); }, {"reduces f32, f64, f16 and bf16"});
  if (dist::world_size() > 1)
    expect_error<Error>([&] { (void)dist::reduce_scatter(zeros({dist::world_size() * 2 + 1})); },
                        {"must be a multiple of the world size"});
  Tensor on_meta = empty({3}, TensorOptions(DType::F32).device(kMeta));
  expect_error<Error>([&] { dist::all_reduce(on_meta); }, {"NCCL"});
  expect_error<Error>([&] { dist::broadcast(ints, dist::world_size()); }, {"is not a rank"});
  Tensor f = zeros({4});
  std::vector<int64_t> wrong(size_t(dist::world_size()), 1);
  expect_error<Error>([&] { dist::all_gather_flat(f, wrong); }, {"add up to"});

  // Shapes that differ between the ranks: an Error on every rank, before any data moves.
  if (dist::world_size() > 1) {
    Tensor t = ones({3 + dist::rank()});
    expect_error<Error>([&] { dist::all_reduce(t); }, {"different shapes or dtypes"});
    EXPECT_EQ(t.to_vector<float>(), std::vector<float>(size_t(3 + dist::rank()), 1.0f));
    Tensor d = ones({3}, dist::rank() == 0 ? DType::F32 : DType::F64);
    expect_error<Error>([&] { dist::broadcast(d, 0); }, {"different shapes or dtypes"});
  }
  // And the next collective works.
  Tensor ok = ones({5});
  dist::all_reduce(ok);
  EXPECT_EQ(ok.to_vector<float>(), std::vector<float>(5, float(dist::world_size())));
}

}  // namespace
}  // namespace frugal

// dist with CUDA tensors in a world of one (a GPU machine, or the stand-in GPU): every collective keeps the
// tensor on its device with the values a world of one gives, DistributedDataParallel keeps each bucket and
// each reduced gradient on the parameters' device (and equal to a plain backward's), and what cannot take
// CUDA tensors says so. A world of more than one reaches NCCL (kernels/cuda/nccl.cu), which needs a GPU per
// rank: not checked here.
#include "tests/cuda/gpu_test.h"
#include "tests/dist/dist_test.h"
#include "tests/test_util.h"

#include "dist/ddp.h"
#include "dist/zero.h"

namespace frugal {
namespace {

using testing::GpuTest;
using testing::kGpu;
using testing::uniform;
namespace F = nn::functional;

class GpuDist : public GpuTest {};

TEST_F(GpuDist, CollectivesKeepTheTensorOnItsDevice) {
  if (dist::world_size() != 1) GTEST_SKIP() << "a world of one only";
  const Tensor host = uniform({4, 3}, -1, 1);
  Tensor t = host.to(kGpu);
  dist::all_reduce(t, dist::ReduceOp::Average);
  EXPECT_EQ(t.device(), kGpu);
  EXPECT_EQ(t.to(kCPU).to_vector<float>(), host.to_vector<float>());
  dist::broadcast(t, 0);
  const Tensor gathered = dist::all_gather(t);
  EXPECT_EQ(gathered.device(), kGpu);
  EXPECT_EQ(gathered.to(kCPU).to_vector<float>(), host.to_vector<float>());
  const Tensor part = dist::reduce_scatter(t.to(DType::BF16));
  EXPECT_EQ(part.device(), kGpu);
  EXPECT_EQ(part.dtype(), DType::BF16);
  Tensor flat = zeros({6}, TensorOptions(DType::F32).device(kGpu));
  testing::expect_error<Error>([&] { dist::all_gather_flat(flat, {6}); }, {"CPU tensors only"});
}

TEST_F(GpuDist, DdpGradientsStayOnTheParametersDevice) {
  if (dist::world_size() != 1) GTEST_SKIP() << "a world of one only";
  const auto make = [] {
    manual_seed(5);
    nn::Sequential net;
    net->push_back(nn::Linear(6, 8));
    net->push_back(nn::ReLU());
    net->push_back(nn::Linear(8, 3));
    net->to(kGpu);
    return net;
  };
  const Tensor x = uniform({5, 6}, -1, 1).to(kGpu);
  const Tensor y = tensor(std::vector<int64_t>{0, 1, 2, 1, 0}).to(kGpu);
  nn::Sequential plain = make();
  F::cross_entropy(plain->forward(x), y).backward();
  nn::Sequential net = make();
  dist::DistributedDataParallel ddp(*net, dist::DistributedDataParallelOptions().bucket_cap_mb(0.0001));
  F::cross_entropy(net->forward(x), y).backward();
  const std::vector<Tensor> a = net->parameters(), b = plain->parameters();
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].grad().device(), kGpu);
    EXPECT_EQ(a[k].grad().to(kCPU).to_vector<float>(), b[k].grad().to(kCPU).to_vector<float>());
  }
  optim::SGD sgd(net->parameters(), optim::SGDOptions(0.1));
  testing::expect_error<Error>([&] { dist::ZeroOptimizer zero(sgd); }, {"CPU parameters only"});
}

}  // namespace
}  // namespace frugal

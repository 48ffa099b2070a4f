// serve::ModelPool on a GPU (and on the stand-in GPU, FRUGAL_FAKE_GPU=1): weights copied in from the mapped
// file and counted in the device's arena, inputs from the host copied in as part of the request, answers
// equal to the CPU's, eviction freeing the device's weight blocks, and the device's footprint within the
// budget.
#include <filesystem>

#include "serve/model_pool.h"
#include "tests/cuda/gpu_test.h"

namespace frugal {
namespace {

using testing::GpuTest;
using testing::kGpu;

nn::Sequential make_mlp(int64_t in, int64_t hidden, int64_t out) {
  nn::Sequential net;
  net->push_back(nn::Linear(in, hidden));
  net->push_back(nn::Tanh());
  net->push_back(nn::Linear(hidden, out));
  return net;
}

class GpuModelPool : public GpuTest {
 protected:
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) {
    std::filesystem::create_directories(dir_);
    return (dir_ / name).string();
  }
  std::filesystem::path dir_ =
      std::filesystem::temp_directory_path() / ("frugal_gpu_pool_" + std::to_string(::getpid()));
};

TEST_F(GpuModelPool, ServesOnTheDeviceWithinTheBudgetAndEvictsItsWeights) {
  std::vector<serve::Factory> factories;
  std::vector<Tensor> expected;
  const Tensor x = testing::uniform({16, 64}, -1, 1);
  for (int i = 0; i < 2; ++i) {
    manual_seed(uint64_t(i) + 1);
    nn::Sequential m = make_mlp(64, 256, 8);
    io::save_safetensors(path("m" + std::to_string(i) + ".safetensors"), m->state_dict());
    m->eval();
    InferenceMode im;
    expected.push_back(m->forward(x));
    factories.push_back([] { return make_mlp(64, 256, 8).ptr(); });
  }
  // Room for one model's weights and a request, not two models'.
  serve::ModelPool sizing(kGpu, int64_t(1) << 40);
  sizing.add("m0", factories[0], path("m0.safetensors"));
  const int64_t request = sizing.request_bytes("m0", x);
  ASSERT_GT(request, 0);
  const int64_t weights = 2 * (64 * 256 + 256 + 256 * 8 + 8) * 4;  // upper bound: rounding adds < 2 KiB
  serve::ModelPool pool(kGpu, weights / 2 + 4096 + request + (weights / 4));
  pool.add("m0", factories[0], path("m0.safetensors"));
  pool.add("m1", factories[1], path("m1.safetensors"));

  memory::reset_peak(kGpu);
  const int64_t baseline = memory::stats(kGpu).footprint.current;
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < 2; ++i) {
      const Tensor y = pool.run("m" + std::to_string(i), x);  // a host input, copied in by the request
      ASSERT_EQ(y.device(), kGpu);
      testing::expect_close(y.to(kCPU).to_vector<double>(), expected[size_t(i)].to_vector<double>(),
                            testing::tol_for(DType::F32), "model " + std::to_string(i));
    }
  EXPECT_EQ(pool.stats("m0").loads, 2);  // evicted by m1 each round
  EXPECT_EQ(pool.stats("m1").evictions, 1);
  EXPECT_LE(memory::stats(kGpu).footprint.peak - baseline, pool.budget());
  EXPECT_LE(pool.peak_committed(), pool.budget());
  EXPECT_EQ(memory::stats(kGpu).mapped.current, 0);  // the file is mapped on the host, and only to load
  pool.evict_idle();
  EXPECT_EQ(memory::stats(kGpu).allocated.current, baseline);
  EXPECT_EQ(pool.committed(), 0);
}

}  // namespace
}  // namespace frugal

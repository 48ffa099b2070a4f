// The parts of examples/multi_model (examples/multi_model.h): the int8 structure matches what
// quant::quantize_dynamic makes, the Zipf mix is skewed and repeatable, and a mix served from several threads
// under less than its models need together answers every request as the variant loaded alone, within the
// budget.
#include <gtest/gtest.h>

#include <filesystem>

#include "examples/fmnist.h"
#include "examples/multi_model.h"
#include "tests/test_util.h"

namespace frugal::testing {
namespace {

using MultiModelTest = ScratchDirTest;

TEST_F(MultiModelTest, TheInt8StructureHasTheTensorsQuantizeDynamicMakes) {
  nn::Sequential q = fmnist::make_mlp();
  nn::quant::quantize_dynamic(*q);
  const StateDict expected = q->state_dict();
  const StateDict actual = multi_model::int8_structure(fmnist::make_mlp())->state_dict();
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, t] : expected) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(actual.count(name));
    EXPECT_EQ(actual.at(name).shape(), t.shape());
    EXPECT_EQ(actual.at(name).dtype(), t.dtype());
  }
}

TEST_F(MultiModelTest, TheZipfMixIsSkewedAndRepeatable) {
  const std::vector<int> a = multi_model::zipf_requests(3, 3000, 1.1, 4);
  EXPECT_EQ(a, multi_model::zipf_requests(3, 3000, 1.1, 4));
  EXPECT_NE(a, multi_model::zipf_requests(3, 3000, 1.1, 5));
  int count[3] = {0, 0, 0};
  for (int m : a) ++count[m];
  EXPECT_GT(count[0], count[1]);
  EXPECT_GT(count[1], count[2]);
  EXPECT_GT(count[2], 0);
}

TEST_F(MultiModelTest, AMixUnderLessThanItsNeedAnswersAsEachVariantAloneWithinTheBudget) {
  std::vector<multi_model::Served> models(2);
  int64_t need = 0, largest = 0;
  for (int i = 0; i < 2; ++i) {
    multi_model::Served& s = models[size_t(i)];
    s.name = i == 0 ? "mlp" : "wide";
    const int64_t hidden = i == 0 ? 256 : 512;
    auto f32 = [hidden] {
      nn::Sequential m;
      m->push_back(nn::Flatten());
      m->push_back(nn::Linear(784, hidden));
      m->push_back(nn::ReLU());
      m->push_back(nn::Linear(hidden, 10));
      return m;
    };
    manual_seed(uint64_t(i) + 1);
    nn::Sequential m = f32();
    io::save_safetensors(path(s.name + ".safetensors"), m->state_dict());
    nn::quant::quantize_dynamic(*m);
    io::save_safetensors(path(s.name + "-int8.safetensors"), m->state_dict(), {}, nn::quant::int8_names(*m));
    s.variants = {{serve::Precision::F32, [f32] { return f32().ptr(); }, path(s.name + ".safetensors")},
                  {serve::Precision::Int8, [f32] { return multi_model::int8_structure(f32()); },
                   path(s.name + "-int8.safetensors")}};
    for (int k = 0; k < 3; ++k)
      s.inputs.push_back(uniform({8, 1, 28, 28}, -1, 1, DType::F32, uint64_t(10 * i + k)));
    multi_model::compute_expected(s);
    serve::ModelPool sizing(kCPU, int64_t(1) << 40);
    sizing.add(s.name, s.variants);
    const int64_t alone = int64_t(std::filesystem::file_size(path(s.name + ".safetensors"))) +
                          sizing.request_bytes(s.name, s.inputs[0]);
    need += alone;
    largest = std::max(largest, alone);
  }
  // Room for the larger model alone: less than both need together.
  const int64_t budget = largest + (64 << 10);
  ASSERT_LT(budget, need);
  const std::vector<int> mix = multi_model::zipf_requests(2, 80, 1.0, 3);
  for (bool smaller : {false, true}) {
    SCOPED_TRACE(smaller);
    const multi_model::MixResult r = multi_model::serve_mix(models, budget, mix, 3, smaller, 1);
    EXPECT_EQ(r.errors, 0) << r.first_error;
    EXPECT_EQ(r.mismatches, 0);
    EXPECT_EQ(r.requests, 80);
    EXPECT_LE(r.peak_bytes, budget);
    EXPECT_LE(r.peak_committed, budget);
    // The budget made something give way: an eviction, or (allowed) a smaller variant's answer. Which one
    // depends on how the three threads interleave: a request that finds the other model running may take
    // the smaller variant where a lone thread would have evicted.
    if (smaller)
      EXPECT_GT(r.evictions + r.smaller, 0);
    else
      EXPECT_GT(r.evictions, 0);
  }
}

}  // namespace
}  // namespace frugal::testing

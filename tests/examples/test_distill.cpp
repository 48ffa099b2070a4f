// Distillation's plumbing in the examples (examples/distill.h): the teacher's logits line up with the
// training images they belong to, and a student distilled with alpha 0 (the labels only) is the student
// trained alone, bit for bit, so the distilled run differs from it by the soft term alone.
#include <gtest/gtest.h>

#include <filesystem>

#include "examples/distill.h"
#include "tests/test_util.h"

namespace frugal::testing {
namespace {

bool have_data() {
  return std::filesystem::exists(std::filesystem::path(data::kFashionMNISTRoot) /
                                 "train-images-idx3-ubyte.gz");
}

TEST(Distill, TeacherLogitsAreTheTeachersOutputsForEachImage) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  const data::FashionMNIST train(data::kFashionMNISTRoot, data::Split::Train);
  manual_seed(3);
  nn::Sequential teacher = distill::make_student();  // any model of 10 outputs will do
  const Tensor logits = distill::label_with(*teacher, train);
  ASSERT_EQ(logits.shape(), (Shape{train.size(), 10}));
  InferenceMode no_record;
  for (int64_t i : {int64_t(0), int64_t(499), int64_t(500), train.size() - 1}) {
    const std::vector<int64_t> one{i};
    expect_close(logits.narrow(0, i, 1),
                 teacher->forward(train.get_batch(one, DType::F32).input).to_vector<double>(),
                 Tol{1e-6, 1e-5}, "row " + std::to_string(i));
  }
}

TEST(Distill, AlphaZeroIsTheStudentAlone) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  auto train = std::make_shared<data::FashionMNIST>(data::kFashionMNISTRoot, data::Split::Train);
  const Tensor teacher_logits = uniform({train->size(), 10}, -3, 3);
  const nn::Sequential alone = distill::train_student(5, 1, 4, {}, 4.0, 0.0, train);
  const nn::Sequential hard = distill::train_student(5, 1, 4, teacher_logits, 4.0, 0.0, train);
  const nn::Sequential soft = distill::train_student(5, 1, 4, teacher_logits, 4.0, 0.5, train);
  const auto a = alone->parameters(), h = hard->parameters(), s = soft->parameters();
  ASSERT_EQ(a.size(), h.size());
  bool soft_differs = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].to_vector<float>(), h[i].to_vector<float>()) << "parameter " << i;
    soft_differs = soft_differs || a[i].to_vector<float>() != s[i].to_vector<float>();
  }
  EXPECT_TRUE(soft_differs) << "alpha 0.5 trained the same weights as the labels alone";
}

}  // namespace
}  // namespace frugal::testing

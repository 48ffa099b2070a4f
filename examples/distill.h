// Knowledge distillation's parts, shared by examples/distill.cpp and examples/compress.cpp: the small student
// MLP, a teacher's logits for the training set, and a student's training on the labels or against those
// logits. Uses the public header only.
#pragma once

#include <numeric>
#include <span>
#include <vector>

#include "fmnist.h"

namespace distill {

using namespace frugal;

// Student: Flatten, Linear 784 -> 64, ReLU, Linear 64 -> 10.
inline nn::Sequential make_student() {
  return nn::Sequential{nn::Flatten(), nn::Linear(784, 64), nn::ReLU(), nn::Linear(64, 10)};
}

// The teacher's logits for every training image, in the dataset's order: [N, 10] f32.
inline Tensor label_with(nn::Module& teacher, const data::FashionMNIST& train_set) {
  InferenceMode no_record;
  teacher.eval();
  Tensor logits = empty({train_set.size(), 10});
  const int64_t b = 500;
  std::vector<int64_t> idx(static_cast<size_t>(b));
  for (int64_t start = 0; start < train_set.size(); start += b) {
    const int64_t n = std::min(b, train_set.size() - start);
    idx.resize(size_t(n));
    std::iota(idx.begin(), idx.end(), start);
    logits.narrow(0, start, n).copy_(teacher.forward(train_set.get_batch(idx, DType::F32).input));
  }
  return logits;
}

// Trains a student (seeded) for `epochs` epochs of batch 128 with Adam (lr 1e-3), on the labels alone
// (teacher_logits undefined) or distilled against them, and returns it.
inline nn::Sequential train_student(uint64_t seed, int epochs, int64_t max_steps,
                                    const Tensor& teacher_logits, double temperature, double alpha,
                                    const std::shared_ptr<data::FashionMNIST>& train_set) {
  manual_seed(seed);
  nn::Sequential student = make_student();
  optim::Adam opt(student->parameters(), optim::AdamOptions(1e-3));
  const data::DataLoader order(train_set, data::DataLoaderOptions().batch_size(128).shuffle(true).seed(seed));
  const int64_t b = 128;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const std::vector<int64_t> perm = order.epoch_order(epoch);
    int64_t steps = 0;
    for (size_t start = 0; start + size_t(b) <= perm.size(); start += size_t(b)) {
      if (max_steps > 0 && steps++ >= max_steps) break;
      const std::span<const int64_t> idx(perm.data() + start, size_t(b));
      const data::Batch batch = train_set->get_batch(idx, DType::F32);
      opt.zero_grad();
      const Tensor logits = student->forward(batch.input);
      Tensor loss;
      if (teacher_logits.defined()) {
        const Tensor t = index_select(teacher_logits, 0,
                                      tensor<int64_t>(std::vector<int64_t>(idx.begin(), idx.end()), {b}));
        loss = nn::functional::distillation_loss(logits, t, batch.target, temperature, alpha);
      } else {
        loss = nn::functional::cross_entropy(logits, batch.target);
      }
      loss.backward();
      opt.step();
    }
  }
  return student;
}

}  // namespace distill

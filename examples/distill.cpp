// distill: knowledge distillation on Fashion-MNIST. A teacher (workload W2's CNN, trained here or loaded with
// --teacher from a file train_fmnist --model cnn --save wrote) labels the training set once with its logits;
// then a small student MLP (784 -> 64 -> 10, 51 K parameters against the teacher's 421 K) trains twice for
// the same steps from the same initial weights: alone, on the labels (cross-entropy), and distilled, on
// nn::functional::distillation_loss against the teacher's logits. Over --seeds seeds it prints each run's
// test accuracy and the means, ending with the lines
//   teacher_accuracy=0.XXXX  student_alone_accuracy=0.XXXX  student_distilled_accuracy=0.XXXX
//
//   build/examples/distill                              # teacher trained here for --teacher-epochs
//   build/examples/distill --teacher cnn.safetensors --seeds 3 --epochs 10 --temperature 2 --alpha 0.5
//
// The teacher's logits for all 60,000 images take 2.4 MB; the teacher itself (its weights and activations)
// is freed before a student trains, so the students train in their own memory only.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <numeric>

#include "distill.h"

using namespace frugal;

namespace {

double mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Distil workload W2's CNN into a small MLP on Fashion-MNIST, against the MLP trained alone"};
  std::string teacher_path, save_teacher, data_dir = data::kFashionMNISTRoot;
  int epochs = 10, teacher_epochs = 2, seeds = 3, threads = 0;
  int64_t max_steps = 0;
  double temperature = 2.0, alpha = 0.5;
  app.add_option("--teacher", teacher_path,
                 "the teacher's weights (a W2 cnn file from train_fmnist --save); default: train one here");
  app.add_option("--save-teacher", save_teacher, "write the teacher trained here to this file");
  app.add_option("--teacher-epochs", teacher_epochs, "epochs to train the teacher (without --teacher)")
      ->check(CLI::Validator(examples::integer_in(1, 1000), "[1, 1000]"));
  app.add_option("--epochs", epochs, "epochs to train each student")
      ->check(CLI::Validator(examples::integer_in(1, 1000), "[1, 1000]"));
  app.add_option("--seeds", seeds, "students of each kind, seeds 1..N")
      ->check(CLI::Validator(examples::integer_in(1, 100), "[1, 100]"));
  app.add_option("--temperature", temperature, "softening temperature T (finite, > 0)")
      ->check(CLI::Validator(examples::check_finite_positive, "POSITIVE"));
  app.add_option("--alpha", alpha, "weight of the soft (teacher) term; 1 - alpha weighs the labels")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--max-steps", max_steps, "stop each epoch after this many steps (0: no limit)")
      ->check(CLI::Validator(examples::integer_in(0, INT64_MAX), "INT >= 0"));
  app.add_option("--threads", threads, "CPU threads (default, or 0: all cores)")
      ->check(CLI::Validator(examples::integer_in(0, INT32_MAX), "INT >= 0"));
  app.add_option("--data", data_dir, "folder with the Fashion-MNIST files");
  CLI11_PARSE(app, argc, argv);
  examples::line_buffered_stdout();
  try {
    if (threads > 0) set_num_threads(threads);
    if (!save_teacher.empty()) examples::check_can_write("--save-teacher", save_teacher);
    auto train_set = std::make_shared<data::FashionMNIST>(data_dir, data::Split::Train);
    auto test_set = std::make_shared<data::FashionMNIST>(data_dir, data::Split::Test);
    fmnist::ModelInfo info{"cnn"};
    if (!teacher_path.empty()) {
      // The teacher's own normalisation, from its file's metadata (Note [the model file is the whole model]).
      const auto meta = io::load_safetensors_metadata(teacher_path);
      FRUGAL_CHECK(meta.count("model") && meta.at("model") == "cnn", "--teacher: '", teacher_path,
                   "' is not a W2 cnn file (its metadata says model=",
                   meta.count("model") ? meta.at("model") : std::string("(none)"), ")");
      info.input_mean = std::stod(meta.at("input_mean"));
      info.input_std = std::stod(meta.at("input_std"));
    } else {
      std::tie(info.input_mean, info.input_std) = train_set->pixel_stats();
    }
    train_set->normalize(info.input_mean, info.input_std);
    test_set->normalize(info.input_mean, info.input_std);
    data::DataLoader test(test_set, data::DataLoaderOptions().batch_size(250));

    Tensor teacher_logits;
    double teacher_accuracy = 0;
    {
      manual_seed(0);
      nn::Sequential teacher = fmnist::make_cnn();
      if (!teacher_path.empty()) {
        teacher->load_state_dict(io::load_safetensors(teacher_path).tensors);
      } else {
        optim::Adam opt(teacher->parameters(), optim::AdamOptions(1e-3));
        data::DataLoader train(
            train_set, data::DataLoaderOptions().batch_size(64).shuffle(true).seed(0).drop_last(true));
        for (int e = 0; e < teacher_epochs; ++e) fmnist::train_epoch(*teacher, opt, train, e, max_steps, 1);
        if (!save_teacher.empty())
          io::save_safetensors(save_teacher, teacher->state_dict(), fmnist::model_metadata(info));
      }
      teacher_accuracy = fmnist::evaluate(*teacher, test);
      std::printf("teacher (W2 cnn, %lld parameters): test accuracy %.4f\n",
                  static_cast<long long>(teacher->num_parameters()), teacher_accuracy);
      teacher_logits = distill::label_with(*teacher, *train_set);
    }  // the teacher is freed here: the students train without it

    std::vector<double> alone, distilled;
    for (int s = 1; s <= seeds; ++s) {
      alone.push_back(fmnist::evaluate(
          *distill::train_student(uint64_t(s), epochs, max_steps, {}, temperature, alpha, train_set), test));
      distilled.push_back(
          fmnist::evaluate(*distill::train_student(uint64_t(s), epochs, max_steps, teacher_logits,
                                                   temperature, alpha, train_set),
                           test));
      std::printf("seed %d: student alone %.4f, distilled (T %g, alpha %g) %.4f\n", s, alone.back(),
                  temperature, alpha, distilled.back());
    }
    std::printf("mean of %d seeds: alone %.4f, distilled %.4f (%+.2f points)\n", seeds, mean(alone),
                mean(distilled), 100 * (mean(distilled) - mean(alone)));
    std::printf("teacher_accuracy=%.4f\n", teacher_accuracy);
    std::printf("student_alone_accuracy=%.4f\n", mean(alone));
    std::printf("student_distilled_accuracy=%.4f\n", mean(distilled));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

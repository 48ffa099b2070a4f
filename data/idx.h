// IDX files (the MNIST family's format), raw or gzip'd, and the Fashion-MNIST dataset built on them. Only the
// unsigned-byte element type is read; that is what every MNIST-style file holds.
//
//   Tensor images = data::read_idx(root + "/t10k-images-idx3-ubyte.gz");  // u8 [10000, 28, 28]
//   data::FashionMNIST train;  // the Debian package's folder, training split
//   std::vector<int64_t> idx{0, 1, 2};
//   data::Batch b = train.get_batch(idx, DType::F32);  // input f32 [3, 1, 28, 28] in [0, 1], target i64 [3]
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "../core/tensor.h"
#include "dataset.h"

namespace frugal::data {

// The file at `path` (gzip'd or not: zlib reads both) as a u8 tensor of the dims in its header. Throws Error
// naming the path for a missing file, a bad magic number, an element type other than u8 (0x08), or a length
// that does not match the dims (a truncated file).
Tensor read_idx(const std::string& path);

inline constexpr const char* kFashionMNISTRoot = "/usr/share/datasets/fashion-mnist";

enum class Split { Train, Test };

// Fashion-MNIST (Xiao et al., 2017): 60000 training and 10000 test images of 28x28 grey pixels in 10 classes.
// The images stay u8 in memory (47 MB for the training split) and are converted per batch.
class FashionMNIST : public Dataset {
 public:
  // Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from root. flatten: inputs [B, 784] instead of
  // [B, 1, 28, 28].
  explicit FashionMNIST(const std::string& root = kFashionMNISTRoot, Split split = Split::Train,
                        bool flatten = false);

  int64_t size() const override { return images_.size(0); }
  // input: the images at `indices` in dtype (f32, f64, f16 or bf16), pixel / 255, then (x - mean) / std when
  // normalize() was called; target: the labels, i64 [B].
  Batch get_batch(std::span<const int64_t> indices, DType dtype) const override;

  // Inputs become (pixel / 255 - mean) / std (torchvision's Normalize after ToTensor). Centred, unit-variance
  // inputs speed up early training; use the training split's statistics for every split.
  void normalize(double mean, double std);
  // Mean and standard deviation of pixel / 255 over every image held (computed in f64).
  std::pair<double, double> pixel_stats() const;

  const Tensor& images() const { return images_; }  // u8 [N, 28, 28]
  const Tensor& labels() const { return labels_; }  // u8 [N], values 0..9
  static constexpr int64_t kNumClasses = 10;
  // The classes by label, as the dataset's authors name them.
  static constexpr std::array<const char*, kNumClasses> kClassNames = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

 private:
  Tensor images_, labels_;
  bool flatten_;
  double mean_ = 0, std_ = 1;
};

}  // namespace frugal::data

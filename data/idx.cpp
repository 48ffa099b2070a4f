// IDX reading through zlib (which reads gzip'd and plain files alike), and Fashion-MNIST on top of it.
#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <vector>

#include "core/half.h"
#include "core/memory_history.h"

namespace frugal::data {

namespace {

// Closes the gzFile on every path out, exceptions included.
struct GzFile {
  gzFile f;
  explicit GzFile(const std::string& path) : f(gzopen(path.c_str(), "rb")) {}
  ~GzFile() {
    if (f) gzclose(f);
  }
};

// Reads up to n bytes; returns how many it got (fewer at the end of the data). Throws on a zlib error
// (a corrupt gzip stream).
int64_t gz_read(const GzFile& gz, void* dst, int64_t n, const std::string& path) {
  int64_t got = 0;
  while (got < n) {
    const unsigned chunk = unsigned(std::min<int64_t>(n - got, int64_t(1) << 30));
    const int r = gzread(gz.f, static_cast<char*>(dst) + got, chunk);
    if (r < 0) {
      int errnum = 0;
      const char* msg = gzerror(gz.f, &errnum);
      FRUGAL_CHECK(false, "read_idx('", path, "'): the gzip data is corrupt (", msg, ")");
    }
    if (r == 0) break;
    got += r;
  }
  return got;
}

const char* idx_type_name(uint8_t t) {
  switch (t) {
    case 0x08:
      return "u8";
    case 0x09:
      return "i8";
    case 0x0B:
      return "i16";
    case 0x0C:
      return "i32";
    case 0x0D:
      return "f32";
    case 0x0E:
      return "f64";
    default:
      return "unknown";
  }
}

}  // namespace

Tensor read_idx(const std::string& path) {
  memory::PhaseScope phase(memory::Phase::Data);  // Note [memory phases]
  std::error_code ec;
  const auto file_size = std::filesystem::file_size(path, ec);
  FRUGAL_CHECK(!ec, "read_idx: cannot open '", path, "': ", ec.message());
  GzFile gz(path);
  FRUGAL_CHECK(gz.f != nullptr, "read_idx: cannot open '", path, "'");

  // Header: two zero bytes, the element type, the number of dims, then each dim as a big-endian u32.
  std::array<uint8_t, 4> magic{};
  FRUGAL_CHECK(gz_read(gz, magic.data(), 4, path) == 4, "read_idx('", path,
               "'): the file is shorter than the 4-byte magic number");
  FRUGAL_CHECK(magic[0] == 0 && magic[1] == 0, "read_idx('", path, "'): bad magic number (first bytes ",
               int(magic[0]), ", ", int(magic[1]), ", expected 0, 0); this is not an IDX file");
  FRUGAL_CHECK(magic[2] == 0x08, "read_idx('", path, "'): element type 0x", std::hex, int(magic[2]), std::dec,
               " (", idx_type_name(magic[2]), ") is not supported; frugal reads only u8 (0x08) IDX files");
  const int ndim = magic[3];
  FRUGAL_CHECK(ndim >= 1 && ndim <= kMaxDims, "read_idx('", path, "'): ", ndim,
               " dimensions; frugal reads IDX files of 1 to ", kMaxDims, " dimensions");
  std::array<uint8_t, 4 * kMaxDims> raw_dims{};
  FRUGAL_CHECK(gz_read(gz, raw_dims.data(), 4 * ndim, path) == 4 * ndim, "read_idx('", path,
               "'): the file ends inside its header (", ndim, " dims announced)");
  Shape shape;
  for (int d = 0; d < ndim; ++d) {
    const uint8_t* b = raw_dims.data() + 4 * d;
    shape.push_back(int64_t(b[0]) << 24 | int64_t(b[1]) << 16 | int64_t(b[2]) << 8 | int64_t(b[3]));
  }
  // Deflate cannot shrink data by more than about 1032:1, so a header promising more than that is corrupt;
  // checking first keeps a damaged header from causing a huge allocation. The product of up to 8 dims below
  // 2^32 can overflow, hence the stepwise check; it covers the nonzero dims even when a 0 makes the tensor
  // empty, as a tensor's shape must (Note [checked sizes] in core/shape.h).
  const uint64_t limit = uint64_t(file_size) * (gzdirect(gz.f) ? 1 : 1032);
  bool empty_data = false;
  for (int64_t d : shape) empty_data = empty_data || d == 0;
  int64_t nonzero = 1;
  for (int64_t d : shape) {
    if (d == 0) continue;
    FRUGAL_CHECK(!__builtin_mul_overflow(nonzero, d, &nonzero), "read_idx('", path, "'): dims ", shape,
                 " describe more than 2^63 - 1 elements", empty_data ? " (in their nonzero dims)" : "",
                 "; the header is corrupt");
    FRUGAL_CHECK(empty_data || uint64_t(nonzero) <= limit, "read_idx('", path, "'): dims ", shape,
                 " need more bytes than a file of ", file_size,
                 " bytes can hold; it is truncated or corrupt");
  }

  Tensor t = empty(shape, DType::U8);
  const int64_t got = gz_read(gz, t.raw_data(), t.nbytes(), path);
  FRUGAL_CHECK(got == t.nbytes(), "read_idx('", path, "'): dims ", shape, " need ", t.nbytes(),
               " bytes of data but the file holds ", got, "; it is truncated");
  uint8_t extra;
  FRUGAL_CHECK(gz_read(gz, &extra, 1, path) == 0, "read_idx('", path, "'): data continues after the ",
               t.nbytes(), " bytes that dims ", shape, " need; the header is wrong or the file is not IDX");
  return t;
}

namespace {

// "<root>/<stem>.gz", or "<root>/<stem>" when only the unpacked file is there.
std::string find_file(const std::string& root, const std::string& stem) {
  const std::string gz = root + "/" + stem + ".gz", plain = root + "/" + stem;
  if (std::filesystem::exists(gz)) return gz;
  if (std::filesystem::exists(plain)) return plain;
  FRUGAL_CHECK(false, "FashionMNIST: '", gz, "' not found. Install the data with `apt-get install ",
               "dataset-fashion-mnist`, or pass the folder that holds it as root");
  return {};
}

// (pixel value / 255 - mean) / std as T, for every u8 value: a batch is then one table look-up per pixel.
template <typename T>
std::array<T, 256> scale_table(double mean, double std) {
  std::array<T, 256> table;
  // Divided (not multiplied by 1/255) in f32, or in f64 for f64, to give PyTorch's ToTensor (and Normalize)
  // values exactly.
  using Compute = std::conditional_t<std::is_same_v<T, double>, double, float>;
  for (int v = 0; v < 256; ++v)
    table[size_t(v)] = T((Compute(v) / Compute(255) - Compute(mean)) / Compute(std));
  return table;
}

}  // namespace

FashionMNIST::FashionMNIST(const std::string& root, Split split, bool flatten) : flatten_(flatten) {
  memory::PhaseScope phase(memory::Phase::Data);  // Note [memory phases]
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  const std::string images_path = find_file(root, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(root, prefix + "-labels-idx1-ubyte");
  images_ = read_idx(images_path);
  labels_ = read_idx(labels_path);
  FRUGAL_CHECK(images_.dim() == 3 && images_.size(1) == 28 && images_.size(2) == 28, "FashionMNIST: '",
               images_path, "' holds shape ", images_.shape(), ", expected [N, 28, 28]");
  FRUGAL_CHECK(labels_.dim() == 1, "FashionMNIST: '", labels_path, "' holds shape ", labels_.shape(),
               ", expected [N]");
  FRUGAL_CHECK(labels_.size(0) == images_.size(0), "FashionMNIST: '", images_path, "' holds ",
               images_.size(0), " images but '", labels_path, "' holds ", labels_.size(0), " labels");
  const uint8_t* l = labels_.data<uint8_t>();
  for (int64_t i = 0; i < labels_.numel(); ++i)
    FRUGAL_CHECK(l[i] < kNumClasses, "FashionMNIST: '", labels_path, "' holds label ", int(l[i]),
                 " at index ", i, "; the classes are 0..9");
}

Batch FashionMNIST::get_batch(std::span<const int64_t> indices, DType dtype) const {
  memory::PhaseScope phase(memory::Phase::Data);  // Note [memory phases]
  FRUGAL_CHECK_DTYPE(is_floating(dtype),
                     "FashionMNIST::get_batch: inputs are scaled to [0, 1], so dtype must be ",
                     "floating (f32, f64, f16, bf16), got ", dtype_name(dtype));
  const int64_t n = size(), b = int64_t(indices.size()), pixels = 28 * 28;
  for (int64_t i : indices)
    FRUGAL_CHECK_INDEX(i >= 0 && i < n, "FashionMNIST::get_batch: index ", i, " is out of range for ", n,
                       " examples");
  Batch batch;
  batch.input = empty(flatten_ ? Shape{b, pixels} : Shape{b, 1, 28, 28}, dtype);
  batch.target = empty({b}, DType::I64);
  const uint8_t* img = images_.data<uint8_t>();
  const uint8_t* lab = labels_.data<uint8_t>();
  int64_t* target = batch.target.data<int64_t>();
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, Half> ||
                  std::is_same_v<T, BFloat16>) {
      std::array<T, 256> table{};
      if constexpr (!std::is_same_v<T, float>) table = scale_table<T>(mean_, std_);
      T* out = batch.input.data<T>();
      for (int64_t k = 0; k < b; ++k) {
        const uint8_t* src = img + indices[size_t(k)] * pixels;
        // The images are read in a shuffled order, 47 MB of them: nearly every row comes from memory, and
        // the hardware prefetcher follows a row only after its first misses. The next row's 13 cache lines
        // are asked for while this one converts (a row takes longer than a miss): W1's batch of 128 took
        // 42-49 us without, 28 with (1, 2 or 4 rows ahead were alike; a 2-core Zen 4).
        if (k + 1 < b) {
          const uint8_t* next = img + indices[size_t(k + 1)] * pixels;
          for (int64_t p = 0; p < pixels; p += 64) __builtin_prefetch(next + p);
          __builtin_prefetch(next + pixels - 1);
        }
        T* dst = out + k * pixels;
        if constexpr (std::is_same_v<T, float>) {
          // scale_table's arithmetic itself, which vectorises (the same IEEE divisions and subtraction, so
          // the same bits); a lookup a pixel does not, and it ran beside every training step on the second
          // core (W1: about 100 us a batch).
          const float m = float(mean_), sd = float(std_);
#pragma omp simd
          for (int64_t p = 0; p < pixels; ++p) dst[p] = (float(src[p]) / 255.0f - m) / sd;
        } else {
          for (int64_t p = 0; p < pixels; ++p) dst[p] = table[src[p]];
        }
        target[k] = lab[indices[size_t(k)]];
      }
    }
  });
  return batch;
}

void FashionMNIST::normalize(double mean, double std) {
  memory::PhaseScope phase(memory::Phase::Data);  // Note [memory phases]
  FRUGAL_CHECK(std::isfinite(mean) && std::isfinite(std) && std > 0,
               "FashionMNIST::normalize: std must be positive and both finite, got mean ", mean, ", std ",
               std);
  mean_ = mean;
  std_ = std;
}

std::pair<double, double> FashionMNIST::pixel_stats() const {
  int64_t count[256] = {};
  const uint8_t* p = images_.data<uint8_t>();
  for (int64_t i = 0, n = images_.numel(); i < n; ++i) ++count[p[i]];
  double n = 0, sum = 0;
  for (int v = 0; v < 256; ++v) n += double(count[v]), sum += double(count[v]) * v / 255.0;
  const double mean = sum / n;
  double sq = 0;
  for (int v = 0; v < 256; ++v) sq += double(count[v]) * (v / 255.0 - mean) * (v / 255.0 - mean);
  return {mean, std::sqrt(sq / n)};
}

}  // namespace frugal::data

// Printing tensors the way PyTorch does: tensor([[ 1.0000, -0.5000], ...], dtype=f64), abbreviated with "..."
// past 1000 elements.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/tensor.h"

namespace frugal {

namespace {

constexpr int64_t kSummarizeAbove = 1000;
constexpr int64_t kEdgeItems = 3;

struct Format {
  bool is_bool = false, is_int = false, whole = false, sci = false;
  int width = 1;

  std::string operator()(double v) const {
    char buf[64];
    if (is_bool) return v != 0 ? "True" : "False";
    if (is_int) {
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
    } else if (!std::isfinite(v)) {
      return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
    } else if (sci) {
      std::snprintf(buf, sizeof buf, "%.4e", v);
    } else if (whole) {
      std::snprintf(buf, sizeof buf, "%.0f.", v);
    } else {
      std::snprintf(buf, sizeof buf, "%.4f", v);
    }
    return buf;
  }
};

// Walks the (possibly abbreviated) elements, printing nested brackets.
struct Printer {
  const std::vector<double>& values;
  const Shape& shape;
  const Shape strides;  // contiguous strides of shape
  bool summarize;
  Format fmt;
  std::ostringstream& os;

  template <typename F>
  void for_each_shown(int dim, F f) const {
    const int64_t n = shape[dim];
    for (int64_t i = 0; i < n; ++i) {
      if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
        f(-1);
        i = n - kEdgeItems - 1;
        continue;
      }
      f(i);
    }
  }

  void print(int dim, int64_t offset, int indent) const {
    if (dim == shape.size()) {
      const std::string s = fmt(values[size_t(offset)]);
      os << std::string(size_t(std::max<int>(0, fmt.width - int(s.size()))), ' ') << s;
      return;
    }
    os << '[';
    bool first = true;
    const bool last_dim = dim == shape.size() - 1;
    for_each_shown(dim, [&](int64_t i) {
      if (!first) {
        os << ',';
        if (last_dim)
          os << ' ';
        else
          os << std::string(size_t(shape.size() - dim - 1), '\n') << std::string(size_t(indent + 1), ' ');
      }
      first = false;
      if (i < 0)
        os << "...";
      else
        print(dim + 1, offset + i * strides[dim], indent + 1);
    });
    os << ']';
  }

  // The elements that will be shown, for choosing the number format.
  void collect(int dim, int64_t offset, std::vector<double>& out) const {
    if (dim == shape.size()) {
      out.push_back(values[size_t(offset)]);
      return;
    }
    for_each_shown(dim, [&](int64_t i) {
      if (i >= 0) collect(dim + 1, offset + i * strides[dim], out);
    });
  }
};

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  const Tensor host = to(kCPU);
  const std::vector<double> values =
      dtype() == DType::Bool ? host.to(DType::U8).to_vector<double>() : host.to_vector<double>();
  std::ostringstream os;
  Printer p{values, shape(), contiguous_strides(shape()), numel() > kSummarizeAbove, {}, os};
  p.fmt.is_bool = dtype() == DType::Bool;
  p.fmt.is_int = is_integral(dtype());
  std::vector<double> shown;
  if (numel() > 0) p.collect(0, 0, shown);
  if (is_floating(dtype())) {
    double max_abs = 0, min_abs = INFINITY;
    bool whole = true;
    for (double v : shown) {
      if (!std::isfinite(v)) continue;
      max_abs = std::max(max_abs, std::fabs(v));
      if (v != 0) min_abs = std::min(min_abs, std::fabs(v));
      whole = whole && v == std::floor(v);
    }
    p.fmt.whole = whole;
    p.fmt.sci = max_abs >= 1e8 || (min_abs < 1e-4 && !whole) ||
                (min_abs != INFINITY && max_abs / min_abs > 1000 && !whole);
  }
  for (double v : shown) p.fmt.width = std::max(p.fmt.width, int(p.fmt(v).size()));

  os << "tensor(";
  if (numel() == 0)
    os << "[]";
  else
    p.print(0, 0, 7);
  if (numel() == 0 && dim() != 1) os << ", size=" << shape();
  if (dtype() != DType::F32 && dtype() != DType::I64 && dtype() != DType::Bool) os << ", dtype=" << dtype();
  if (!device().is_cpu()) os << ", device='" << device() << "'";
  os << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace frugal

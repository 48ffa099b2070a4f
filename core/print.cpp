// Printing tensors the way PyTorch does (torch/_tensor_str.py with its default options): tensor([[ 1.0000,
// -0.5000], ...], dtype=f64), rows wrapped at 80 columns, abbreviated with "..." past 1000 elements.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/tensor.h"

namespace frugal {

namespace {

constexpr int64_t kSummarizeAbove = 1000;
constexpr int64_t kEdgeItems = 3;
constexpr int kLineWidth = 80;

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
    const bool last_dim = dim == shape.size() - 1;
    // A row wraps after as many elements (", " included) as fit in the line past the indent.
    const int64_t per_line = std::max(1, (kLineWidth - indent) / (fmt.width + 2));
    int64_t item = 0;
    for_each_shown(dim, [&](int64_t i) {
      if (item > 0) {
        os << ',';
        if (!last_dim)
          os << std::string(size_t(shape.size() - dim - 1), '\n') << std::string(size_t(indent + 1), ' ');
        else if (item % per_line == 0)
          os << '\n' << std::string(size_t(indent + 1), ' ');
        else
          os << ' ';
      }
      ++item;
      if (i < 0)
        os << (last_dim ? " ..." : "...");  // PyTorch pads the ellipsis inside a row
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
  if (device().is_meta()) {  // as PyTorch prints one: no values to show (Note [the meta device])
    std::string size;
    for (int d = 0; d < dim(); ++d) size += (d ? ", " : "") + std::to_string(shape()[d]);
    return detail::str_cat("tensor(..., device='meta', size=(", size, dim() == 1 ? ",)" : ")",
                           dtype() == DType::F32 ? "" : detail::str_cat(", dtype=", dtype()), ")");
  }
  const Tensor host = ops::to(*this, kCPU);
  const std::vector<double> values =
      dtype() == DType::Bool ? ops::to(host, DType::U8).to_vector<double>() : host.to_vector<double>();
  std::ostringstream os;
  Printer p{values, shape(), contiguous_strides(shape()), numel() > kSummarizeAbove, {}, os};
  p.fmt.is_bool = dtype() == DType::Bool;
  p.fmt.is_int = is_integral(dtype());
  std::vector<double> shown;
  if (numel() > 0) p.collect(0, 0, shown);
  // Floats: the format and width come from the finite non-zero values only (PyTorch's _Formatter).
  std::vector<double> measured;
  for (double v : shown)
    if (!is_floating(dtype()) || (std::isfinite(v) && v != 0)) measured.push_back(v);
  if (is_floating(dtype()) && !measured.empty()) {
    double max_abs = 0, min_abs = INFINITY;
    bool whole = true;
    for (double v : measured) {
      max_abs = std::max(max_abs, std::fabs(v));
      min_abs = std::min(min_abs, std::fabs(v));
      whole = whole && v == std::floor(v);
    }
    p.fmt.whole = whole;
    p.fmt.sci = max_abs / min_abs > 1000 || max_abs > 1e8 || (!whole && min_abs < 1e-4);
  } else {
    p.fmt.whole = true;  // only zeros, infs and nans: "0.", "inf"
  }
  for (double v : measured) p.fmt.width = std::max(p.fmt.width, int(p.fmt(v).size()));

  const std::string prefix = "tensor(";
  os << prefix;
  if (numel() == 0)
    os << "[]";
  else
    p.print(0, 0, int(prefix.size()));

  std::vector<std::string> suffixes;
  if (!device().is_cpu()) suffixes.push_back(detail::str_cat("device='", device(), "'"));
  if (numel() == 0) {
    if (dim() != 1) {  // a Python tuple: (0, 3)
      std::string size = "size=(";
      for (int d = 0; d < dim(); ++d) size += (d ? ", " : "") + std::to_string(shape()[d]);
      suffixes.push_back(size + ")");
    }
    // With no elements to show, every dtype but the default one is named.
    if (dtype() != DType::F32) suffixes.push_back(detail::str_cat("dtype=", dtype()));
  } else if (dtype() != DType::F32 && dtype() != DType::I64 && dtype() != DType::Bool) {
    suffixes.push_back(detail::str_cat("dtype=", dtype()));
  }
  // A suffix that would pass column 80 starts a new line. The arithmetic is PyTorch's _add_suffixes (which
  // counts the last line as two longer than it is), so that lines break where PyTorch's do.
  std::string out = os.str();
  const size_t last_newline = out.rfind('\n');
  int64_t last_line =
      int64_t(out.size()) - (last_newline == std::string::npos ? -1 : int64_t(last_newline)) + 1;
  for (const std::string& suffix : suffixes) {
    const int64_t len = int64_t(suffix.size());
    if (last_line + len + 2 > kLineWidth) {
      out += ",\n" + std::string(prefix.size(), ' ') + suffix;
      last_line = int64_t(prefix.size()) + len;
    } else {
      out += ", " + suffix;
      last_line += len + 2;
    }
  }
  return out + ")";
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace frugal

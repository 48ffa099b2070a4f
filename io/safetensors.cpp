// safetensors save (atomic, reference layout and JSON) and load (every length checked before it is trusted).
#include "io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "io/file.h"

namespace frugal::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; frugal copies memory as is");

namespace {

constexpr int64_t kMaxHeaderBytes = 100'000'000;  // the reference's limit

// The reference's dtype order (increasing alignment); tensors are laid out by descending rank, then name.
int alignment_rank(DType t) {
  switch (t) {
    case DType::Bool:
      return 0;
    case DType::U8:
      return 1;
    case DType::F16:
      return 7;
    case DType::BF16:
      return 8;
    case DType::I32:
      return 9;
    case DType::F32:
      return 11;
    case DType::F64:
      return 12;
    case DType::I64:
      return 13;
  }
  return 0;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  int64_t begin, end;  // byte offsets in the data buffer
};

}  // namespace

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::F64:
      return "F64";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
    case DType::I64:
      return "I64";
    case DType::I32:
      return "I32";
    case DType::U8:
      return "U8";
    case DType::Bool:
      return "BOOL";
  }
  return "?";
}

DType dtype_from_safetensors_name(const std::string& name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (name == safetensors_dtype_name(DType(i))) return DType(i);
  FRUGAL_CHECK_DTYPE(false, "safetensors dtype '", name,
                     "' is not supported; frugal reads F32, F64, F16, BF16, I64, I32, U8 and BOOL");
  return DType::F32;  // unreachable
}

void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Plan the layout (Note [safetensors order]) and write the header before touching any data.
  std::vector<std::pair<std::string, Tensor>> order(tensors.begin(), tensors.end());
  for (const auto& [name, t] : order)
    FRUGAL_CHECK(t.defined(), "save_safetensors('", path, "'): tensor '", name, "' is undefined");
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    const int ra = alignment_rank(a.second.dtype()), rb = alignment_rank(b.second.dtype());
    return ra != rb ? ra > rb : a.first < b.first;
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto& [name, t] : order) {
    FRUGAL_CHECK(name != "__metadata__", "save_safetensors('", path,
                 "'): '__metadata__' is reserved by the format and cannot name a tensor");
    nlohmann::ordered_json info = nlohmann::ordered_json::object();
    info["dtype"] = safetensors_dtype_name(t.dtype());
    info["shape"] = t.shape().vec();
    info["data_offsets"] = {offset, offset + t.nbytes()};
    header[name] = std::move(info);
    offset += t.nbytes();
  }
  std::string text;
  try {
    text = header.dump();  // compact, non-ASCII kept as UTF-8: as serde_json writes it
  } catch (const nlohmann::json::exception& e) {
    FRUGAL_CHECK(false, "save_safetensors('", path,
                 "'): a tensor name or metadata string is not valid UTF-8 (", e.what(), ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const uint64_t n = text.size();

  AtomicFile file(path);
  file.write(&n, 8);
  file.write(text.data(), int64_t(text.size()));
  for (const auto& [name, t] : order) {
    // One tensor at a time, so a non-contiguous or device tensor costs one temporary copy of itself only.
    const Tensor c = t.to(kCPU).contiguous();
    if (c.nbytes() > 0) file.write(c.raw_data(), c.nbytes());
  }
  file.commit();
}

namespace {

// Parses and checks the header against a data buffer of data_size bytes; the entries come back in layout
// order, covering the buffer exactly.
std::vector<Entry> parse_header(const std::string& path, const std::string& text, int64_t data_size,
                                std::map<std::string, std::string>& metadata) {
  const auto fail = [&](const auto&... what) {
    FRUGAL_CHECK(false, "load_safetensors('", path, "'): ", what...);
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("the header is not valid JSON (", e.what(), "); the file is corrupt or not a safetensors file");
  }
  if (!header.is_object()) fail("the header is JSON but not an object; the file is corrupt");

  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) fail("'__metadata__' is not an object of strings");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) fail("metadata '", k, "' is not a string (got ", v.type_name(), ")");
        metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets"))
      fail("tensor '", name, "' needs an object with \"dtype\", \"shape\" and \"data_offsets\"");
    Entry e{name, DType::F32, {}, 0, 0};
    const auto& dtype = value["dtype"];
    if (!dtype.is_string()) fail("tensor '", name, "': dtype is not a string");
    try {
      e.dtype = dtype_from_safetensors_name(dtype.get<std::string>());
    } catch (const DTypeError& err) {
      fail("tensor '", name, "': ", err.what());
    }
    const auto& shape = value["shape"];
    if (!shape.is_array()) fail("tensor '", name, "': shape is not an array");
    if (shape.size() > size_t(kMaxDims))
      fail("tensor '", name, "' has ", shape.size(), " dimensions; frugal supports up to ", kMaxDims);
    for (const auto& d : shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        fail("tensor '", name, "': shape ", shape.dump(), " must hold non-negative 64-bit integers");
      e.shape.push_back(d.get<int64_t>());
    }
    // The element count is compared with the data buffer as it grows, so it never overflows.
    const bool has_zero = std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end();
    int64_t numel = has_zero ? 0 : 1;
    bool too_big = false;
    for (int64_t d : e.shape) {
      if (has_zero) break;
      if (numel > data_size / d) {
        too_big = true;
        break;
      }
      numel *= d;
    }
    const auto& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      fail("tensor '", name, "': data_offsets ", offsets.dump(), " must be two non-negative integers");
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > uint64_t(data_size))
      fail("tensor '", name, "': data_offsets [", begin, ", ", end, "] lie outside the data buffer of ",
           data_size, " bytes (is the file truncated?)");
    e.begin = int64_t(begin);
    e.end = int64_t(end);
    if (too_big || e.end - e.begin != numel * dtype_size(e.dtype))
      fail("tensor '", name, "': shape ", e.shape, " of ", dtype.get<std::string>(), " needs ",
           too_big ? std::string("more than the whole buffer") : std::to_string(numel * dtype_size(e.dtype)),
           " bytes but data_offsets [", begin, ", ", end, "] hold ", e.end - e.begin);
    entries.push_back(std::move(e));
  }

  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  int64_t covered = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (e.begin < covered)
      fail("tensor '", e.name, "' (bytes [", e.begin, ", ", e.end, "]) overlaps tensor '",
           entries[i - 1].name, "' (bytes [", entries[i - 1].begin, ", ", entries[i - 1].end, "])");
    if (e.begin > covered)
      fail("a gap of ", e.begin - covered, " bytes in the data buffer before tensor '", e.name,
           "' (the format requires tensors back to back)");
    covered = e.end;
  }
  if (covered != data_size)
    fail("the tensors cover ", covered, " bytes but the data buffer holds ", data_size,
         " (extra bytes at the end of the file)");
  return entries;
}

}  // namespace

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  FRUGAL_CHECK(in.is_open(), "load_safetensors: cannot open '", path, "': ", std::strerror(errno));
  std::error_code ec;
  FRUGAL_CHECK(std::filesystem::is_regular_file(path, ec), "load_safetensors: '", path, "' is not a file");
  const int64_t file_size = in.tellg();
  FRUGAL_CHECK(file_size >= 8, "load_safetensors('", path, "'): the file has ", file_size,
               " bytes, fewer than the 8 of the header length; it is truncated or not a safetensors file");
  in.seekg(0);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  FRUGAL_CHECK(in.gcount() == 8, "load_safetensors('", path, "'): reading the header length failed");
  FRUGAL_CHECK(n <= uint64_t(kMaxHeaderBytes), "load_safetensors('", path, "'): the header length ", n,
               " exceeds the format's limit of ", kMaxHeaderBytes, " bytes; the file is corrupt");
  FRUGAL_CHECK(int64_t(n) <= file_size - 8, "load_safetensors('", path, "'): the header length ", n,
               " exceeds the ", file_size - 8, " bytes after it; the file is truncated or corrupt");
  std::string text(n, '\0');
  in.read(text.data(), int64_t(n));
  FRUGAL_CHECK(in.gcount() == int64_t(n), "load_safetensors('", path, "'): reading the header failed");

  SafetensorsFile out;
  const int64_t data_start = 8 + int64_t(n);
  const std::vector<Entry> entries = parse_header(path, text, file_size - data_start, out.metadata);
  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, e.dtype);
    if (t.nbytes() > 0) {
      in.seekg(data_start + e.begin);
      in.read(static_cast<char*>(t.raw_data()), t.nbytes());
      FRUGAL_CHECK(in.gcount() == t.nbytes(), "load_safetensors('", path, "'): reading tensor '", e.name,
                   "' failed after ", in.gcount(), " of ", t.nbytes(), " bytes (did the file change?)");
    }
    if (e.dtype == DType::Bool) {  // any other byte would be an invalid C++ bool
      const auto* bytes = static_cast<const uint8_t*>(t.raw_data());
      for (int64_t i = 0; i < t.numel(); ++i)
        FRUGAL_CHECK(bytes[i] <= 1, "load_safetensors('", path, "'): BOOL tensor '", e.name, "' holds byte ",
                     int(bytes[i]), " at element ", i, "; only 0 and 1 are valid");
    }
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

}  // namespace frugal::io

// safetensors save (atomic, reference layout and JSON) and load (every length checked before it is trusted).
#include "io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <vector>

#include "core/ops.h"
#include "io/file.h"

namespace frugal::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; frugal copies memory as is");

namespace {

constexpr int64_t kMaxHeaderBytes = 100'000'000;  // the reference's limit
constexpr int kMaxHeaderDepth = 3;                // {"name": {"shape": [...]}} is as deep as a header goes
constexpr size_t kQuoteLimit = 64;                // characters of a value quoted in a message

// Note [hostile headers]
// A header is read from a file that may have been written by anyone, so nothing in it may cost more than its
// length: containers nested deeper than kMaxHeaderDepth are refused while parsing (nlohmann parses
// iteratively, but dump() and other code that walks a value recurse per level, and 100,000 levels overflow
// the stack); a message quotes at most kQuoteLimit characters of any name or value; and what nlohmann would
// let through is refused too: bytes after the object other than the space padding (nlohmann stops at a NUL
// as if the input ended there) and duplicate keys (nlohmann keeps the last, so the first entry would never
// be checked).

// At most `limit` characters of s (cut at a UTF-8 character boundary), with "..." when cut.
std::string excerpt(std::string_view s, size_t limit = kQuoteLimit) {
  if (s.size() <= limit) return std::string(s);
  size_t cut = limit;
  while (cut > 0 && (uint8_t(s[cut]) & 0xC0) == 0x80) --cut;
  return std::string(s.substr(0, cut)) + "...";
}

// excerpt(s) in single quotes. (Appended: GCC 12 warns falsely about "'" + std::string, its bug 105329.)
std::string in_quotes(std::string_view s) {
  std::string q(1, '\'');
  q += excerpt(s);
  q += '\'';
  return q;
}

// nlohmann's message with the token it quotes ("last read: '...'", as long as the token) cut short.
std::string bounded_parse_error(const std::string& what) {
  constexpr std::string_view kLastRead = "last read: '";
  const size_t at = what.find(kLastRead);
  if (at == std::string::npos) return excerpt(what, 4 * kQuoteLimit);
  const size_t from = at + kLastRead.size();
  return excerpt(std::string_view(what).substr(0, from), 4 * kQuoteLimit) +
         excerpt(std::string_view(what).substr(from));
}

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
  bool int8 = false;   // stored as "I8", held as U8 (Note [int8 as I8])
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
  FRUGAL_CHECK_DTYPE(false, "safetensors dtype '", excerpt(name),
                     "' is not supported; frugal reads F32, F64, F16, BF16, I64, I32, U8 and BOOL");
  return DType::F32;  // unreachable
}

namespace detail {

SafetensorsPlan plan_safetensors(const std::string& path, const StateDict& tensors,
                                 const std::map<std::string, std::string>& metadata,
                                 const std::set<std::string>& int8_names) {
  // The layout of Note [safetensors order].
  SafetensorsPlan plan;
  plan.tensors.assign(tensors.begin(), tensors.end());
  for (const auto& [name, t] : plan.tensors)
    FRUGAL_CHECK(t.defined(), "save_safetensors('", path, "'): tensor '", excerpt(name), "' is undefined");
  for (const std::string& name : int8_names) {
    auto it = tensors.find(name);
    FRUGAL_CHECK(it != tensors.end(), "save_safetensors('", path, "'): int8 tensor '", excerpt(name),
                 "' is not among the tensors");
    FRUGAL_CHECK_DTYPE(it->second.dtype() == DType::U8, "save_safetensors('", path, "'): int8 tensor '",
                       excerpt(name), "' must be U8 (its int8 bytes, Note [int8 as I8]), got ",
                       it->second.dtype());
  }
  // The reference's rank of I8 is 2, between U8 (1) and F16 (7).
  auto rank = [&](const std::pair<std::string, Tensor>& e) {
    return int8_names.count(e.first) ? 2 : alignment_rank(e.second.dtype());
  };
  std::stable_sort(plan.tensors.begin(), plan.tensors.end(), [&](const auto& a, const auto& b) {
    const int ra = rank(a), rb = rank(b);
    return ra != rb ? ra > rb : a.first < b.first;
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto& [name, t] : plan.tensors) {
    FRUGAL_CHECK(name != "__metadata__", "save_safetensors('", path,
                 "'): '__metadata__' is reserved by the format and cannot name a tensor");
    nlohmann::ordered_json info = nlohmann::ordered_json::object();
    info["dtype"] = int8_names.count(name) ? "I8" : safetensors_dtype_name(t.dtype());
    info["shape"] = t.shape().vec();
    info["data_offsets"] = {offset, offset + t.nbytes()};
    header[name] = std::move(info);
    offset += t.nbytes();
  }
  try {
    plan.header = header.dump();  // compact, non-ASCII kept as UTF-8: as serde_json writes it
  } catch (const nlohmann::json::exception& e) {
    FRUGAL_CHECK(false, "save_safetensors('", path,
                 "'): a tensor name or metadata string is not valid UTF-8 (", e.what(), ")");
  }
  plan.header.append((8 - plan.header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  // A file that no reader (this one, the reference) would load is refused before it is written.
  FRUGAL_CHECK(int64_t(plan.header.size()) <= kMaxHeaderBytes, "save_safetensors('", path, "'): the header ",
               "(names, shapes and metadata) would take ", plan.header.size(),
               " bytes, more than the format's ", "limit of ", kMaxHeaderBytes,
               "; keep large data in tensors, not in metadata");
  return plan;
}

void write_safetensors(AtomicFile& file, const SafetensorsPlan& plan) {
  const uint64_t n = plan.header.size();
  file.write(&n, 8);
  file.write(plan.header.data(), int64_t(plan.header.size()));
  for (const auto& [name, t] : plan.tensors) {
    // One tensor at a time, so a non-contiguous or device tensor costs one temporary copy of itself only.
    const Tensor c = ops::contiguous(ops::to(t, kCPU));
    if (c.nbytes() > 0) file.write(c.raw_data(), c.nbytes());
  }
}

}  // namespace detail

void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata,
                      const std::set<std::string>& int8_names) {
  // Planned (and checked) before the file is created.
  const detail::SafetensorsPlan plan = detail::plan_safetensors(path, tensors, metadata, int8_names);
  AtomicFile file(path);
  detail::write_safetensors(file, plan);
  file.commit();
}

namespace {

// Parses the header's JSON, refusing what nlohmann alone would accept or choke on (Note [hostile headers]).
nlohmann::json parse_json(const char* who, const std::string& path, std::string_view text) {
  const auto fail = [&](const auto&... what) { FRUGAL_CHECK(false, who, "('", path, "'): ", what...); };
  // nlohmann ends its input at a NUL byte, so "{}\0garbage" would parse as "{}": look for one first.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    fail("the header holds a NUL byte at offset ", nul,
         "; JSON never contains one and only spaces (0x20) may pad the header; the file is corrupt");
  const size_t last = text.find_last_not_of(' ');
  const std::string_view json = text.substr(0, last == std::string_view::npos ? 0 : last + 1);
  if (json.empty()) fail("the header is not an object (it is empty or all spaces); the file is corrupt");
  if (json.front() != '{')
    fail("the header is not an object (it must start with '{' but starts with \"", excerpt(json),
         "\"); the file is corrupt");

  // The parser calls back at every container and key: containers deeper than a valid header goes are
  // refused before they are built, and each object's keys are checked for duplicates as they arrive.
  struct OpenObject {
    std::set<std::string, std::less<>> keys;
    std::string last_key;
  };
  std::vector<OpenObject> open;
  const auto check = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start || event == Event::array_start) {
      if (depth >= kMaxHeaderDepth)  // depth counts the containers already open around this one
        fail("the header is nested deeper than ", kMaxHeaderDepth,
             " levels (a valid one is {\"name\": {\"shape\": [...]}} at most); the file is corrupt");
      if (event == Event::object_start) open.emplace_back();
    } else if (event == Event::object_end) {
      open.pop_back();
    } else if (event == Event::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open.back().keys.insert(key).second) {
        if (open.size() == 1)
          fail("the header names '", excerpt(key), "' twice (which one is meant?); the file is corrupt");
        fail("the header names '", excerpt(key), "' twice in '", excerpt(open[open.size() - 2].last_key),
             "' (which one is meant?); the file is corrupt");
      }
      open.back().last_key = key;
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(json, check);
  } catch (const nlohmann::json::exception& e) {
    fail("the header is not valid JSON (", bounded_parse_error(e.what()),
         "); the file is corrupt or not a safetensors file");
  }
  if (json.back() != '}')
    fail("only spaces (0x20) may follow the header's JSON object, but byte ", int(uint8_t(json.back())),
         " does at offset ", json.size() - 1, "; the file is corrupt");
  return header;
}

// Parses and checks the header against a data buffer of data_size bytes; the entries come back in layout
// order, covering the buffer exactly.
std::vector<Entry> parse_header(const char* who, const std::string& path, std::string_view text,
                                int64_t data_size, std::map<std::string, std::string>& metadata) {
  const auto fail = [&](const auto&... what) { FRUGAL_CHECK(false, who, "('", path, "'): ", what...); };
  const nlohmann::json header = parse_json(who, path, text);

  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    const std::string quoted = in_quotes(name);
    if (name == "__metadata__") {
      if (!value.is_object()) fail("'__metadata__' is not an object of strings");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) fail("metadata '", excerpt(k), "' is not a string (got ", v.type_name(), ")");
        metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets"))
      fail("tensor ", quoted, " needs an object with \"dtype\", \"shape\" and \"data_offsets\"");
    Entry e{name, DType::F32, {}, 0, 0};
    const auto& dtype = value["dtype"];
    if (!dtype.is_string()) fail("tensor ", quoted, ": dtype is not a string");
    try {
      e.int8 = dtype.get<std::string>() == "I8";
      e.dtype = e.int8 ? DType::U8 : dtype_from_safetensors_name(dtype.get<std::string>());
    } catch (const DTypeError& err) {
      fail("tensor ", quoted, ": ", err.what());
    }
    const auto& shape = value["shape"];
    if (!shape.is_array()) fail("tensor ", quoted, ": shape is not an array");
    if (shape.size() > size_t(kMaxDims))
      fail("tensor ", quoted, " has ", shape.size(), " dimensions; frugal supports up to ", kMaxDims);
    for (const auto& d : shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        fail("tensor ", quoted, ": shape ", excerpt(shape.dump()), " must hold non-negative 64-bit integers");
      e.shape.push_back(d.get<int64_t>());
    }
    // The nonzero sizes times the element size must fit in an int64, with a zero among them or not: the
    // strides of [0, 2^62, 2^62] overflow as surely as the byte count of [2^62, 2^62].
    int64_t bytes = dtype_size(e.dtype);
    bool overflows = false, has_zero = false;
    for (int64_t d : e.shape) {
      has_zero = has_zero || d == 0;
      if (d != 0) overflows = overflows || __builtin_mul_overflow(bytes, d, &bytes);
    }
    if (overflows)
      fail("tensor ", quoted, ": shape ", e.shape, " of ", dtype.get<std::string>(),
           " needs more than the whole buffer: its sizes multiply past 2^63 bytes (an int64 overflow)");
    if (has_zero) bytes = 0;
    const auto& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      fail("tensor ", quoted, ": data_offsets ", excerpt(offsets.dump()),
           " must be two non-negative integers");
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > uint64_t(data_size))
      fail("tensor ", quoted, ": data_offsets [", begin, ", ", end, "] lie outside the data buffer of ",
           data_size, " bytes (is the file truncated?)");
    e.begin = int64_t(begin);
    e.end = int64_t(end);
    if (e.end - e.begin != bytes)
      fail("tensor ", quoted, ": shape ", e.shape, " of ", dtype.get<std::string>(), " needs ", bytes,
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
      fail("tensor '", excerpt(e.name), "' (bytes [", e.begin, ", ", e.end, "]) overlaps tensor '",
           excerpt(entries[i - 1].name), "' (bytes [", entries[i - 1].begin, ", ", entries[i - 1].end, "])");
    if (e.begin > covered)
      fail("a gap of ", e.begin - covered, " bytes in the data buffer before tensor '", excerpt(e.name),
           "' (the format requires tensors back to back)");
    covered = e.end;
  }
  if (covered != data_size)
    fail("the tensors cover ", covered, " bytes but the data buffer holds ", data_size,
         " (extra bytes at the end of the file)");
  return entries;
}

}  // namespace

namespace {

// The header of an open file, checked against the file's length: its entries in layout order and where the
// data buffer starts.
struct Header {
  std::vector<Entry> entries;
  int64_t data_start = 0;
};
Header read_header(const char* who, const InputFile& in, std::map<std::string, std::string>& metadata) {
  const std::string& path = in.path();
  const int64_t file_size = in.size();
  FRUGAL_CHECK(file_size >= 8, who, "('", path, "'): the file has ", file_size,
               " bytes, fewer than the 8 of the header length; it is truncated or not a safetensors file");
  uint64_t n = 0;
  in.read_at(0, &n, 8, "the header length");
  FRUGAL_CHECK(n <= uint64_t(kMaxHeaderBytes), who, "('", path, "'): the header length ", n,
               " exceeds the format's limit of ", kMaxHeaderBytes, " bytes; the file is corrupt");
  FRUGAL_CHECK(int64_t(n) <= file_size - 8, who, "('", path, "'): the header length ", n, " exceeds the ",
               file_size - 8, " bytes after it; the file is truncated or corrupt");
  std::string text(n, '\0');
  in.read_at(8, text.data(), int64_t(n), "the header");
  Header h;
  h.data_start = 8 + int64_t(n);
  h.entries = parse_header(who, path, text, file_size - h.data_start, metadata);
  return h;
}

// Any byte of a BOOL tensor but 0 and 1 would be an invalid C++ bool.
void check_bools(const char* who, const std::string& path, const Entry& e, const uint8_t* bytes, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    FRUGAL_CHECK(bytes[i] <= 1, who, "('", path, "'): BOOL tensor '", excerpt(e.name), "' holds byte ",
                 int(bytes[i]), " at element ", i, "; only 0 and 1 are valid");
}

}  // namespace

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  const InputFile in(path, "load_safetensors");
  std::map<std::string, std::string> metadata;
  read_header("load_safetensors", in, metadata);
  return metadata;
}

SafetensorsFile load_safetensors(const std::string& path) {
  const InputFile in(path, "load_safetensors");
  SafetensorsFile out;
  const auto [entries, data_start] = read_header("load_safetensors", in, out.metadata);
  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, e.dtype);
    if (t.nbytes() > 0)
      in.read_at(data_start + e.begin, t.raw_data(), t.nbytes(), "tensor '" + excerpt(e.name) + "'");
    if (e.dtype == DType::Bool)
      check_bools("load_safetensors", path, e, static_cast<const uint8_t*>(t.raw_data()), t.numel());
    if (e.int8) out.int8_names.insert(e.name);
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

SafetensorsFile map_safetensors(const std::string& path) {
  const InputFile in(path, "map_safetensors");
  SafetensorsFile out;
  // Everything is checked against the file's length before the file is mapped.
  const auto [entries, data_start] = read_header("map_safetensors", in, out.metadata);
  const std::shared_ptr<const void> mapping = in.map();
  auto* base = static_cast<char*>(const_cast<void*>(mapping.get()));
  // One storage over the whole mapping (its bytes count once, Note [mapped bytes]); each tensor views it.
  const auto storage = std::make_shared<Storage>(mapping, base, in.size(), kCPU);
  for (const Entry& e : entries) {
    const int64_t at = data_start + e.begin;
    if (e.dtype == DType::Bool)
      check_bools("map_safetensors", path, e, reinterpret_cast<const uint8_t*>(base + at), e.end - e.begin);
    // Note [mapped views are aligned to their element]: the data starts 8-byte aligned after the padded
    // header and the layout puts wider dtypes first, so every view starts at a multiple of its element size.
    FRUGAL_CHECK(at % dtype_size(e.dtype) == 0, "map_safetensors('", path, "'): tensor '", excerpt(e.name),
                 "' starts at byte ", at, ", not a multiple of its element size ", dtype_size(e.dtype),
                 " (a layout frugal and the reference never write); load it with load_safetensors");
    if (e.int8) out.int8_names.insert(e.name);
    out.tensors.emplace(e.name, Tensor(storage, at, e.shape, contiguous_strides(e.shape), e.dtype));
  }
  return out;
}

}  // namespace frugal::io

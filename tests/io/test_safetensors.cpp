// safetensors: round trips of every dtype and layout, the Python-written fixture (values and byte-identical
// output), corrupt and truncated files, and atomic replacement when a save fails midway.
#include "io/safetensors.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "io/file.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

using SafetensorsTest = testing::ScratchDirTest;  // a fresh scratch directory per test

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

// A file made of a hand-written header (padded like the format) and data bytes.
std::string raw_file(const std::string& header, const std::string& data) {
  std::string text = header;
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + text + data;
}

// The bytes of a tensor in C order.
std::string bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), size_t(c.nbytes()));
}

void expect_same(const Tensor& actual, const Tensor& expected, const std::string& name) {
  ASSERT_TRUE(actual.defined()) << name;
  EXPECT_EQ(actual.dtype(), expected.dtype()) << name;
  EXPECT_EQ(actual.shape(), expected.shape()) << name;
  EXPECT_TRUE(actual.is_contiguous()) << name;
  EXPECT_EQ(bytes_of(actual), bytes_of(expected)) << name;
}

// One random tensor of each dtype (never all zeros), keyed by the dtype's name.
StateDict every_dtype(const Shape& shape) {
  StateDict d;
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType t = DType(i);
    Tensor x = is_floating(t)     ? testing::uniform(shape, -3, 3, t, 10 + i)
               : t == DType::Bool ? randint(0, 2, shape, DType::I64).to(DType::Bool)
                                  : randint(-100, 100, shape, DType::I64).to(t);
    if (t == DType::U8) x = randint(0, 256, shape, DType::I64).to(t);
    d[dtype_name(t)] = x;
  }
  return d;
}

TEST_F(SafetensorsTest, RoundTripsEveryDtypeWithMetadata) {
  const StateDict saved = every_dtype({3, 5});
  const std::map<std::string, std::string> meta{{"epoch", "3"}, {"note", "héllo \"quoted\"\n"}};
  io::save_safetensors(path("a.safetensors"), saved, meta);
  const io::SafetensorsFile f = io::load_safetensors(path("a.safetensors"));
  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), saved.size());
  for (const auto& [name, t] : saved) expect_same(f.tensors.at(name), t, name);
  EXPECT_FALSE(fs::exists(path("a.safetensors.tmp")));
}

TEST_F(SafetensorsTest, WritesNonContiguousTensorsContiguously) {
  const Tensor base = testing::uniform({6, 8}, -1, 1, DType::F64);
  const StateDict saved{{"transposed", base.transpose(0, 1)},
                        {"strided", base.slice(1, 1, 8, 3)},
                        {"expanded", testing::uniform({1, 4}, 0, 1, DType::BF16).expand({3, 4})},
                        {"row", base.select(0, 2)}};
  for (const auto& [name, t] : saved) {
    if (name == "row") continue;
    EXPECT_FALSE(t.is_contiguous()) << name;
  }
  io::save_safetensors(path("v.safetensors"), saved);
  const auto f = io::load_safetensors(path("v.safetensors"));
  for (const auto& [name, t] : saved) {
    expect_same(f.tensors.at(name), t, name);
    EXPECT_EQ(f.tensors.at(name).to_vector<double>(), t.to_vector<double>()) << name;
  }
}

TEST_F(SafetensorsTest, RoundTripsZeroDimEmptyAndLargeTensors) {
  const StateDict saved{{"scalar", scalar_tensor(2.5, DType::F16)},
                        {"step", scalar_tensor(7, DType::I64)},
                        {"empty", empty({0, 3})},
                        {"empty_mid", empty({5, 0, 2}, DType::I32)},
                        {"large", testing::uniform({512, 1024}, -1, 1)}};  // 2 MiB
  io::save_safetensors(path("z.safetensors"), saved);
  const auto f = io::load_safetensors(path("z.safetensors"));
  for (const auto& [name, t] : saved) expect_same(f.tensors.at(name), t, name);
  EXPECT_EQ(f.tensors.at("scalar").dim(), 0);
  EXPECT_EQ(f.tensors.at("step").item<int64_t>(), 7);
  EXPECT_TRUE(f.metadata.empty());
}

TEST_F(SafetensorsTest, EmptyDictMatchesTheReferenceBytes) {
  // huggingface/safetensors' own test vectors for no tensors, without and with metadata.
  io::save_safetensors(path("e.safetensors"), {});
  EXPECT_EQ(io::read_bytes(path("e.safetensors")), std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  io::save_safetensors(path("m.safetensors"), {}, {{"framework", "pt"}});
  EXPECT_EQ(io::read_bytes(path("m.safetensors")),
            std::string("\x28\0\0\0\0\0\0\0", 8) + "{\"__metadata__\":{\"framework\":\"pt\"}}     ");
  EXPECT_TRUE(io::load_safetensors(path("m.safetensors")).tensors.empty());
}

TEST_F(SafetensorsTest, LaysTensorsOutByDtypeAlignmentThenName) {
  const StateDict saved{{"b", ones({2}, DType::U8)},
                        {"a", ones({1}, DType::F32)},
                        {"c", ones({1}, DType::I64)},
                        {"d", ones({1}, DType::F32)}};
  io::save_safetensors(path("o.safetensors"), saved);
  const std::string bytes = io::read_bytes(path("o.safetensors"));
  EXPECT_NE(bytes.find("{\"c\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
                       "\"d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]},"
                       "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[16,18]}}"),
            std::string::npos)
      << bytes;
}

// tests/fixtures/reference.safetensors, written by tests/fixtures/gen_safetensors.py (standard library only).
// From FRUGAL_FIXTURES_DIR, not __FILE__: under ccache with CCACHE_BASEDIR, __FILE__ is relative to the
// build.
std::string fixture_path() { return (fs::path(FRUGAL_FIXTURES_DIR) / "reference.safetensors").string(); }

TEST_F(SafetensorsTest, ReadsThePythonFixture) {
  const auto f = io::load_safetensors(fixture_path());
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"note", "frugal fixture"}}));
  ASSERT_EQ(f.tensors.size(), 9u);
  const auto& t = f.tensors;

  EXPECT_EQ(t.at("weight").shape(), Shape({2, 3}));
  EXPECT_EQ(t.at("weight").to_vector<float>(),
            (std::vector<float>{1.5f, -2.25f, 0.1f, 3.0e38f, -0.0f, 1.0e-40f}));
  EXPECT_TRUE(std::signbit(t.at("weight").to_vector<float>()[4]));
  EXPECT_EQ(t.at("double").to_vector<double>(), (std::vector<double>{1.0 / 3.0, -2.5, 1.0e300}));
  EXPECT_EQ(t.at("half").dtype(), DType::F16);
  EXPECT_EQ(t.at("half").to_vector<float>(), (std::vector<float>{1.0f, -0.5f, 65504.0f, 0x1p-24f}));
  EXPECT_EQ(t.at("bf16").dtype(), DType::BF16);
  EXPECT_EQ(t.at("bf16").shape(), Shape({2, 2}));
  EXPECT_EQ(t.at("bf16").to_vector<float>(),
            (std::vector<float>{1.0f, -2.0f, std::numeric_limits<float>::infinity(), 0.2001953125f}));
  EXPECT_EQ(t.at("step").dim(), 0);
  EXPECT_EQ(t.at("step").item<int64_t>(), 123456789012);
  EXPECT_EQ(t.at("ids").to_vector<int32_t>(), (std::vector<int32_t>{-7, 0, 2147483647}));
  EXPECT_EQ(t.at("pixels").dtype(), DType::U8);
  EXPECT_EQ(t.at("pixels").to_vector<int>(), (std::vector<int>{0, 1, 128, 255}));
  EXPECT_EQ(t.at("mask").to_vector<int>(), (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(t.at("empty").shape(), Shape({0, 4}));
  EXPECT_EQ(t.at("empty").dtype(), DType::F32);
}

TEST_F(SafetensorsTest, ReadsTheMetadataAloneCheckedAsAWholeLoadChecksIt) {
  EXPECT_EQ(io::load_safetensors_metadata(fixture_path()), io::load_safetensors(fixture_path()).metadata);
  const std::string full = io::read_bytes(fixture_path()), cut = path("cut.safetensors");
  write_file(cut, full.substr(0, full.size() - 1));  // the header is whole, the data is not
  expect_error<Error>([&] { io::load_safetensors_metadata(cut); }, {cut, "outside the data buffer"});
}

TEST_F(SafetensorsTest, WritesTheFixtureByteForByte) {
  const auto f = io::load_safetensors(fixture_path());
  io::save_safetensors(path("again.safetensors"), f.tensors, f.metadata);
  EXPECT_EQ(io::read_bytes(path("again.safetensors")), io::read_bytes(fixture_path()));
}

// --- corrupt files
// -------------------------------------------------------------------------------------------

TEST_F(SafetensorsTest, RejectsEveryTruncation) {
  const StateDict saved = every_dtype({2, 3});
  io::save_safetensors(path("full.safetensors"), saved, {{"k", "v"}});
  const std::string full = io::read_bytes(path("full.safetensors"));
  const std::string cut = path("cut.safetensors");
  for (size_t len = 0; len < full.size(); len += 7) {
    write_file(cut, full.substr(0, len));
    SCOPED_TRACE("truncated to " + std::to_string(len) + " of " + std::to_string(full.size()) + " bytes");
    expect_error<Error>([&] { io::load_safetensors(cut); }, {"load_safetensors", cut});
  }
}

TEST_F(SafetensorsTest, RejectsMissingFilesAndBadHeaderLengths) {
  expect_error<Error>([&] { io::load_safetensors(path("nope.safetensors")); },
                      {"cannot open", "nope.safetensors"});
  expect_error<Error>([&] { io::load_safetensors(dir_.string()); }, {"is not a file"});
  const std::string p = path("bad.safetensors");
  write_file(p, "abc");
  expect_error<Error>([&] { io::load_safetensors(p); }, {p, "3 bytes", "truncated"});

  std::string bytes = raw_file("{}", "");
  uint64_t huge = 200'000'000;
  std::memcpy(bytes.data(), &huge, 8);
  write_file(p, bytes);
  expect_error<Error>([&] { io::load_safetensors(p); }, {p, "header length 200000000", "limit"});
  huge = ~uint64_t(0);
  std::memcpy(bytes.data(), &huge, 8);
  write_file(p, bytes);
  expect_error<Error>([&] { io::load_safetensors(p); }, {p, "header length"});
  const uint64_t past_end = bytes.size();  // fits the limit, not the file
  std::memcpy(bytes.data(), &past_end, 8);
  write_file(p, bytes);
  expect_error<Error>([&] { io::load_safetensors(p); }, {p, "exceeds the 8 bytes after it"});
}

struct BadHeader {
  const char* what;
  std::string header;
  std::string data;
  std::vector<std::string> message;
};

TEST_F(SafetensorsTest, RejectsBadHeadersWithAUsefulMessage) {
  const std::string f8(8, '\x01');
  const std::vector<BadHeader> cases = {
      {"not JSON", "{\"a\": {\"dtype\"", "", {"not valid JSON"}},
      {"JSON but not an object", "[1, 2]", "", {"not an object"}},
      {"unknown dtype",
       R"({"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})",
       "x",
       {"'a'", "F8_E4M3", "not supported"}},
      {"dtype not a string", R"({"a":{"dtype":3,"shape":[1],"data_offsets":[0,1]}})", "x", {"'a'", "dtype"}},
      {"missing field", R"({"a":{"dtype":"U8","shape":[1]}})", "x", {"'a'", "data_offsets"}},
      {"negative shape",
       R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})",
       "x",
       {"'a'", "non-negative"}},
      {"fractional shape",
       R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})",
       "x",
       {"'a'", "non-negative"}},
      {"too many dims",
       R"({"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})",
       "x",
       {"'a'", "9 dimensions"}},
      {"shape and size disagree",
       R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
       f8,
       {"'a'", "needs 12 bytes", "hold 8"}},
      {"shape overflows",
       R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})",
       f8,
       {"'a'", "more than the whole buffer"}},
      {"offsets past the end",
       R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
       f8,
       {"'a'", "outside the data buffer of 8 bytes"}},
      {"offsets reversed",
       R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})",
       f8,
       {"'a'", "outside the data buffer"}},
      {"offsets not integers",
       R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})",
       "x",
       {"'a'", "two non-negative integers"}},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
       f8,
       {"'b'", "overlaps tensor 'a'"}},
      {"gap",
       R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
       std::string(6, 'x'),
       {"gap of 2 bytes", "'b'"}},
      {"trailing bytes",
       R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
       "xyz",
       {"cover 2 bytes", "holds 3"}},
      {"metadata not strings", R"({"__metadata__":{"epoch":3}})", "", {"metadata 'epoch'", "not a string"}},
      {"bool out of range",
       R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})",
       std::string("\x01\x02"),
       {"BOOL tensor 'm'", "byte 2"}},
  };
  for (const BadHeader& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string p = path("bad.safetensors");
    write_file(p, raw_file(c.header, c.data));
    std::vector<std::string> parts = c.message;
    parts.push_back(p);
    expect_error<Error>([&] { io::load_safetensors(p); }, parts);
  }
}

// --- hostile headers: depth, length, trailing bytes and duplicates
// ---------------------------------------------------------------------

// n opening brackets, then n closing ones.
std::string nested_array(int n) { return std::string(size_t(n), '[') + std::string(size_t(n), ']'); }

// Expects loading `header` to fail with a message holding `parts` (and the path) and no longer than a few
// hundred characters, whatever the size of the header.
void expect_short_error(const std::string& p, const std::string& header, std::vector<std::string> parts) {
  write_file(p, raw_file(header, ""));
  parts.push_back(p);
  std::string message;
  try {
    io::load_safetensors(p);
  } catch (const Error& e) {
    message = e.what();
  }
  ASSERT_FALSE(message.empty()) << "no error for a header of " << header.size() << " bytes";
  for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message.substr(0, 1000);
  EXPECT_LT(message.size(), 600u) << message.substr(0, 1000);
}

TEST_F(SafetensorsTest, RefusesDeeplyNestedHeadersWithoutOverflowingTheStack) {
  // 100,000 levels overflow the stack of anything that recurses per level (parsing, dumping, destroying).
  const std::string deep = nested_array(100'000), p = path("deep.safetensors");
  expect_short_error(p, R"({"a":{"dtype":"U8","shape":)" + deep + R"(,"data_offsets":[0,0]}})",
                     {"nested deeper than 3 levels"});
  expect_short_error(p, R"({"a":{"dtype":"U8","shape":[0],"data_offsets":)" + deep + "}}",
                     {"nested deeper than 3 levels"});
  expect_short_error(p, R"({"__metadata__":{"k":)" + deep + "}}", {"nested deeper than 3 levels"});
  std::string objects;
  for (int i = 0; i < 100'000; ++i) objects += "{\"k\":";
  expect_short_error(p, objects + "1" + std::string(100'000, '}'), {"nested deeper than 3 levels"});
  expect_short_error(p, "{\"a\":" + deep + "}", {"nested deeper than 3 levels"});
  expect_short_error(p, deep, {"not an object", "[[[[..."});
  // The deepest a valid header goes is 3: {"name": {"shape": [...]}}.
  write_file(p, raw_file(R"({"a":{"dtype":"U8","shape":[[1]],"data_offsets":[0,1]}})", "x"));
  expect_error<Error>([&] { io::load_safetensors(p); }, {"nested deeper than 3 levels", p});
}

TEST_F(SafetensorsTest, QuotesOnlyABoundedPrefixOfAnyValueInItsMessages) {
  const std::string p = path("long.safetensors"), long_text(1'000'000, 'x');
  expect_short_error(p, R"({"a":{"dtype":"U8","shape":[")" + long_text + R"("],"data_offsets":[0,0]}})",
                     {"'a'", "shape", "xxxx..."});
  std::string many = "[0";
  for (int i = 0; i < 200'000; ++i) many += ",1";
  expect_short_error(p, R"({"a":{"dtype":"U8","shape":[0],"data_offsets":)" + many + "]}}",
                     {"'a'", "data_offsets [0,1,1,", "..."});
  expect_short_error(p, R"({")" + long_text + R"(":{"dtype":"U8","shape":[0]}})",
                     {"xxxx...", "data_offsets"});
  expect_short_error(p, R"({"a":{"dtype":")" + long_text + R"(","shape":[0],"data_offsets":[0,0]}})",
                     {"'a'", "xxxx...", "not supported"});
  expect_short_error(p, R"({"__metadata__":{")" + long_text + R"(":1}})",
                     {"metadata 'xxxx", "xxxx...'", "not a string"});
  expect_short_error(p, R"({"a":")" + long_text, {"not valid JSON"});  // an unterminated string
}

TEST_F(SafetensorsTest, RefusesAnythingButSpacesAfterTheHeadersObject) {
  const std::string p = path("trailing.safetensors");
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {std::string("{}\0garbage", 10), {"NUL byte at offset 2"}},
      {std::string("{}\0\0\0\0\0\0", 8), {"NUL byte at offset 2"}},
      {std::string("{\"__metadata__\":{\"k\":\"v\"}}\0{\"a\":1}", 34), {"NUL byte at offset 26"}},
      {"{}x", {"not valid JSON"}},
      {"{}{}", {"not valid JSON"}},
      {"{}\n\t", {"only spaces (0x20) may follow"}},
      {" {}", {"must start with '{'"}},
  };
  for (const auto& [header, parts] : cases) {
    SCOPED_TRACE(::testing::PrintToString(header));
    uint64_t n = header.size();
    write_file(p, std::string(reinterpret_cast<const char*>(&n), 8) + header);
    std::vector<std::string> want = parts;
    want.push_back(p);
    expect_error<Error>([&] { io::load_safetensors(p); }, want);
  }
  // Spaces are the format's padding.
  const std::string padded = "{\"__metadata__\":{\"k\":\"v\"}}      ";
  const uint64_t n = padded.size();
  write_file(p, std::string(reinterpret_cast<const char*>(&n), 8) + padded);
  EXPECT_EQ(io::load_safetensors(p).metadata.at("k"), "v");
}

TEST_F(SafetensorsTest, RefusesDuplicateKeys) {
  const std::string p = path("dup.safetensors");
  const std::string a = R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  const std::vector<std::tuple<std::string, std::string, std::vector<std::string>>> cases = {
      // The first "a" would be dropped unchecked: its offsets need not even lie in the file.
      {R"({"a":{"dtype":"U8","shape":[9],"data_offsets":[0,9]},"a":)" + a + "}", "x", {"'a' twice"}},
      {R"({"a":{"dtype":"F64","dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
       "x",
       {"'dtype' twice", "'a'"}},
      {R"({"__metadata__":{"k":"1","k":"2"}})", "", {"'k' twice", "__metadata__"}},
      {R"({"__metadata__":{"k":"1"},"__metadata__":{"k":"2"}})", "", {"'__metadata__' twice"}},
  };
  for (const auto& [header, data, parts] : cases) {
    SCOPED_TRACE(header);
    write_file(p, raw_file(header, data));
    std::vector<std::string> want = parts;
    want.push_back(p);
    expect_error<Error>([&] { io::load_safetensors(p); }, want);
  }
}

TEST_F(SafetensorsTest, RefusesShapesWhoseSizeOverflowsEvenWithAZero) {
  // 0 elements, but the strides of [0, 2^62, 2^62] (or the running product of [2^62, 2^62, 0]) overflow.
  const std::string p = path("zero.safetensors");
  for (const char* shape :
       {"[0,4611686018427387904,4611686018427387904]", "[4611686018427387904,4611686018427387904,0]"}) {
    SCOPED_TRACE(shape);
    write_file(
        p,
        raw_file(std::string(R"({"a":{"dtype":"F32","shape":)") + shape + R"(,"data_offsets":[0,0]}})", ""));
    expect_error<Error>([&] { io::load_safetensors(p); }, {"'a'", "overflow", p});
  }
  // A zero beside sizes whose product (in bytes, 2^62 here) fits is an ordinary empty tensor.
  write_file(p,
             raw_file(R"({"a":{"dtype":"F32","shape":[0,1152921504606846976],"data_offsets":[0,0]}})", ""));
  EXPECT_EQ(io::load_safetensors(p).tensors.at("a").numel(), 0);
}

TEST_F(SafetensorsTest, RefusesToSaveAHeaderNoReaderWouldLoad) {
  // The format (and load_safetensors) caps the header at 100,000,000 bytes; a save past it would write a file
  // that nothing loads.
  const std::string p = path("big_header.safetensors");
  expect_error<Error>(
      [&] {
        io::save_safetensors(p, {{"a", ones({1})}}, {{"blob", std::string(100'000'000, 'x')}});
      },
      {p, "100000000", "in tensors, not in metadata"});
  EXPECT_FALSE(fs::exists(p));
}

TEST_F(SafetensorsTest, RefusesAFifoWithoutBlocking) {
  // Opening a FIFO for reading blocks until a writer comes; the reader must look before it opens.
  const std::string p = path("fifo.safetensors");
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  alarm(120);  // a watchdog: a reader that blocks kills the test instead of hanging the suite
  expect_error<Error>([&] { io::load_safetensors(p); }, {p, "is not a file", "FIFO"});
  expect_error<Error>([&] { io::read_bytes(p); }, {p, "is not a file", "FIFO"});
  alarm(0);
}

TEST_F(SafetensorsTest, RejectsBadNamesOnSave) {
  expect_error<Error>(
      [&] {
        io::save_safetensors(path("x.safetensors"), {{"__metadata__", ones({1})}});
      },
      {"reserved"});
  expect_error<Error>(
      [&] {
        io::save_safetensors(path("x.safetensors"), {{"w", Tensor()}});
      },
      {"'w'", "undefined"});
  expect_error<Error>(
      [&] {
        io::save_safetensors(path("x.safetensors"), {{"bad\xff", ones({1})}});
      },
      {"UTF-8"});
  EXPECT_FALSE(fs::exists(path("x.safetensors")));
  EXPECT_FALSE(fs::exists(path("x.safetensors.tmp")));
}

// --- atomic replacement
// --------------------------------------------------------------------------------------

TEST_F(SafetensorsTest, ASuccessfulSaveReplacesTheFile) {
  const std::string p = path("w.safetensors");
  io::save_safetensors(p, {{"a", ones({4})}});
  io::save_safetensors(p, {{"b", zeros({2}, DType::I64)}});
  const auto f = io::load_safetensors(p);
  EXPECT_EQ(f.tensors.count("a"), 0u);
  expect_same(f.tensors.at("b"), zeros({2}, DType::I64), "b");
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST_F(SafetensorsTest, ATensorFailingMidwayLeavesTheOldFileIntact) {
  const std::string p = path("w.safetensors");
  io::save_safetensors(p, {{"old", testing::uniform({16}, -1, 1)}});
  const std::string before = io::read_bytes(p);

  // "a" is written first; "b" (non-contiguous, 1 MiB) needs a contiguous copy that the memory limit refuses,
  // after the header and "a" are already in the temporary file.
  const StateDict next{{"a", ones({1024})}, {"b", testing::uniform({512, 512}, -1, 1).t()}};
  memory::empty_cache(kCPU);
  memory::set_memory_limit(kCPU, memory::stats(kCPU).reserved.current + (256 << 10));
  try {
    io::save_safetensors(p, next);
    ADD_FAILURE() << "the save should have run out of memory";
  } catch (const OutOfMemoryError&) {
  }
  memory::set_memory_limit(kCPU, 0);
  EXPECT_EQ(io::read_bytes(p), before);
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST_F(SafetensorsTest, AWriteFailingMidwayLeavesTheOldFileIntact) {
  const std::string p = path("w.safetensors");
  io::save_safetensors(p, {{"old", testing::uniform({16}, -1, 1)}});
  const std::string before = io::read_bytes(p);

  // A file size limit makes write() fail with EFBIG after 64 KiB of the 1 MiB tensor (SIGXFSZ ignored).
  rlimit saved_limit{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved_limit), 0);
  const auto saved_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved_limit;
  small.rlim_cur = 64 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    io::save_safetensors(p, {{"big", testing::uniform({512, 512}, -1, 1)}});
  } catch (const Error& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &saved_limit);
  std::signal(SIGXFSZ, saved_handler);

  EXPECT_NE(message.find("w.safetensors.tmp"), std::string::npos) << message;
  EXPECT_NE(message.find("is unchanged"), std::string::npos) << message;
  EXPECT_EQ(io::read_bytes(p), before);
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST_F(SafetensorsTest, SavingIntoAMissingDirectoryFailsClearly) {
  const std::string p = path("no/such/dir/w.safetensors");
  expect_error<Error>([&] { io::save_safetensors(p, {{"a", ones({1})}}); }, {"cannot create", p + ".tmp"});
}

TEST_F(SafetensorsTest, AtomicWriteAndReadBytes) {
  const std::string p = path("t.txt");
  io::atomic_write(p, "first");
  io::atomic_write(p, std::string("sec\0ond", 7));
  EXPECT_EQ(io::read_bytes(p), std::string("sec\0ond", 7));
  {
    io::AtomicFile f(p);
    f.write("never", 5);
  }  // destroyed without commit
  EXPECT_EQ(io::read_bytes(p), std::string("sec\0ond", 7));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  expect_error<Error>([&] { io::read_bytes(path("missing")); }, {"cannot open", "missing"});
}

}  // namespace
}  // namespace frugal

// memory::parse_bytes: byte counts as people write them ("64M", "1.5G"), read exactly. Written by hand
// because std::stod would let "1e-300", "inf" and "0x10" through and a double cannot hold every int64, and
// no Debian library parses this small grammar.
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/memory.h"

namespace frugal::memory {
namespace {

[[noreturn]] void refuse(std::string_view text, const char* why) {
  constexpr size_t kQuoted = 64;  // the text may be anything: quote a bounded prefix
  const std::string shown =
      text.size() > kQuoted ? std::string(text.substr(0, kQuoted)) + "..." : std::string(text);
  throw Error(frugal::detail::str_cat(
      "cannot read '", shown, "' as a byte count: ", why,
      "; write a positive whole or decimal number with an optional unit B, K, M, G or T "
      "(powers of 1024; KiB, MiB, GiB, TiB too), e.g. 512M or 1.5G"));
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The unit's multiplier, or 0 when `unit` is not one.
int64_t unit_scale(std::string_view unit) {
  if (unit.empty() || unit == "B") return 1;
  const char c = unit[0];
  const std::string_view rest = unit.substr(1);
  if (!(rest.empty() || rest == "iB")) return 0;
  switch (c) {
    case 'K':
    case 'k':
      return int64_t(1) << 10;
    case 'M':
    case 'm':
      return int64_t(1) << 20;
    case 'G':
    case 'g':
      return int64_t(1) << 30;
    case 'T':
    case 't':
      return int64_t(1) << 40;
    default:
      return 0;
  }
}

}  // namespace

int64_t parse_bytes(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && is_digit(text[i])) ++i;
  const std::string_view whole = text.substr(0, i);
  std::string_view fraction;
  if (i < text.size() && text[i] == '.') {
    const size_t start = ++i;
    while (i < text.size() && is_digit(text[i])) ++i;
    fraction = text.substr(start, i - start);
  }
  if (whole.empty() && fraction.empty()) refuse(text, "it does not start with a number");
  const std::string_view unit = text.substr(i);
  const int64_t scale = unit_scale(unit);
  if (scale == 0) refuse(text, "the unit is not one of B, K, M, G, T (KiB, MiB, GiB, TiB)");

  // bytes = whole * scale + fraction * scale / 10^digits, in exact integer arithmetic.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t bytes = 0;
  for (char c : whole)
    if (__builtin_mul_overflow(bytes, 10, &bytes) || __builtin_add_overflow(bytes, c - '0', &bytes))
      refuse(text, "it is beyond 2^63 - 1 bytes");
  if (__builtin_mul_overflow(bytes, scale, &bytes)) refuse(text, "it is beyond 2^63 - 1 bytes");
  // scale <= 2^40 and each step keeps the numerator below 10 * 2^40, so digits past the 18th cannot change
  // the result by a byte (they add less than scale / 10^18 < 1); they are read for their form only.
  int64_t numerator = 0, denominator = 1;
  for (size_t d = 0; d < fraction.size() && d < 18; ++d) {
    numerator = numerator * 10 + (fraction[d] - '0');
    denominator *= 10;
  }
  const __int128 part = static_cast<__int128>(numerator) * scale / denominator;
  if (part > kMax - bytes) refuse(text, "it is beyond 2^63 - 1 bytes");
  bytes += int64_t(part);
  if (bytes < 1) refuse(text, "it is less than one byte");
  return bytes;
}

}  // namespace frugal::memory

#include "base/parse_number.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <utility>

namespace nl {
namespace {

std::string Quote(std::string_view what, std::string_view text) {
  return std::string(what) + ": '" + std::string(text) + "'";
}

template <typename T>
Status OutOfRange(std::string_view what, std::string_view text, T min, T max) {
  return Status::OutOfRange(Quote(what, text) + " is out of range (" + std::to_string(min) + ".." +
                            std::to_string(max) + ")");
}

Status NotWhole(std::string_view what, std::string_view text) {
  return Status::InvalidArgument(Quote(what, text) + " is not a whole number");
}

template <typename T>
Result<T> ParseWhole(std::string_view text, std::string_view what, T min, T max) {
  T v{};
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v, 10);
  if (ec == std::errc::result_out_of_range) return OutOfRange(what, text, min, max);
  if (ec != std::errc() || p != end || text.empty()) return NotWhole(what, text);
  if (v < min || v > max) return OutOfRange(what, text, min, max);
  return v;
}

template <typename T, typename Parse>
auto ParseList(std::string_view text, std::string_view what, char sep, Parse parse)
    -> Result<std::vector<T>> {
  std::vector<T> out;
  for (std::string_view item : SplitText(text, sep)) {
    Result<T> v = parse(item);
    if (!v.ok()) {
      return Status(v.status().code(), v.status().message() + " in " + std::string(what) + " '" +
                                           std::string(text) + "'");
    }
    out.push_back(*v);
  }
  return out;
}

}  // namespace

std::vector<std::string_view> SplitText(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t at = text.find(sep, start);
    if (at == std::string_view::npos) {
      out.push_back(text.substr(start));
      return out;
    }
    out.push_back(text.substr(start, at - start));
    start = at + 1;
  }
}

Result<int64_t> ParseInt(std::string_view text, std::string_view what, int64_t min, int64_t max) {
  return ParseWhole<int64_t>(text, what, min, max);
}

Result<uint64_t> ParseUint(std::string_view text, std::string_view what, uint64_t min,
                           uint64_t max) {
  if (!text.empty() && text[0] == '-') return OutOfRange(what, text, min, max);
  return ParseWhole<uint64_t>(text, what, min, max);
}

Result<uint64_t> ParseByteSize(std::string_view text, std::string_view what, uint64_t max) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  const std::string_view unit = text.substr(digits);
  int shift = -1;
  static constexpr std::pair<std::string_view, int> kUnits[] = {
      {"", 0},     {"B", 0},  {"K", 10},   {"KiB", 10}, {"M", 20},
      {"MiB", 20}, {"G", 30}, {"GiB", 30}, {"T", 40},   {"TiB", 40}};
  for (const auto& [name, s] : kUnits)
    if (unit == name) shift = s;
  if (digits == 0 || shift < 0) {
    return Status::InvalidArgument(Quote(what, text) +
                                   " is not a size (a whole number of bytes, or with K, M, G, T)");
  }
  // (Digits alone fail to parse only by overflowing: more than any bound.)
  const Result<uint64_t> n = ParseUint(text.substr(0, digits), what, 0, UINT64_MAX);
  if (!n.ok() || *n > (max >> shift)) {
    return Status::OutOfRange(Quote(what, text) + " is more than " + std::to_string(max) +
                              " bytes");
  }
  return *n << shift;
}

Result<double> ParseDouble(std::string_view text, std::string_view what, double min, double max) {
  double v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  char range[64];
  std::snprintf(range, sizeof range, " is out of range (%g..%g)", min, max);
  if (ec == std::errc::result_out_of_range && p == end) {  // beyond double's range (1e400, 1e-400)
    return Status::OutOfRange(Quote(what, text) + range);
  }
  if (ec != std::errc() || p != end || text.empty() || !std::isfinite(v)) {
    return Status::InvalidArgument(Quote(what, text) + " is not a finite number");
  }
  if (v < min || v > max) return Status::OutOfRange(Quote(what, text) + range);
  return v;
}

Result<std::vector<int64_t>> ParseIntList(std::string_view text, std::string_view what, int64_t min,
                                          int64_t max, char sep) {
  return ParseList<int64_t>(
      text, what, sep, [&](std::string_view item) { return ParseInt(item, "item", min, max); });
}

Result<std::vector<double>> ParseDoubleList(std::string_view text, std::string_view what,
                                            double min, double max, char sep) {
  return ParseList<double>(
      text, what, sep, [&](std::string_view item) { return ParseDouble(item, "item", min, max); });
}

}  // namespace nl

#include "loader/cpu_list.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <iterator>

namespace nl {
namespace {

bool ParseInt(const std::string& s, int* out) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  *out = std::atoi(s.c_str());
  return true;
}

}  // namespace

Result<CpuList> ParseCpuList(const std::string& text) {
  CpuList out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string tok = text.substr(start, comma - start);
    start = comma + 1;
    if (tok.empty()) {
      if (comma == text.size() && !out.empty()) break;
      return Status::InvalidArgument("empty item in cpu list '" + text + "'");
    }
    int lo = 0, hi = 0;
    const size_t dash = tok.find('-');
    const bool ok = dash == std::string::npos
                        ? ParseInt(tok, &lo) && (hi = lo, true)
                        : ParseInt(tok.substr(0, dash), &lo) && ParseInt(tok.substr(dash + 1), &hi);
    if (!ok || hi < lo) {
      return Status::InvalidArgument("bad item '" + tok + "' in cpu list '" + text + "'");
    }
    for (int c = lo; c <= hi; ++c) out.push_back(c);
    if (comma == text.size()) break;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string FormatCpuList(const CpuList& cpus) {
  std::string s;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(cpus[i]);
    if (j > i) s += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return s;
}

CpuList Intersect(const CpuList& a, const CpuList& b) {
  CpuList out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

CpuList Union(const CpuList& a, const CpuList& b) {
  CpuList out;
  std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

bool IsSubset(const CpuList& sub, const CpuList& of) {
  return std::includes(of.begin(), of.end(), sub.begin(), sub.end());
}

bool Disjoint(const CpuList& a, const CpuList& b) { return Intersect(a, b).empty(); }

}  // namespace nl

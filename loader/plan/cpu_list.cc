#include "loader/plan/cpu_list.h"

#include <algorithm>
#include <iterator>

#include "base/parse_number.h"

namespace nl {
Result<CpuList> ParseCpuList(const std::string& text) {
  // A set of kMaxCpuIndex + 1 bits, so repeating a range costs nothing more.
  std::vector<bool> in(static_cast<size_t>(kMaxCpuIndex) + 1, false);
  const std::vector<std::string_view> items = SplitText(text, ',');
  for (size_t k = 0; k < items.size(); ++k) {
    const std::string_view tok = items[k];
    if (tok.empty() && k + 1 == items.size() && k > 0) break;  // a trailing comma
    const size_t dash = tok.find('-');
    Result<int64_t> lo = ParseInt(tok.substr(0, dash), "cpu", 0, kMaxCpuIndex);
    Result<int64_t> hi = dash == std::string_view::npos
                             ? lo
                             : ParseInt(tok.substr(dash + 1), "cpu", 0, kMaxCpuIndex);
    if (!lo.ok() || !hi.ok() || *hi < *lo) {
      std::string why;
      if (!lo.ok() || !hi.ok()) {
        const Status& st = lo.ok() ? hi.status() : lo.status();
        if (st.code() == StatusCode::kOutOfRange) {
          why = " (cpu indices are 0.." + std::to_string(kMaxCpuIndex) + ")";
        }
      }
      return Status::InvalidArgument(tok.empty() ? "empty item in cpu list '" + text + "'"
                                                 : "bad item '" + std::string(tok) +
                                                       "' in cpu list '" + text + "'" + why);
    }
    for (int64_t c = *lo; c <= *hi; ++c) in[static_cast<size_t>(c)] = true;
  }
  CpuList out;
  for (size_t c = 0; c < in.size(); ++c)
    if (in[c]) out.push_back(static_cast<int>(c));
  return out;
}

std::string FormatCpuList(const CpuList& cpus) {
  std::string s;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(cpus[i]);
    if (j > i) {
      s += '-';  // (not "-" + std::string: GCC 12 -O3 warns -Wrestrict on that, falsely)
      s += std::to_string(cpus[j]);
    }
    i = j + 1;
  }
  return s;
}

std::string FormatRankList(const std::vector<int>& ranks) {
  constexpr size_t kMaxItems = 16;  // then "... (N ranks)": a message stays one short line
  std::string s;
  size_t items = 0;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (j < i + 2) j = i;  // runs of one or two: each written out ("2,3")
    if (items++ == kMaxItems) {
      s += ",... (" + std::to_string(ranks.size()) + " ranks)";
      break;
    }
    if (!s.empty()) s += ',';
    s += std::to_string(ranks[i]);
    if (j > i) {
      s += '-';
      s += std::to_string(ranks[j]);
    }
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

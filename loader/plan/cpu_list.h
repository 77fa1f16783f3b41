// CPU lists: sorted sets of OS indices of hardware threads (PUs), written the
// way Linux and numactl write them ("0-9,44-53").
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace nl {

using CpuList = std::vector<int>;  // sorted, unique OS indices

// The largest cpu index a list may name (hwloc and Linux allow more than
// CPU_SETSIZE; no machine has this many).
inline constexpr int kMaxCpuIndex = 65535;

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}. Errors name the bad token; indices
// above kMaxCpuIndex are refused (so "0-999999999" allocates nothing).
Result<CpuList> ParseCpuList(const std::string& text);
// {0,1,2,3,8,10,11} -> "0-3,8,10-11"; empty -> "".
std::string FormatCpuList(const CpuList& cpus);
// Ascending rank numbers for messages: runs of three or more as ranges,
// {0,1,...,1023} -> "0-1023", {2,3} -> "2,3", {0,1,2,5} -> "0-2,5"; after
// 16 items the rest is cut: {0,2,...,1022} -> "0,2,...,30,... (512 ranks)".
std::string FormatRankList(const std::vector<int>& ranks);

CpuList Intersect(const CpuList& a, const CpuList& b);
CpuList Union(const CpuList& a, const CpuList& b);
bool IsSubset(const CpuList& sub, const CpuList& of);
bool Disjoint(const CpuList& a, const CpuList& b);

}  // namespace nl

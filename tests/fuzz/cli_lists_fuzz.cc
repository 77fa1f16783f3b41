// libFuzzer target: the command-line list and number parsers (cpu lists,
// per-rank cpu affinities, integer and decimal lists). A cpu list that
// parses must print and parse back to itself.
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/parse_number.h"
#include "loader/plan/binding.h"
#include "loader/plan/cpu_list.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  nl::Result<nl::CpuList> cpus = nl::ParseCpuList(text);
  if (cpus.ok()) {
    nl::Result<nl::CpuList> again = nl::ParseCpuList(nl::FormatCpuList(*cpus));
    if (!cpus->empty() && (!again.ok() || *again != *cpus)) __builtin_trap();
  }
  (void)nl::ParseCpuAffinity(text);
  (void)nl::ParseIntList(text, "--fuzz", -1000000, 1000000);
  (void)nl::ParseDoubleList(text, "--fuzz", -1e9, 1e9);
  (void)nl::ParseUint(text, "--fuzz", 0, UINT64_MAX);
  (void)nl::ParseDouble(text, "--fuzz", 0, 1e300);
  return 0;
}

// Numbers from text (command-line values, environment variables), checked:
// the whole text must be the number, and it must lie in [min, max]. Errors
// name `what` and quote the text: InvalidArgument when the text is not a
// number, OutOfRange when it is one outside [min, max], e.g.
//   --threads: '100000' is out of range (1..1024)
//   CUDA_VISIBLE_DEVICES: '9x' is not a whole number
//
//   NL_ASSIGN_OR_RETURN(int64_t n, ParseInt("12", "--ranks", 1, 64));
//   NL_ASSIGN_OR_RETURN(auto l, ParseIntList("0,2", "--gpus", 0, kMaxGpus - 1));
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace nl {

// Decimal, optional leading '-', no spaces, no '+', no other characters.
Result<int64_t> ParseInt(std::string_view text, std::string_view what, int64_t min, int64_t max);
// Like ParseInt, for the full unsigned 64-bit range (no sign accepted).
Result<uint64_t> ParseUint(std::string_view text, std::string_view what, uint64_t min,
                           uint64_t max);
// A size in bytes: a whole number, optionally with a binary unit (K, M, G,
// T, or KiB, MiB, GiB, TiB: 1024-based), "512M", "2GiB", "0"; at most max
// bytes.
Result<uint64_t> ParseByteSize(std::string_view text, std::string_view what, uint64_t max);
// A finite decimal floating-point number in [min, max].
Result<double> ParseDouble(std::string_view text, std::string_view what, double min, double max);

// "0,2,3" -> {0,2,3}: items separated by `sep`, each checked as ParseInt
// (errors name the item and quote the whole list). Empty text, or an empty
// item, is an error.
Result<std::vector<int64_t>> ParseIntList(std::string_view text, std::string_view what, int64_t min,
                                          int64_t max, char sep = ',');
Result<std::vector<double>> ParseDoubleList(std::string_view text, std::string_view what,
                                            double min, double max, char sep = ',');

// Splits on `sep`, keeping empty items ("a,,b" -> {"a", "", "b"}; "" -> {""}).
std::vector<std::string_view> SplitText(std::string_view text, char sep);

}  // namespace nl

#include "trainer/outputs.h"

#include "base/file_util.h"
#include "trainer/rank_error.h"
#include "trainer/signals.h"

namespace nl::trainer {

std::string NameInMessage(const std::string& message, const std::string& what) {
  if (what.empty() || message.rfind("cannot ", 0) != 0) return message;
  const size_t verb_end = message.find(' ', 7);
  if (verb_end == std::string::npos) return message;
  return message.substr(0, verb_end + 1) + what + " " + message.substr(verb_end + 1);
}

void WriteAtomically(const std::string& path, const std::string& bytes, const std::string& what) {
  UnlinkOnSignal guard(TemporaryPath(path));
  const Status s = WriteFileAtomically(path, bytes);
  if (!s.ok()) throw RankError(NameInMessage(s.message(), what));
}

bool IsRankOutput(const std::string& base) {
  const std::string chart = "timing-epoch-", svg = ".svg";
  return base == "checkpoint.pt" ||
         (base.rfind(chart, 0) == 0 && base.size() >= chart.size() + svg.size() &&
          base.compare(base.size() - svg.size(), svg.size(), svg) == 0);
}

std::vector<std::string> RemoveStaleOutputTemporaries(const std::string& dir) {
  if (dir.empty()) return {};
  return RemoveStaleTemporaries(dir, [](const std::string&, const std::string& base) { return IsRankOutput(base); });
}

}  // namespace nl::trainer

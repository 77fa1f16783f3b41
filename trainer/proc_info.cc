#include "trainer/proc_info.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include "base/fd.h"

namespace nl::trainer {

bool StderrIsTerminal() {
  const char* v = std::getenv("NL_TRAINER_TTY");
  return v ? std::string(v) == "1" : isatty(2) != 0;
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? DirOf(std::string(buf, static_cast<size_t>(n))) : ".";
}

int LastProcessor(const std::string& s, std::string* comm) {
  const size_t open = s.find('('), close = s.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open || close + 2 > s.size()) {
    return -1;
  }
  *comm = s.substr(open + 1, close - open - 1);
  // Fields after the command: state is field 3; "processor" is field 39.
  std::istringstream rest(s.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 39 && (rest >> field); ++i) {
    if (i != 39) continue;
    int cpu = -1;
    const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), cpu);
    return ec == std::errc() && end == field.data() + field.size() ? cpu : -1;
  }
  return -1;
}

uint64_t LoaderNodes(pid_t pid, const Topology& topo) {
  const std::string dir = "/proc/" + (pid > 0 ? std::to_string(pid) : std::string("self")) + "/task";
  DirHandle d(opendir(dir.c_str()));
  if (!d) return 0;
  uint64_t bits = 0;
  while (dirent* e = readdir(d.get())) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(dir + "/" + e->d_name + "/stat");
    const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::string comm;
    const int cpu = LastProcessor(s, &comm);
    if (cpu < 0 || comm.rfind("ldr-", 0) != 0) continue;
    for (const NumaNode& n : topo.numa_nodes()) {
      if (n.os_index >= 0 && n.os_index < 64 && std::find(n.pus.begin(), n.pus.end(), cpu) != n.pus.end()) {
        bits |= uint64_t{1} << n.os_index;
      }
    }
  }
  return bits;
}

}  // namespace nl::trainer

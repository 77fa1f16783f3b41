// What the rank reads about processes: its own executable's directory,
// whether its stderr is a terminal, and where its loader threads ran.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "loader/plan/topology.h"

namespace nl::trainer {

// Our launcher relays a rank's stderr through a pipe and says (NL_TRAINER_TTY)
// whether its own is a terminal.
bool StderrIsTerminal();
// "a/b/c" -> "a/b"; "c" -> "."; "/c" -> "/".
std::string DirOf(const std::string& path);
// The directory of /proc/self/exe ("." when unreadable).
std::string SelfDir();
// The "processor" field (39) of a /proc/<pid>/task/<tid>/stat line, and the
// thread's name in *comm; -1 when the line does not parse.
int LastProcessor(const std::string& stat, std::string* comm);
// The NUMA nodes (a bit per os index < 64) on which process pid's loader
// threads (named ldr-*) last ran; pid 0: this process.
uint64_t LoaderNodes(pid_t pid, const Topology& topo);

}  // namespace nl::trainer

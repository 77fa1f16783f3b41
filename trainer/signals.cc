#include "trainer/signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

namespace nl::trainer {
namespace {

char g_temp_path[4096];
std::atomic<bool> g_temp_active{false};

extern "C" void OnTerminatingSignal(int sig) {
  if (g_temp_active.load()) unlink(g_temp_path);
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

void InstallSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnTerminatingSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    struct sigaction old {};
    sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN) continue;  // nohup: an ignored signal stays ignored
    sigaction(sig, &sa, nullptr);
  }
}

UnlinkOnSignal::UnlinkOnSignal(const std::string& temporary) {
  std::snprintf(g_temp_path, sizeof g_temp_path, "%s", temporary.c_str());
  g_temp_active.store(true);
}

UnlinkOnSignal::~UnlinkOnSignal() { g_temp_active.store(false); }

}  // namespace nl::trainer
